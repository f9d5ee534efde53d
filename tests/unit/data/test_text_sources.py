"""Finding inputs and sampling text for a BPE: the parts of trainer_core.data.text_sources that
tell the user what was found, and what --train-bpe learns from."""

from __future__ import annotations

import pytest

from trainer_core.data.shards import DataError
from trainer_core.data.text_sources import ReadOptions, discover_inputs, sample_texts

ENGLISH = "the quick brown fox jumps over the lazy dog "
GREEK = "η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο "


def test_a_bpe_sample_takes_a_capped_share_of_every_file(tmp_path):
    """Each file held one document larger than its share, and the sample was the first files'
    whole documents: the Greek files after the English ones gave it nothing."""
    docs = [
        f"{group}{i} " + text * 400
        for group, text in (("a", ENGLISH), ("b", GREEK))
        for i in range(4)
    ]
    for doc in docs:
        (tmp_path / f"{doc[0]}_{doc[1]}.txt").write_text(doc)
    budget = 16_000
    sample = sample_texts(discover_inputs([str(tmp_path)]), ReadOptions(), budget)
    assert len(sample) == len(docs)
    for piece, doc in zip(sample, docs, strict=True):
        assert doc.startswith(piece) and doc[len(piece)] == " ", "cut where a space starts"
    assert budget - 1000 < sum(len(piece.encode()) for piece in sample) <= budget


def test_an_empty_input_dir_is_named_as_such(tmp_path):
    """An empty dir was reported as a pattern that matched nothing, with advice on quoting globs."""
    empty = tmp_path / "emptyc"
    empty.mkdir()
    (empty / ".hidden").write_text("skipped")
    with pytest.raises(DataError) as refused:
        discover_inputs([str(empty)])
    assert str(refused.value) == (
        f"--input '{empty}' is an empty directory (no visible files; names starting with '.' are "
        "skipped); put the text files in it or pass the dir that holds them"
    )

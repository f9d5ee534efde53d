"""Tokenization: input kinds, tokenizers, the shard format and manifest, bad input."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from tokenizers import pre_tokenizers

from trainer_core.config.sections import DataConfig
from trainer_core.data.shards import (
    DataError,
    DatasetWriter,
    ShardWriter,
    TokenizerInfo,
    read_manifest,
    split_key,
    verify_shards,
)
from trainer_core.data.text_sources import (
    ReadOptions,
    ReadStats,
    _is_read_failure,
    discover_inputs,
    read_documents,
    tokenize_file,
    write_shards,
)
from trainer_core.data.token_data import open_token_data
from trainer_core.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    _pieces,
    load_tokenizer,
    train_bpe,
)

BYTE = ByteTokenizer()


def documents(pattern: str, opts: ReadOptions | None = None) -> list[str]:
    """The documents the files ``pattern`` names hold, read as tokenizing reads them."""
    return [
        t
        for f in discover_inputs([pattern])
        for t in read_documents(f, opts or ReadOptions(), ReadStats())
    ]


def shard_documents(directory, split: str | None = None) -> list[str]:
    """Every document in a shard dir (train then validation, or only ``split``), decoded from
    the parquet files."""
    manifest = read_manifest(directory)
    docs = []
    for f in getattr(manifest, split) if split else manifest.train + manifest.validation:
        table = pq.read_table(directory / f.name)
        assert table.column_names == ["tokens"]
        stream = table.column("tokens").combine_chunks().flatten().to_numpy()
        assert stream.dtype == np.uint16
        ends = np.flatnonzero(stream == BYTE.eos_id)
        starts = np.concatenate([[0], ends[:-1] + 1])
        docs += [
            bytes(stream[s:e].astype(np.uint8)).decode() for s, e in zip(starts, ends, strict=True)
        ]
    return docs


@pytest.fixture
def corpus(tmp_path):
    """One file of every input kind, some compressed, one in a subdirectory, one hidden."""
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("plain text document")
    (root / "b.md").write_text("# markdown ünïcode")
    (root / "c.jsonl").write_text(
        json.dumps({"text": "json one", "id": 1}) + "\n\n" + json.dumps({"text": "json two"}) + "\n"
    )
    (root / "sub" / "d.jsonl.gz").write_bytes(gzip.compress(b'{"text": "gzipped json"}\n'))
    (root / "sub" / "e.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"zstd text"))
    pq.write_table(pa.table({"text": ["parquet one", "parquet two"]}), root / "f.parquet")
    pq.write_table(
        pa.table({"text": pa.array([b"binary parquet"], pa.binary())}), root / "g.parquet"
    )
    (root / ".hidden.txt").write_text("never read")
    return root


EXPECTED = {
    "plain text document",
    "# markdown ünïcode",
    "json one",
    "json two",
    "gzipped json",
    "zstd text",
    "parquet one",
    "parquet two",
    "binary parquet",
}


def test_every_input_kind_is_read(corpus, tmp_path):
    files = discover_inputs([str(corpus)])
    kinds = {f.path.rsplit("/", 1)[-1]: (f.kind, f.compression) for f in files}
    assert kinds == {
        "a.txt": ("text", None),
        "b.md": ("text", None),
        "c.jsonl": ("jsonl", None),
        "d.jsonl.gz": ("jsonl", "gzip"),
        "e.txt.zst": ("text", "zstd"),
        "f.parquet": ("parquet", None),
        "g.parquet": ("parquet", None),
    }
    manifest, stats = write_shards(files, BYTE, tmp_path / "out", ReadOptions(), val_fraction=0.3)
    assert set(shard_documents(tmp_path / "out")) == EXPECTED
    assert (stats.files, stats.documents) == (7, 9)
    assert stats.text_bytes == sum(len(t.encode()) for t in EXPECTED)
    assert manifest.num_train_tokens + manifest.num_val_tokens == stats.text_bytes + 9


def test_globs_recursive_globs_and_urls(corpus):
    names = lambda pattern: [f.path.rsplit("/", 1)[-1] for f in discover_inputs([pattern])]  # noqa: E731
    assert names(str(corpus / "*.jsonl")) == ["c.jsonl"]
    assert names(str(corpus / "**" / "*.jsonl*")) == ["c.jsonl", "d.jsonl.gz"]
    assert len(discover_inputs([str(corpus / "a.txt"), str(corpus)])) == 7, (
        "a repeated file is read once"
    )
    memory = fsspec.filesystem("memory")
    memory.pipe("/remote/x.jsonl.gz", gzip.compress(b'{"text": "from a url"}\n'))
    remote = discover_inputs(["memory://remote/*.jsonl.gz"])
    assert [(f.path, f.compression) for f in remote] == [("memory:///remote/x.jsonl.gz", "gzip")]


def test_jsonl_field_and_parquet_column_options(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"body": "from body"}\n')
    pq.write_table(pa.table({"content": ["from column"]}), tmp_path / "y.parquet")
    files = discover_inputs([str(tmp_path / "x.jsonl"), str(tmp_path / "y.parquet")])
    write_shards(
        files, BYTE, tmp_path / "out", ReadOptions(text_field="body", parquet_column="content")
    )
    assert sorted(shard_documents(tmp_path / "out")) == ["from body", "from column"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".ndjson"])
def test_zstd_jsonl_reads_like_plain_jsonl_locally_and_from_a_url(tmp_path, suffix):
    """A zstandard reader can't be iterated by line: every .jsonl.zst was 'can't read it'."""
    raw = b'{"text": "json one"}\n\n{"text": "json two"}\n'
    packed = zstandard.ZstdCompressor().compress(raw)
    (tmp_path / f"plain{suffix}").write_bytes(raw)
    (tmp_path / f"packed{suffix}.zst").write_bytes(packed)
    fsspec.filesystem("memory").pipe(f"/zst/packed{suffix}.zst", packed)
    expected = documents(str(tmp_path / f"plain{suffix}"))
    assert expected == ["json one", "json two"]
    assert documents(str(tmp_path / f"packed{suffix}.zst")) == expected
    assert documents(f"memory://zst/packed{suffix}.zst") == expected


def test_a_reader_bug_is_not_a_file_to_skip():
    """A stream that can't do what a reader asks (as .jsonl.zst once) is a bug here: reported
    as a damaged file, --on-decode-error skip silently dropped every such file."""
    assert not _is_read_failure(io.UnsupportedOperation("not seekable"))
    assert _is_read_failure(EOFError("truncated")) and _is_read_failure(zstandard.ZstdError())


def test_a_utf8_bom_before_the_first_json_line_or_a_text_file_is_ignored(tmp_path):
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "one"}\n{"text": "two"}\n')
    assert documents(str(tmp_path / "b.jsonl")) == ["one", "two"]
    (tmp_path / "c.txt").write_bytes(b"\xef\xbb\xbfthree")  # was tokenized as U+FEFF "three"
    assert documents(str(tmp_path / "c.txt")) == ["three"]


def test_tokenize_file_batches_by_characters_as_well_as_documents(tmp_path, random_texts):
    """A batch of 256 documents could hold any amount of text, all encoded at once."""
    texts = random_texts(40, low=50, high=70)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (f,) = discover_inputs([str(tmp_path / "d.jsonl")])
    for tok in (BYTE, train_bpe(texts, 300)):
        one = list(tokenize_file(f, tok, ReadOptions(), ReadStats()))
        small = list(tokenize_file(f, tok, ReadOptions(), ReadStats(), batch_chars=100))
        assert [len(b.tokens) for b in one] == [40]
        assert [len(b.tokens) for b in small] == [2] * 20
        assert [t.tolist() for b in small for t in b.tokens] == [t.tolist() for t in one[0].tokens]


def test_bpe_training_save_and_reload(tmp_path, random_texts):
    texts = random_texts(50, letters="abc de") * 2
    tok = train_bpe(texts, 300)
    assert tok.kind == "hf" and 259 < tok.vocab_size <= 300
    assert tok.eos_id == tok.tok.token_to_id("<|endoftext|>")
    tok.save(tmp_path / "tok")
    for spec in (tmp_path / "tok", tmp_path / "tok" / "tokenizer.json"):
        again = load_tokenizer(str(spec))
        assert again.content_hash == tok.content_hash
        assert (again.eos_id, again.bos_id, again.vocab_size) == (
            tok.eos_id,
            tok.bos_id,
            tok.vocab_size,
        )
        assert again.encode_batch(texts[:3]) == tok.encode_batch(texts[:3])
    assert len(tok.encode_batch(["abc de abc"])[0]) < len("abc de abc"), "merges shorten text"
    assert train_bpe(texts, 300).content_hash == tok.content_hash, "training is deterministic"
    with pytest.raises(DataError, match="vocab size >= 259"):
        train_bpe(texts, 100)


def test_special_token_text_in_a_document_is_plain_text(tmp_path):
    """'<|endoftext|>' written in a document (code, a chat log) once became the EOS id, a
    document boundary in the middle of a document; in a task's text too."""
    text = "see <|endoftext|> and <|bos|> in code"
    trained = train_bpe([text, "plain words here"] * 10, 300)
    trained.save(tmp_path / "tok")
    for tok in (trained, load_tokenizer(tmp_path / "tok"), pickle.loads(pickle.dumps(trained))):
        specials = {tok.tok.token_to_id(name) for name in ("<|endoftext|>", "<|bos|>", "<|pad|>")}
        (ids,) = tok.encode_arrays([text])
        assert specials.isdisjoint(ids.tolist())
        assert tok.tok.decode(ids.tolist(), skip_special_tokens=False) == text
        (c,) = tok.encode_continuations("see ", [text[4:]])
        assert specials.isdisjoint([*c.context, *c.ids]) and c.nbytes == len(text) - 3


class LargestCall(HFTokenizer):
    """The real tokenizer, noting the most text it was given in one call."""

    largest = 0

    def _encode(self, texts: list[str]) -> list[np.ndarray]:
        self.largest = max(self.largest, sum(map(len, texts)))
        return super()._encode(texts)


def test_a_long_document_is_encoded_in_pieces_with_the_whole_texts_ids():
    """One 20 MB document took 3 GB to encode at once; in pieces cut where a whitespace run
    starts, a byte-level BPE gives the same ids (no pre-token runs from a non-space into a
    space), so the pieces are exact."""
    rng = np.random.default_rng(0)
    words = ["the", "naïve", "日本語", "x.", "don't", "(a)", "3.5", "!!", "<|endoftext|>"]
    spaces = ["", " ", "  ", "\n", "\n\n", "\t", "\r\n", " \n ", "\u00a0", "\x1c", "\u3000"]
    n = 150_000
    text = "".join(rng.choice(words, n) + rng.choice(spaces, n))
    pieces = list(_pieces(text, 997))
    assert "".join(pieces) == text and len(pieces) > 500
    cuts = zip(pieces, pieces[1:], strict=False)
    assert all(b[0] in " \n" and not a[-1].isspace() for a, b in cuts), "where a run starts"
    tok = LargestCall(train_bpe([text[:100_000]], 400).tok, "<|endoftext|>", "<|bos|>")
    (whole,) = tok.encode_arrays([text], chunk_chars=len(text))
    assert tok.largest == len(text)
    tok.largest = 0
    (chunked,) = tok.encode_arrays([text], chunk_chars=997)
    assert tok.largest < 2 * 997 and chunked.tolist() == whole.tolist()
    # A prefix space is added to each encoded text, so pieces would differ: encoded whole.
    raw = type(tok.tok).from_str(tok.tok.to_str())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    prefixed = LargestCall(raw, "<|endoftext|>", "<|bos|>")
    short = text[:20_000]
    assert (
        prefixed.encode_arrays([short], 997)[0].tolist()
        == prefixed.encode_arrays([short])[0].tolist()
    )
    assert prefixed.largest == len(short)
    assert [b.tolist() for b in BYTE.encode_arrays([text])] == [list(text.encode())]


def test_bpe_shards_record_their_tokenizer(tmp_path, random_texts):
    (tmp_path / "in.txt").write_text(" ".join(random_texts(20, letters="xyz ")))
    tok = train_bpe(random_texts(20, letters="xyz "), 280)
    manifest, _ = write_shards(
        discover_inputs([str(tmp_path / "in.txt")]), tok, tmp_path / "out", ReadOptions()
    )
    assert manifest.tokenizer.kind == "hf"
    assert manifest.tokenizer.content_hash == tok.content_hash
    assert manifest.tokenizer.vocab_size == tok.vocab_size


def test_byte_tokenizer_and_loading_errors(tmp_path):
    assert (BYTE.vocab_size, BYTE.eos_id, BYTE.bos_id, BYTE.pad_id) == (259, 256, 257, 258)
    assert BYTE.encode_batch(["hé"]) == [[104, 195, 169]]
    BYTE.save(tmp_path / "b")
    assert load_tokenizer(str(tmp_path / "b")).content_hash == BYTE.content_hash
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no tokenizer.json"):
        load_tokenizer(str(tmp_path / "empty"))


def test_manifest_round_trip_and_file_layout(tmp_path, random_texts):
    texts = random_texts(30)
    out = tmp_path / "s"
    writer = DatasetWriter(
        out,
        TokenizerInfo(**BYTE.identity()),
        0.2,
        shard_tokens=500,
        row_tokens=16,
        row_group_rows=3,
    )
    for t in texts:
        writer.add(BYTE.encode_arrays([t])[0], split_key(t))
    manifest = writer.finish(info={"note": "x"})
    assert read_manifest(out) == manifest
    assert manifest.dtype == "uint16" and manifest.row_tokens == 16 and manifest.row_group_rows == 3
    total = sum(len(t) + 1 for t in texts)
    assert manifest.num_train_tokens + manifest.num_val_tokens == total
    assert sum(f.documents for f in manifest.train + manifest.validation) == len(texts)
    assert [f.tokens for f in manifest.train[:-1]] == [500] * (len(manifest.train) - 1)
    for f in manifest.train + manifest.validation:
        pf = pq.ParquetFile(out / f.name)
        lengths = [len(r) for r in pf.read().column("tokens").to_pylist()]
        assert f.rows == len(lengths) == -(-f.tokens // 16)
        assert lengths[:-1] == [16] * (len(lengths) - 1) and 0 < lengths[-1] <= 16
        assert pf.num_row_groups == -(-f.rows // 3)
    val_docs = {t for t in texts if split_key(t) < 0.2}
    assert sum(f.documents for f in manifest.validation) == len(val_docs) > 0
    assert verify_shards(out) == manifest


def test_uint32_for_large_vocab(tmp_path):
    info = TokenizerInfo("test", 70_000, 0, None, "h")
    writer = DatasetWriter(tmp_path / "s", info, 0.0)
    writer.add(np.array([69_999, 5]), 0.5)
    manifest = writer.finish()
    assert manifest.dtype == "uint32"
    tokens = pq.read_table(tmp_path / "s" / "part-00000.parquet").column("tokens").to_pylist()
    assert tokens == [[69_999, 5, 0]]


def test_tiny_corpus_still_gets_one_validation_document(tmp_path):
    texts = ["alpha", "beta", "gamma"]
    manifest, _ = _write_texts(tmp_path, texts, val_fraction=0.01)
    first = min(texts, key=split_key)
    assert [f.documents for f in manifest.validation] == [1]
    assert manifest.num_val_tokens == len(first) + 1
    single, _ = _write_texts(tmp_path / "one", ["only"], val_fraction=0.01)
    assert single.validation == [] and single.num_train_tokens == 5


def test_copies_of_the_held_back_document_all_go_to_validation(tmp_path):
    """The document with the smallest split key, moved to validation when no other got there,
    once left its exact copies in train: the only validation text was trained on."""
    texts = ["the same license header\n", "another document here", "third doc text", "fourth one"]
    first = min(texts, key=split_key)
    assert split_key(first) >= 0.01, "no document goes to validation by its key alone"
    _write_texts(tmp_path, [first, *texts, first], val_fraction=0.01)
    assert shard_documents(tmp_path / "out", "validation") == [first] * 3
    assert sorted(shard_documents(tmp_path / "out", "train")) == sorted(set(texts) - {first})


def _write_texts(tmp_path, texts, **kw):
    tmp_path.mkdir(exist_ok=True)
    for i, t in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(t)
    return write_shards(
        discover_inputs([str(tmp_path / "*.txt")]), BYTE, tmp_path / "out", ReadOptions(), **kw
    )


def test_output_is_deterministic(corpus, tmp_path):
    files = discover_inputs([str(corpus)])
    a, _ = write_shards(
        files, BYTE, tmp_path / "a", ReadOptions(), val_fraction=0.3, shard_tokens=4096
    )
    b, _ = write_shards(
        files, BYTE, tmp_path / "b", ReadOptions(), val_fraction=0.3, shard_tokens=4096
    )
    assert [f.sha256 for f in a.train + a.validation] == [f.sha256 for f in b.train + b.validation]


# --- bad input -------------------------------------------------------------------------------


def test_no_input_matched(tmp_path):
    with pytest.raises(DataError, match=r"no input matched '.*nothing/\*\.jsonl'"):
        discover_inputs([str(tmp_path / "nothing" / "*.jsonl")])


def test_non_utf8_file_by_policy(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 latin-1")
    files = discover_inputs([str(tmp_path / "bad.txt")])
    with pytest.raises(
        DataError, match=r"bad\.txt: not valid UTF-8 \(byte 3.*--on-decode-error replace"
    ):
        write_shards(files, BYTE, tmp_path / "o", ReadOptions())
    _, stats = write_shards(files, BYTE, tmp_path / "o", ReadOptions(on_decode_error="replace"))
    assert stats.replaced_documents == 1
    assert shard_documents(tmp_path / "o") == ["caf\ufffd latin-1"]
    (tmp_path / "good.txt").write_text("fine")
    both = discover_inputs([str(tmp_path / "*.txt")])
    _, stats = write_shards(both, BYTE, tmp_path / "o2", ReadOptions(on_decode_error="skip"))
    assert (stats.skipped_documents, stats.documents) == (1, 1)


def test_non_utf8_jsonl_line_is_named(tmp_path):
    (tmp_path / "x.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff"}\n')
    with pytest.raises(DataError, match=r"x\.jsonl line 2: not valid UTF-8"):
        write_shards(
            discover_inputs([str(tmp_path / "x.jsonl")]), BYTE, tmp_path / "o", ReadOptions()
        )


def test_a_lone_surrogate_json_escape_is_named_by_line(tmp_path):
    """Valid UTF-8 with an escape of half a UTF-16 pair was 'not valid UTF-8 (byte 5 ...)',
    with no line."""
    (tmp_path / "s.jsonl").write_text('{"text": "ok"}\n{"text": "a\\ud800b"}\n')
    with pytest.raises(DataError) as err:
        documents(str(tmp_path / "s.jsonl"))
    assert str(err.value) == (
        f"{tmp_path / 's.jsonl'} line 2: a lone surrogate '\\ud800' (half of a UTF-16 pair, from "
        "a JSON escape), not a character; fix the text or pass --on-decode-error replace (or skip)"
    )
    replace = ReadOptions(on_decode_error="replace")
    assert documents(str(tmp_path / "s.jsonl"), replace) == ["ok", "a\ufffd\ufffd\ufffdb"]


def test_unreadable_file(tmp_path):
    (tmp_path / "broken.txt.gz").write_bytes(b"this is not gzip")
    (tmp_path / "ok.txt").write_text("fine")
    files = discover_inputs([str(tmp_path)])
    with pytest.raises(DataError, match=r"broken\.txt\.gz: can't read it .*--on-decode-error skip"):
        write_shards(files, BYTE, tmp_path / "o", ReadOptions())
    _, stats = write_shards(files, BYTE, tmp_path / "o", ReadOptions(on_decode_error="skip"))
    assert (stats.skipped_files, stats.documents) == (1, 1)


def test_empty_document_set(tmp_path):
    (tmp_path / "e.txt").write_text("")
    (tmp_path / "e.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(DataError, match=r"2 input file\(s\) held no non-empty document .*2 empty"):
        write_shards(discover_inputs([str(tmp_path)]), BYTE, tmp_path / "o", ReadOptions())


def test_missing_json_field_names_field_file_and_line(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(
        DataError, match=r"m\.jsonl line 2: no field 'text' \(fields: body\); pass --text-field"
    ):
        write_shards(
            discover_inputs([str(tmp_path / "m.jsonl")]), BYTE, tmp_path / "o", ReadOptions()
        )


def test_invalid_json_and_missing_parquet_column(tmp_path):
    (tmp_path / "j.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"j\.jsonl line 1: not valid JSON"):
        write_shards(
            discover_inputs([str(tmp_path / "j.jsonl")]), BYTE, tmp_path / "o", ReadOptions()
        )
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "p.parquet")
    with pytest.raises(
        DataError, match=r"p\.parquet: no column 'text' \(columns: body\); pass --parquet-column"
    ):
        write_shards(
            discover_inputs([str(tmp_path / "p.parquet")]), BYTE, tmp_path / "o", ReadOptions()
        )


def test_broken_link_in_an_input_dir_is_named(tmp_path):
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "b.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(
        DataError,
        match=rf"^{re.escape(str(tmp_path / 'b.txt'))}: can't read it \(a broken link "
        r"to .*gone\.txt\); remove it or fix it$",
    ):
        discover_inputs([str(tmp_path)])


def test_invalid_utf8_in_a_parquet_string_column_follows_the_policy(tmp_path):
    offsets = pa.array([0, 4, 9], pa.int32()).buffers()[1]
    column = pa.StringArray.from_buffers(2, offsets, pa.py_buffer(b"good\xff\xfebad"))
    pq.write_table(pa.table({"text": column}), tmp_path / "s.parquet")
    files = discover_inputs([str(tmp_path / "s.parquet")])
    with pytest.raises(
        DataError, match=r"s\.parquet row 2: not valid UTF-8 \(byte 0.*--on-decode-error replace"
    ):
        write_shards(files, BYTE, tmp_path / "o", ReadOptions())
    _, stats = write_shards(files, BYTE, tmp_path / "o", ReadOptions(on_decode_error="replace"))
    assert stats.replaced_documents == 1
    assert sorted(shard_documents(tmp_path / "o")) == ["good", "\ufffd\ufffdbad"]
    _, stats = write_shards(files, BYTE, tmp_path / "o2", ReadOptions(on_decode_error="skip"))
    assert (stats.skipped_documents, shard_documents(tmp_path / "o2")) == (1, ["good"])


def test_json_python_cannot_parse_is_named_by_line(tmp_path):
    (tmp_path / "n.jsonl").write_text('{"text": "a"}\n{"text": "b", "id": ' + "1" * 5000 + "}\n")
    (tmp_path / "d.jsonl").write_text('{"text": "x", "m": ' + "[" * 10**5 + "]" * 10**5 + "}\n")
    for name, why in (("n.jsonl line 2", r"Exceeds the limit"), ("d.jsonl line 1", "recursion")):
        with pytest.raises(DataError) as err:
            write_shards(
                discover_inputs([str(tmp_path / name.split()[0])]),
                BYTE,
                tmp_path / "o",
                ReadOptions(),
            )
        assert re.fullmatch(
            rf".*{re.escape(name)}: JSON that can't be parsed \(.*{why}.*\); fix or remove the line",
            str(err.value),
        )


def test_a_file_error_reaches_the_ray_driver_as_its_one_line(tmp_path):
    """The Ray task body forwards a DataError as a row; other exceptions would surface as a
    remote traceback. Called directly here: no Ray is started."""
    from trainer_core.ray.tokenization import _tokenize_files

    (tmp_path / "n.jsonl").write_text('{"text": "b", "id": ' + "1" * 5000 + "}\n")
    batch = {"first": np.array([0]), "last": np.array([1])}
    files = discover_inputs([str(tmp_path / "n.jsonl")])
    (table,) = _tokenize_files(batch, files, BYTE, ReadOptions())
    error = json.loads(table.column("stats")[0].as_py())["error"]
    assert error.startswith(f"{files[0].path} line 1: JSON that can't be parsed (")


def test_shard_dirs_in_an_input_dir_are_left_out(tmp_path):
    """An --out inside an --input dir: the next run once read the shards as text."""
    corpus = tmp_path / "corpus"
    (corpus / "notes").mkdir(parents=True)
    (corpus / "a.txt").write_text("text")
    (corpus / "notes" / "manifest.json").write_text('{"text": "not a shard manifest"}')
    write_shards(discover_inputs([str(corpus)]), BYTE, corpus / "shards", ReadOptions())
    left_out = []
    files = discover_inputs([str(corpus), str(corpus / "**" / "*")], left_out.append)
    assert [f.path for f in files] == [
        str(corpus / "a.txt"),
        str(corpus / "notes" / "manifest.json"),
    ]
    assert left_out == [str(corpus / "shards")] * 2
    with pytest.raises(
        DataError,
        match=rf"^--input '.*\*\.parquet' holds only shard dirs \({re.escape(str(corpus))}/shards\)",
    ):
        discover_inputs([str(corpus / "*" / "*.parquet")])


def test_tokenizer_config_must_be_a_utf8_json_object(tmp_path):
    train_bpe(["some text for a tokenizer"] * 5, 270).save(tmp_path / "tok")
    config = tmp_path / "tok" / "tokenizer_config.json"
    config.write_bytes(b"\xff\xfe")
    with pytest.raises(
        DataError, match=rf"^{re.escape(str(config))}: not UTF-8 text \(byte 0\); fix or remove it$"
    ):
        load_tokenizer(tmp_path / "tok")
    config.write_text("[]")
    with pytest.raises(DataError, match=rf"^{re.escape(str(config))}: a list, not a JSON object"):
        load_tokenizer(tmp_path / "tok")


def test_token_id_outside_vocab_is_named(tmp_path):
    writer = ShardWriter(tmp_path, "part", vocab_size=259, eos_id=256)
    with pytest.raises(
        DataError, match=r"token id 300 in doc\.txt is outside the tokenizer's vocab size 259"
    ):
        writer.add_document([1, 300, 2], "doc.txt")


def test_truncated_or_altered_shard(tmp_path, make_shards, random_texts):
    out = make_shards(random_texts(20))
    part = out / "part-00001.parquet"
    data = part.read_bytes()
    part.write_bytes(data[:-10])
    with pytest.raises(
        DataError,
        match=r"part-00001\.parquet: shard is .* bytes.*truncated.*re-run datasets/tokenize_corpus\.py",
    ):
        open_token_data(DataConfig(shards=str(out)), 320)
    part.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(
        DataError,
        match=r"part-00001\.parquet: sha256 differs .*re-run datasets/tokenize_corpus\.py",
    ):
        verify_shards(out)
    with pytest.raises(DataError, match=r"part-00001\.parquet: sha256 differs"):
        open_token_data(DataConfig(shards=str(out), verify_checksums=True), 320)
    part.unlink()
    with pytest.raises(DataError, match=r"part-00001\.parquet: shard file listed .* is missing"):
        verify_shards(out)


def _first_file(**fields):
    return lambda m: m["train"]["files"][0].update(fields) or m


@pytest.mark.parametrize(
    "content, why",
    [
        (lambda m: [], "a manifest is a JSON object, this one is a list"),
        (b'{"format": "\xff"}', r"not UTF-8 text \(byte 12\)"),
        (lambda m: {**m, "row_tokens": 0}, "row_tokens is 0, not an integer >= 1"),
        (lambda m: {**m, "row_group_rows": 0}, "row_group_rows is 0, not an integer >= 1"),
        (lambda m: {**m, "dtype": "int17"}, "dtype is 'int17', not 'uint16' or 'uint32'"),
        (_first_file(name=5), r"train\.files\[0\]\.name is 5, not a plain file name"),
        (_first_file(name="../x.parquet"), r"name is '\.\./x\.parquet', not a plain file name"),
        (_first_file(bytes="1056"), r"train\.files\[0\]\.bytes is '1056', not an integer >= 0"),
        (lambda m: m["tokenizer"].update(eos_id=None) or m, "tokenizer.eos_id is None, not an"),
    ],
)
def test_a_malformed_manifest_names_its_field(make_shards, random_texts, content, why):
    shards = make_shards(random_texts(10))
    path = shards / "manifest.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(json.dumps(content(json.loads(path.read_text()))))
    with pytest.raises(DataError) as err:
        open_token_data(DataConfig(shards=str(shards)), 320)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
    assert re.search(f"{why}.*; re-run datasets/tokenize_corpus\\.py", str(err.value))


def test_missing_manifest(tmp_path):
    with pytest.raises(
        DataError, match=r"no shard manifest there; create shards with datasets/tokenize_corpus\.py"
    ):
        open_token_data(DataConfig(shards=str(tmp_path)), 320)


def test_writer_never_deletes_what_its_dir_holds(tmp_path):
    mine = tmp_path / "o" / "part-00000.parquet"
    mine.parent.mkdir()
    mine.write_text("not a shard")
    with pytest.raises(
        DataError, match=r"o: not empty; shards are written into a new or empty dir"
    ):
        write_shards(discover_inputs([str(mine)]), BYTE, tmp_path / "o", ReadOptions())
    assert mine.read_text() == "not a shard"


def test_tokenize_replaces_only_a_shard_dir(run_script, tmp_path):
    (tmp_path / "doc.txt").write_text("text")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    code, _, err = run_script(
        "datasets/tokenize_corpus.py", "--input", str(tmp_path), "--out", str(notes)
    )
    assert (code, err) == (
        2,
        f"error: --out: {notes} holds files but no manifest.json, and only a shard dir is "
        "replaced; choose a new or empty dir\n",
    )
    assert [p.name for p in notes.iterdir()] == ["todo.txt"]
    code, _, err = run_script(
        "datasets/tokenize_corpus.py", "--input", str(tmp_path), "--out", str(notes / "todo.txt")
    )
    assert (code, err) == (
        2,
        f"error: --out: {notes / 'todo.txt'} is a file, not a directory; choose another --out\n",
    )


def test_tokenize_reports_unmatched_input_in_one_line(run_script, tmp_path):
    pattern = tmp_path / "none" / "*.jsonl"
    code, out, err = run_script(
        "datasets/tokenize_corpus.py", "--input", str(pattern), "--out", str(tmp_path / "o")
    )
    assert (code, out) == (2, "")
    assert err.startswith(f"error: no input matched '{pattern}'") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "flag, value, why",
    [
        ("--num-cpus", "0", "must be >= 1, got 0"),
        ("--shard-tokens", "-5", "must be >= 1, got -5"),
        ("--train-bpe", "0", "must be >= 1, got 0"),
        ("--val-fraction", "1", "must be in [0, 1), got 1"),
    ],
)
def test_tokenize_refuses_a_bad_number_naming_the_flag(run_script, tmp_path, flag, value, why):
    """--num-cpus 0 once reached Ray, which aborted with a C++ trace; --train-bpe 0 silently
    fell back to bytes."""
    (tmp_path / "doc.txt").write_text("text")
    out = tmp_path / "o"
    code, stdout, stderr = run_script(
        "datasets/tokenize_corpus.py", "--input", str(tmp_path), "--out", str(out), flag, value
    )
    assert (code, stdout) == (2, "")
    assert stderr.endswith(f"error: argument {flag}: {why}\n")
    assert not out.exists()


def test_tokenize_refuses_a_tokenizer_and_a_bpe_to_train_together(run_script, tmp_path):
    """--train-bpe won, and the --tokenizer given was not used, without a word."""
    (tmp_path / "doc.txt").write_text("text")
    out = tmp_path / "o"
    args = ("--input", str(tmp_path), "--out", str(out), "--tokenizer", "t.json")
    code, stdout, stderr = run_script("datasets/tokenize_corpus.py", *args, "--train-bpe", "300")
    assert (code, stdout) == (2, "")
    assert stderr.endswith("error: argument --train-bpe: not allowed with argument --tokenizer\n")
    assert not out.exists()


def test_a_continuation_keeps_the_tokens_of_the_whole_text():
    """Issue 26: a task's choice is scored on the tokens the model meets in training text. A
    byte-level BPE puts a word's leading space in the word's token, so after a context ending in
    a space the choice encoded alone ("abc") is not what the whole text holds (" abc")."""
    tok = train_bpe(["abc de abc de fg abc"] * 30, 300)
    context, choices = "de fg ", ["abc", "abc de"]
    for choice, c in zip(choices, tok.encode_continuations(context, choices), strict=True):
        (whole,) = tok.encode_arrays([context + choice])
        assert [*c.context, *c.ids] == whole.tolist()
        assert c.ids.tolist() != tok.encode_arrays([choice])[0].tolist()
        assert tok.tok.decode(c.ids.tolist()) == " " + choice
        assert c.nbytes == len(" " + choice)  # the bytes its tokens cover
    byte = ByteTokenizer().encode_continuations(context, choices)
    assert [bytes(c.context) for c in byte] == [context.encode()] * 2
    assert [(bytes(c.ids), c.nbytes) for c in byte] == [(b"abc", 3), (b"abc de", 6)]

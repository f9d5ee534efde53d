"""The training loader: window addressing, order, exact resume, data parallelism, mixes, eval."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from trainer_core.config import DataConfig
from trainer_core.data import MIX_BLOCK, TokenData, open_token_data
from trainer_core.shards import DataError, read_manifest

SEQ = 16


def take(iterator, n):
    return list(itertools.islice(iterator, n))


def file_stream(directory, name) -> np.ndarray:
    return (
        pq.read_table(directory / name)
        .column("tokens")
        .combine_chunks()
        .flatten()
        .to_numpy()
        .astype(np.int64)
    )


@pytest.fixture
def shards(make_shards, random_texts):
    return make_shards(random_texts(60))


@pytest.fixture
def data(shards) -> TokenData:
    return open_token_data(DataConfig(shards=str(shards)), 320)


def test_windows_are_file_slices_at_stride_seq_len(data, shards):
    manifest = read_manifest(shards)
    assert len(manifest.train) > 3, "the fixture spans several files"
    split = data.train[0]
    expected = []
    for f in manifest.train:
        stream = file_stream(shards, f.name)
        expected += [stream[i * SEQ : i * SEQ + SEQ + 1] for i in range((f.tokens - 1) // SEQ)]
    assert split.num_windows(SEQ) == len(expected)
    out = np.empty((len(expected), SEQ + 1), dtype=np.int64)
    split.read(np.arange(len(expected)), SEQ, data.cache, out)
    np.testing.assert_array_equal(out, np.stack(expected))
    files, offsets = split.locate(np.array([0, len(expected) - 1]), SEQ)
    assert files.tolist() == [0, len(manifest.train) - 1] and offsets[0] == 0


def test_each_epoch_is_a_permutation_of_all_windows(data):
    n = data.train[0].num_windows(SEQ)
    order = data.order(SEQ, seed=3)
    _, first = order.locate(np.arange(n))
    _, second = order.locate(np.arange(n, 2 * n))
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(n))
    assert first.tolist() != second.tolist(), "each epoch has its own permutation"


def test_batches_are_deterministic_and_seeded(shards, data):
    a = take(data.train_batches(SEQ, 8, seed=1), 5)
    b = take(open_token_data(DataConfig(shards=str(shards)), 320).train_batches(SEQ, 8, seed=1), 5)
    c = take(data.train_batches(SEQ, 8, seed=2), 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    assert a[0].dtype == torch.int64 and a[0].shape == (8, SEQ + 1)


def test_exact_resume_across_epoch_boundaries(data):
    batch = 64
    steps_per_epoch = data.train[0].num_windows(SEQ) / batch
    total = int(3 * steps_per_epoch) + 2
    full = take(data.train_batches(SEQ, batch, seed=5), total)
    for start in (1, int(steps_per_epoch), total - 3):
        resumed = take(data.train_batches(SEQ, batch, seed=5, start_step=start), total - start)
        assert all(torch.equal(x, y) for x, y in zip(resumed, full[start:], strict=True))


def test_data_parallel_ranks_split_the_global_batch(data):
    global_batches = take(data.train_batches(SEQ, 8, seed=0, start_step=2), 3)
    for dp in (2, 4):
        ranks = [take(data.train_batches(SEQ, 8, 0, 2, r, dp), 3) for r in range(dp)]
        for step in range(3):
            parts = [ranks[r][step] for r in range(dp)]
            assert all(p.shape == (8 // dp, SEQ + 1) for p in parts)
            assert torch.equal(torch.cat(parts), global_batches[step])
    with pytest.raises(DataError, match="can't be split evenly over 3"):
        data.train_batches(SEQ, 8, 0, 0, 0, 3)


def test_data_position(data):
    n = data.train[0].num_windows(SEQ)
    take(data.train_batches(SEQ, 64, seed=4), 1)
    step = n // 64 + 2
    pos = data.data_position(step)
    assert pos["epoch"] == 1 and pos["index_in_epoch"] == step * 64 - n
    assert pos["windows_consumed"] == step * 64 and pos["file"].startswith("part-")
    window = data.order(SEQ, 4).permutation(0, 1)[pos["index_in_epoch"]]
    files, offsets = data.train[0].locate(np.array([window]), SEQ)
    assert (pos["file"], pos["offset"]) == (data.train[0].paths[files[0]].name, offsets[0])
    assert data.data_position(step, SEQ, 64, 4) == pos


def test_mix_follows_weights_deterministically(tmp_path, make_shards, random_texts):
    a = make_shards(random_texts(40, seed=1, letters="abc"), name="a")
    b = make_shards(random_texts(40, seed=2, letters="xyz"), name="b")
    mix = tmp_path / "mix.yaml"
    mix.write_text("a: 3\nb: 1\n")
    data = open_token_data(DataConfig(mix=str(mix)), 320)
    assert (
        data.num_train_tokens
        == read_manifest(a).num_train_tokens + read_manifest(b).num_train_tokens
    )
    sources, _ = data.order(SEQ, 0).locate(np.arange(2 * MIX_BLOCK))
    assert (sources == 0).sum() == 2 * MIX_BLOCK * 3 // 4, "exact quota per block"
    batches = take(data.train_batches(SEQ, 32, seed=0), 40)
    rows = torch.cat(batches)
    from_a = torch.isin(rows, torch.tensor([97, 98, 99, 256])).all(1)
    from_b = torch.isin(rows, torch.tensor([120, 121, 122, 256])).all(1)
    assert bool((from_a | from_b).all()), "every window comes from exactly one source"
    assert 0.70 < from_a.float().mean().item() < 0.80
    again = take(open_token_data(DataConfig(mix=str(mix)), 320).train_batches(SEQ, 32, seed=0), 40)
    assert all(torch.equal(x, y) for x, y in zip(batches, again, strict=True))
    resumed = take(data.train_batches(SEQ, 32, seed=0, start_step=150), 2)
    full = take(data.train_batches(SEQ, 32, seed=0), 152)
    assert torch.equal(resumed[0], full[150]) and torch.equal(resumed[1], full[151])


def test_mix_errors(tmp_path, make_shards, random_texts):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: -1\n")
    with pytest.raises(DataError, match=r"bad\.yaml: weight of 'a' is -1"):
        open_token_data(DataConfig(mix=str(bad)), 320)
    with pytest.raises(DataError, match="mix file .* not found"):
        open_token_data(DataConfig(mix=str(tmp_path / "none.yaml")), 320)
    make_shards(random_texts(10), name="a")
    other = make_shards(random_texts(10), name="b")
    manifest = (other / "manifest.json").read_text().replace('"kind": "byte"', '"kind": "other"')
    (other / "manifest.json").write_text(
        manifest.replace('"content_hash": "', '"content_hash": "0')
    )
    mix = tmp_path / "mix.yaml"
    mix.write_text("a: 1\nb: 1\n")
    with pytest.raises(
        DataError, match=r"mix sources use different tokenizers: .*a \(byte.*b \(other"
    ):
        open_token_data(DataConfig(mix=str(mix)), 320)


def test_eval_batches_are_fixed_validation_windows(data, shards):
    first = data.eval_batches(SEQ, 4, 3)
    again = data.eval_batches(SEQ, 4, 3)
    assert len(first) == 3 and all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
    windows = set()
    for f in read_manifest(shards).validation:
        val = file_stream(shards, f.name).tolist()
        windows |= {tuple(val[i * SEQ : i * SEQ + SEQ + 1]) for i in range((len(val) - 1) // SEQ)}
    assert all(tuple(row.tolist()) in windows for b in first for row in b)
    halves = [data.eval_batches(SEQ, 4, 3, r, 2) for r in range(2)]
    assert all(torch.equal(torch.cat([halves[0][i], halves[1][i]]), first[i]) for i in range(3))
    assert data.eval_batches(SEQ, 4, 0) == []


def test_vocab_mismatch_names_both_sizes(shards):
    with pytest.raises(
        DataError,
        match=r"manifest\.json: the shards' tokenizer \(byte\) has vocab_size 259, more than "
        r"model\.vocab_size=100; set model\.vocab_size >= 259",
    ):
        open_token_data(DataConfig(shards=str(shards)), 100)


def test_tokenizer_setting_must_match_shards(shards, tmp_path):
    from trainer_core.tokenizer import train_bpe

    train_bpe(["some text for a tokenizer"] * 5, 270).save(tmp_path / "tok")
    with pytest.raises(DataError, match="shards were made by another tokenizer"):
        open_token_data(DataConfig(shards=str(shards), tokenizer=str(tmp_path / "tok")), 320)


def test_sequence_longer_than_every_file(data):
    with pytest.raises(DataError, match=r"no shard file holds seq_len\+1 = 1001 tokens"):
        data.train_batches(1000, 8, 0)


def test_demo_corpus_by_default():
    data = open_token_data(DataConfig(), 320)
    assert data.manifest.info["corpus"] == "python-stdlib"
    assert data.vocab_size == 259 and data.eos_id == 256 and data.num_train_tokens > 1_000_000
    batch = next(data.train_batches(128, 4, seed=0))
    assert batch.shape == (4, 129) and int(batch.max()) <= 256
    assert len(data.eval_batches(128, 4, 2)) == 2

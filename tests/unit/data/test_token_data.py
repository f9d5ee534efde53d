"""The training loader: window addressing, order, exact resume, data parallelism, mixes, eval."""

from __future__ import annotations

import collections
import io
import itertools
import json
import re
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from trainer_core.config.sections import DataConfig
from trainer_core.data.demo_corpus import demo_shards
from trainer_core.data.row_groups import RowGroupCache
from trainer_core.data.shards import (
    DataError,
    ShardError,
    file_sha256,
    read_manifest,
    write_manifest,
)
from trainer_core.data.token_data import (
    MIX_BLOCK,
    TokenData,
    WindowOrder,
    open_token_data,
    read_mix,
)

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
    # The content id (a resume on other data is refused) follows the shares, not how the
    # weights are written: 3:1 and 75:25 draw the same batches.
    mix.write_text("a: 75\nb: 25\n")
    assert open_token_data(DataConfig(mix=str(mix)), 320).content_id == data.content_id
    mix.write_text("a: 1\nb: 1\n")
    assert open_token_data(DataConfig(mix=str(mix)), 320).content_id != data.content_id


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


def test_a_mix_of_many_sources_builds_each_permutation_once(monkeypatch):
    """The cache once held 4 permutations in all while every step visits every source, so a mix
    of 5 or more rebuilt each whole permutation on every step (0.7 s a step at 5M windows)."""
    windows = [50, 70, 90, 110, 130, 9]  # 9: a source that goes through several epochs a step
    built = []
    default_rng = np.random.default_rng

    def counting_rng(seed):
        if seed[1] == 0:  # [seed, 0, source, epoch]: a permutation's stream, not a block's
            built.append((seed[2], seed[3]))
        return default_rng(seed)

    monkeypatch.setattr(np.random, "default_rng", counting_rng)
    order = WindowOrder(windows, [1.0] * len(windows), seed=3)
    steps = [order.locate(np.arange(k * 64, (k + 1) * 64)) for k in range(40)]
    sources, picked = (np.concatenate(parts) for parts in zip(*steps, strict=True))
    consumed_sources, before = order.consumed(np.arange(40 * 64))
    needed = {(int(s), int(b) // windows[s]) for s, b in zip(consumed_sources, before, strict=True)}
    assert sorted(built) == sorted(needed), "every (source, epoch) permutation built exactly once"
    assert sources[:12].tolist() == [1, 1, 4, 5, 2, 4, 2, 4, 5, 0, 4, 3], "the order of before"
    assert picked[:12].tolist() == [29, 11, 69, 2, 84, 68, 30, 33, 8, 2, 26, 98]
    at_once = WindowOrder(windows, [1.0] * len(windows), seed=3).locate(np.arange(40 * 64))
    assert np.array_equal(sources, at_once[0]) and np.array_equal(picked, at_once[1])


def test_mix_weights_must_be_finite_and_the_file_utf8(tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text("a: .inf\nb: 1\n")
    with pytest.raises(
        DataError, match=r"mix\.yaml: weight of 'a' is inf; weights must be finite numbers > 0$"
    ):
        read_mix(mix)
    mix.write_text("a: 1.0e+308\nb: 1.0e+308\n")
    with pytest.raises(DataError, match=r"mix\.yaml: the weights sum to more than a float holds"):
        read_mix(mix)
    mix.write_bytes(b"\xff\xfe: 1\n")
    with pytest.raises(DataError, match=r"mix\.yaml: not UTF-8 text \(byte 0\); a mix is a YAML"):
        read_mix(mix)


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


def test_data_read_twice_is_said_per_source(data, shards, tmp_path, make_shards, random_texts):
    """Training wraps into a second epoch and evaluation around its split without a word; the
    demo's evals counted 99 of its 413 validation windows twice, unseen."""
    train = data.train[0].num_windows(SEQ)
    val = data.val[0].num_windows(SEQ)
    assert data.repeats(SEQ, train, val) == []
    over = data.repeats(SEQ, 3 * train, val + 5)
    tokens = int(data.train[0].tokens.sum())
    left = tokens - train * SEQ  # the fixture's files of 700 tokens: 12 left out of each
    assert over == [
        f"{shards}: the run reads its {train:,} training windows 3 times over; repeated data "
        "bends the loss curve a scaling law is fitted to (use more text, or train fewer tokens); "
        "windows of seq_len+1 = 17 tokens never cross a file, so the tails of the training "
        f"split's {len(data.train[0].tokens)} files (700 tokens at most) leave {left} of its "
        f"{tokens:,} tokens ({100 * left / tokens:.2g}%) out: re-tokenize with --shard-tokens "
        ">= 1601 to leave out under 1%",
        f"{shards}: {val + 5:,} eval windows asked of a validation split of {val:,}, so 5 count "
        f"twice; eval at most {val * SEQ:,} tokens (trainer.eval_batches, or a ladder's "
        "eval_tokens) or re-tokenize with a larger --val-fraction",
    ]
    # in a mix, each source reads its share: 3:1 puts 3/4 of the windows on the first
    other = make_shards(random_texts(60, seed=5), name="other")
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"{shards}: 3\n{other}: 1\n")
    mixed = open_token_data(DataConfig(mix=str(mix)), 320)
    lines = mixed.repeats(SEQ, 2 * train, 0)
    assert len(lines) == 1 and lines[0].startswith(f"{shards}: the run reads its {train:,} ")
    assert " 1.5 times over" in lines[0]


def test_eval_windows_asked_many_times_over_say_how_often_each_counts(data):
    """512 windows asked of a split of 89 said "423 count twice": taken round the split, each
    counted 5 or 6 times."""
    n = data.val[0].num_windows(SEQ)
    asked = 5 * n + 3
    (line,) = data.repeats(SEQ, 0, asked)
    said = f"{asked:,} eval windows asked of a validation split of {n:,}, so each counts up to 6 "
    assert f"{said}times; eval at most" in line
    rows = data.eval_batches(SEQ, asked, 1)[0]
    counts = collections.Counter(tuple(row.tolist()) for row in rows)
    assert len(counts) == n and set(counts.values()) == {5, 6}
    (line,) = data.repeats(SEQ, 0, 2 * n)
    assert f"of {n:,}, so each counts up to 2 times;" in line


def test_a_validation_split_without_a_window_is_refused_when_planned(data):
    """Eval windows longer than the whole split: the run failed in eval_batches, after Ray had
    started and the model was built, while the plan's check of the split said nothing."""
    seq = int(data.val[0].tokens.sum()) + 10
    for ask in (lambda: data.repeats(seq, 0, 4), lambda: data.eval_batches(seq, 4, 1)):
        with pytest.raises(DataError, match=r"validation split \(\d+ tokens\) has no window"):
            ask()
    assert not any("eval windows" in line for line in data.repeats(seq, 0, 0)), "none asked"


def test_vocab_mismatch_names_both_sizes(shards):
    with pytest.raises(
        DataError,
        match=r"manifest\.json: the shards' tokenizer \(byte\) has vocab_size 259, more than "
        r"model\.vocab_size=100; set model\.vocab_size >= 259",
    ):
        open_token_data(DataConfig(shards=str(shards)), 100)


def test_tokenizer_setting_must_match_shards(shards, tmp_path):
    from trainer_core.data.tokenizer import train_bpe

    train_bpe(["some text for a tokenizer"] * 5, 270).save(tmp_path / "tok")
    with pytest.raises(DataError, match="shards were made by another tokenizer"):
        open_token_data(DataConfig(shards=str(shards), tokenizer=str(tmp_path / "tok")), 320)


def test_sequence_longer_than_every_file(data):
    with pytest.raises(
        DataError, match=r"none of its \d+ files holds a window of seq_len\+1 = 1001"
    ):
        data.train_batches(1000, 8, 0)


def test_demo_corpus_by_default(private_caches):
    data = open_token_data(DataConfig(), 320)
    assert data.manifest.info["corpus"] == "python-stdlib"
    assert demo_shards().is_relative_to(private_caches)  # not the user's ~/.cache
    assert data.vocab_size == 259 and data.eos_id == 256 and data.num_train_tokens > 1_000_000
    batch = next(data.train_batches(128, 4, seed=0))
    assert batch.shape == (4, 129) and int(batch.max()) <= 256
    assert len(data.eval_batches(128, 4, 2)) == 2


def read_everything(shards) -> np.ndarray:
    """Every training window of epoch 0, through a fresh reader (no cache from a previous read)."""
    data = open_token_data(DataConfig(shards=str(shards)), 320)
    return data.read_slots(np.arange(data.train[0].num_windows(SEQ)), SEQ, seed=0)


def rewrite_shard(shards, name: str, stream: np.ndarray, page_checksums: bool = True) -> None:
    """Replace a training file with ``stream`` in the shards' layout and update the manifest to
    match, as a tokenizer that produced these ids (or an older one) would have written it."""
    manifest = read_manifest(shards)
    offsets = np.append(np.arange(0, stream.size, manifest.row_tokens), stream.size)
    column = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(stream.astype(manifest.dtype))
    )
    path = shards / name
    pq.write_table(
        pa.table({"tokens": column}),
        path,
        row_group_size=manifest.row_group_rows,
        write_page_checksum=page_checksums,
    )
    entry = next(f for f in manifest.train if f.name == name)
    entry.bytes, entry.sha256 = path.stat().st_size, file_sha256(path)
    manifest.page_checksums = page_checksums
    write_manifest(manifest)


def decode_file(split, name: str) -> np.ndarray:
    """Every token of one file of ``split``, decoded afresh by the reader (no cache)."""
    f = [p.name for p in split.paths].index(name)
    path, tokens, cache = split.paths[f], int(split.tokens[f]), RowGroupCache()
    groups = range(-(-tokens // split.layout.group_tokens))
    return np.concatenate([cache.group(path, g, tokens, split.layout) for g in groups])


def test_a_flipped_bit_anywhere_in_a_shard_is_caught_or_changes_nothing(make_shards, random_texts):
    shards = make_shards(random_texts(10), shard_tokens=256)  # 4 row groups: ~1.2 KB to flip
    split = open_token_data(DataConfig(shards=str(shards)), 320).train[0]
    part = shards / "part-00001.parquet"
    original, expected = part.read_bytes(), decode_file(split, part.name)
    caught = []
    flips = [(pos, bit) for pos in range(len(original)) for bit in {pos % 8, 7}]  # every byte
    for pos, bit in flips:
        flipped = bytearray(original)
        flipped[pos] ^= 1 << bit
        part.write_bytes(flipped)
        try:
            got = decode_file(split, part.name)
        except ShardError as e:
            assert str(e).startswith(f"{part}: ") and "\n" not in str(e), str(e)
            caught.append(pos)
        else:
            assert got.dtype == expected.dtype and np.array_equal(got, expected), pos
    meta = pq.ParquetFile(io.BytesIO(original)).metadata
    for c in (meta.row_group(i).column(0) for i in range(meta.num_row_groups)):
        page_end = c.data_page_offset + c.total_compressed_size
        assert set(range(page_end - 16, page_end)) <= set(caught), "page data is CRC-checked"


def test_the_training_reader_names_a_corrupt_shard(shards):
    part = shards / "part-00001.parquet"
    chunk = pq.ParquetFile(part).metadata.row_group(1).column(0)
    raw = bytearray(part.read_bytes())
    raw[chunk.data_page_offset + chunk.total_compressed_size - 5] ^= 0x04
    part.write_bytes(raw)
    with pytest.raises(ShardError, match=rf"^{part}: row group 1 is corrupt \(could not verify"):
        read_everything(shards)


def test_token_id_outside_the_vocab_names_file_and_row(shards):
    stream = file_stream(shards, "part-00002.parquet")
    stream[5 * 32 + 3] = 300
    rewrite_shard(shards, "part-00002.parquet", stream)
    with pytest.raises(
        ShardError,
        match=r"part-00002\.parquet: row 5 holds token id 300, outside the manifest's vocab size "
        r"259 .*re-run datasets/tokenize_corpus\.py",
    ):
        read_everything(shards)


def test_shards_without_page_checksums_are_read_with_a_warning(shards):
    expected = read_everything(shards)
    for f in read_manifest(shards).train:
        rewrite_shard(shards, f.name, file_stream(shards, f.name), page_checksums=False)
    with pytest.warns(UserWarning, match=r"shards written without page checksums.*re-run datasets"):
        np.testing.assert_array_equal(read_everything(shards), expected)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_token_data(DataConfig(shards=str(shards), verify_checksums=True), 320)


def test_training_on_an_out_of_vocab_id_stops_in_one_line(shards, run_script, tmp_path):
    for f in read_manifest(shards).train:
        stream = file_stream(shards, f.name)
        stream[32 + 7] = 400  # >= the model's vocab (320): an IndexError in the embedding
        rewrite_shard(shards, f.name, stream)
    code, _, err = run_script(
        "trainer_core/train/__main__.py",
        f"--data.shards={shards}",
        f"--data.seq_len={SEQ}",
        f"--trainer.global_batch_size={4 * SEQ}",
        "--trainer.max_steps=20",
        "--checkpoint.enabled=false",
        "--trainer.progress=false",
        f"--trainer.run_dir={tmp_path / 'run'}",
    )
    assert code == 2 and err.count("\n") == 1
    assert re.fullmatch(
        rf"error: {shards}/part-\d{{5}}\.parquet: row 1 holds token id 400, outside the "
        r"manifest's vocab size 259 .*\n",
        err,
    )
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "failed" and "token id 400" in run["error"]

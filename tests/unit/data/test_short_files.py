"""Shard files too short for their windows: windows never cross a file, so a small
``--shard-tokens`` leaves tokens out (or every window) however much text the split holds."""

from __future__ import annotations

import re

import pytest

from trainer_core.config.sections import DataConfig
from trainer_core.data.shards import DataError
from trainer_core.data.token_data import TokenData, open_token_data

SEQ = 32


def open_shards(make_shards, random_texts, shard_tokens: int) -> TokenData:
    shards = make_shards(random_texts(15), shard_tokens=shard_tokens)
    return open_token_data(DataConfig(shards=str(shards)), 320)


def test_files_shorter_than_a_window_name_shard_tokens_not_more_text(make_shards, random_texts):
    """5682 validation tokens in files of 100 were said to have "no window" of 129, with a larger
    --val-fraction as the fix; training said "use more text" of a 314K-token split."""
    data = open_shards(make_shards, random_texts, shard_tokens=20)
    for which, split in (("training", data.train[0]), ("validation", data.val[0])):
        said = (
            f"the {which} split holds {int(split.tokens.sum()):,} tokens, but none of its "
            f"{len(split.tokens):,} files holds a window of seq_len+1 = 33 (the longest has 20; "
            "windows never cross a file); re-tokenize with --shard-tokens >= 33 (3201 or more "
            "leaves under 1% of the tokens out), or set data.seq_len <= 19"
        )
        asks = [lambda: data.eval_batches(SEQ, 4, 1), lambda: data.repeats(SEQ, 0, 4)]
        if which == "training":
            asks = [lambda: data.train_batches(SEQ, 8, 0), lambda: data.repeats(SEQ, 8, 0)]
        for ask in asks:
            with pytest.raises(DataError, match=re.escape(said)):
                ask()


def test_the_windows_left_out_by_short_files_are_said_with_the_repeat(make_shards, random_texts):
    """Files of 200 tokens and windows of 129 trained on 64% of the split: the run was told it
    read its windows 1.3 times over and to use more text, though the split held enough."""
    data = open_shards(make_shards, random_texts, shard_tokens=48)
    train, val = data.train[0], data.val[0]
    windows = train.num_windows(SEQ)

    def note(which: str, split) -> str:
        total = int(split.tokens.sum())
        left = total - split.num_windows(SEQ) * SEQ
        assert left > total // 4, "one window of 33 in each file of 48"
        return (
            "; windows of seq_len+1 = 33 tokens never cross a file, so the tails of the "
            f"{which} split's {len(split.tokens):,} files (48 tokens at most) leave {left:,} of "
            f"its {total:,} tokens ({100 * left / total:.2g}%) out: re-tokenize with "
            "--shard-tokens >= 3201 to leave out under 1%"
        )

    (line,) = data.repeats(SEQ, windows + windows // 4, 0)
    assert line.endswith(
        f"1.2 times over; repeated data bends the loss curve a scaling law is "
        f"fitted to{note('training', train)}"
    )
    (line,) = data.repeats(SEQ, 3 * windows, 0)
    assert line.endswith(
        f"fitted to (use more text, or train fewer tokens){note('training', train)}"
    )
    (line,) = data.repeats(SEQ, 0, val.num_windows(SEQ) + 1)
    assert line.endswith(f"re-tokenize with a larger --val-fraction{note('validation', val)}")


def test_a_tail_no_sharding_avoids_is_not_reported(make_shards, random_texts):
    """A split in one file leaves out only its own tail, which no --shard-tokens shortens."""
    data = open_shards(make_shards, random_texts, shard_tokens=1 << 20)
    split = data.train[0]
    total = int(split.tokens.sum())
    seq = total // 2 + 1  # one window, and a tail of near half the split
    assert len(split.tokens) == 1 and split.num_windows(seq) == 1
    (line,) = data.repeats(seq, 2, 0)
    assert line.endswith(
        "2 times over; repeated data bends the loss curve a scaling law is "
        "fitted to (use more text, or train fewer tokens)"
    )

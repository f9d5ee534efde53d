from __future__ import annotations

import argparse

import pytest

from trainer_core.config.arg_types import (
    fraction,
    non_negative_int,
    positive_int,
    positive_number,
    split_fraction,
)


@pytest.mark.parametrize(
    "kind, text, value",
    [
        (positive_int, "3", 3),
        (non_negative_int, "0", 0),
        (positive_number, "1e21", 1e21),
        (fraction, "1", 1.0),
        (split_fraction, "0", 0.0),
    ],
)
def test_values_in_range_pass_through(kind, text, value):
    assert kind(text) == value


@pytest.mark.parametrize(
    "kind, text, why",
    [
        (positive_int, "2.5", "expected an integer, got '2.5'"),
        (non_negative_int, "-1", "must be >= 0, got -1"),
        (positive_number, "x", "expected a number, got 'x'"),
        (positive_number, "nan", "must be a finite number, got 'nan'"),
        (fraction, "1.01", "must be in (0, 1], got 1.01"),
        (split_fraction, "-0.1", "must be in [0, 1), got -0.1"),
    ],
)
def test_values_out_of_range_say_why(kind, text, why):
    with pytest.raises(argparse.ArgumentTypeError) as err:
        kind(text)
    assert str(err.value) == why

"""argparse value types for the numeric flags of the entry points that use plain argparse
(``workflows/analyze.py``, ``datasets/tokenize_corpus.py``).

A value out of range is refused while the command line is parsed, with argparse's one line that
names the flag ("argument --num-cpus: must be >= 1, got 0"), before Ray starts or a fit runs:
otherwise it surfaces minutes later as a trace from deep inside Ray, NumPy or a power law.
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type[int] | type[float]) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_number(text: str) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value:g}")
    return value


def fraction(text: str) -> float:
    """A share in (0, 1], such as an MFU."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value:g}")
    return value


def split_fraction(text: str) -> float:
    """A share in [0, 1), such as the documents held out for validation."""
    value = _number(text, float)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value:g}")
    return value

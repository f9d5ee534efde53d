"""Numbers as a ladder names them (200K, 4.4M), for tables and plots alike."""

from __future__ import annotations


def compact(x: float) -> str:
    """200000 -> '200K', 4.4e6 -> '4.4M': counts as a ladder names its sizes, and a third of the
    width of '2x10^5', whose tick labels ran together on an axis spanning about a decade."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale * 0.9995:  # 999,999 is '1M', not '1e+03K'
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"

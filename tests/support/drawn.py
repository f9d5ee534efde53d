"""Comparing what a Figure draws with the numbers computed from the plot's inputs."""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.colors import to_rgba
from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D


def close(a, b) -> bool:
    """Equal as drawn: the plot must show the numbers computed from its inputs. rtol 1e-5 is far
    above any rounding between CPUs and far below what a wrong curve moves (zeros, a shifted
    step, another law's values)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=0)


def line(ax: Axes, label: str) -> tuple[np.ndarray, np.ndarray]:
    """The x and y of the one line whose legend label starts with ``label``."""
    found = [ln for ln in ax.lines if ln.get_label().startswith(label)]
    assert len(found) == 1, f"{len(found)} lines labelled {label!r}"
    return np.asarray(found[0].get_xdata(), dtype=float), np.asarray(found[0].get_ydata(), float)


def through(ax: Axes, x, y, color=None) -> Line2D:
    """The one line drawn through exactly the points (x, y), in ``color`` where given: found by
    its data, so an unlabelled curve is checked without leaning on draw order."""
    xy = np.column_stack([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
    found = [
        ln
        for ln in ax.lines
        if close(ln.get_xydata(), xy)
        and (color is None or close(to_rgba(ln.get_color()), to_rgba(color)))
    ]
    assert len(found) == 1, f"{len(found)} lines through {xy.tolist()} in {color}"
    return found[0]


def scatter(ax: Axes, xy) -> PathCollection:
    """The one scatter drawn at exactly the points ``xy``: found by position, not draw order."""
    found = [
        c for c in ax.collections if isinstance(c, PathCollection) and close(c.get_offsets(), xy)
    ]
    assert len(found) == 1, f"{len(found)} scatters at {np.asarray(xy).tolist()}"
    return found[0]


def marker(ax: Axes, xy) -> Line2D:
    """The one unconnected marker line drawn at exactly the points ``xy``."""
    found = [ln for ln in ax.lines if ln.get_linestyle() == "None" and close(ln.get_xydata(), xy)]
    assert len(found) == 1, f"{len(found)} markers at {np.asarray(xy).tolist()}"
    return found[0]


def band(ax: Axes, label: str) -> np.ndarray:
    """The vertices of the one filled band labelled ``label``, without repeats, sorted: its
    lower and upper edges' points together (a ``fill_between`` closes its outline)."""
    found = [c for c in ax.collections if c.get_label() == label]
    assert len(found) == 1, f"{len(found)} bands labelled {label!r}"
    return np.unique(np.concatenate([p.vertices for p in found[0].get_paths()]), axis=0)


def bars(ax: Axes, segments) -> LineCollection:
    """The one set of error bars drawing exactly ``segments`` ([[x0, y0], [x1, y1]] each): the
    intervals themselves, wherever the estimate's marker sits."""
    found = [
        col
        for c in ax.containers
        if isinstance(c, ErrorbarContainer)
        for col in c[2]
        if close(col.get_segments(), segments)
    ]
    assert len(found) == 1, f"{len(found)} error bars drawing {np.asarray(segments).tolist()}"
    return found[0]

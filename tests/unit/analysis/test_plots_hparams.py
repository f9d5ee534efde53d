"""What the LR*(N, D) figure holds on a ladder-style sweep: each size's horizons a multiple of its
own tokens, so no D repeats across sizes (the demo's sweep: D/N 1.25..10 at 21.7K and 37.1K)."""

from __future__ import annotations

import math

import numpy as np
from drawn import close
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba

from trainer_core.analysis.hparam_laws import CellOptimum, HparamLawFit, fit_hparam_law
from trainer_core.analysis.plots_hparams import hparam_law_figure

SIZES = (2e4, 4e4)
RATIOS = (1.25, 2.5, 5.0, 10.0)
"""Tokens per parameter of each size's horizons; its D rounded off by a few % per size."""
JITTER = (0.97, 1.03)
"""Each size's D over ratio * N: whole batches round each size's horizons their own way."""
COINCIDING = 0.009
"""The optimum of the smallest size at D/N 5 and 10 alike: one grid LR, the same interval."""


def cell(n: float, d: float, value: float, at_edge: bool = False) -> CellOptimum:
    high = math.inf if at_edge else value * 1.5
    return CellOptimum(n, d, "lr", value, value / 1.5, high, 2.0, "grid", at_edge, 3)


def ladder_style_law() -> HparamLawFit:
    """LR*(N, D) through cells at D = ratio * N (3% apart across sizes); the smallest horizon
    of the smallest size at the grid's edge, its D/N 5 and 10 optima equal."""
    cells = []
    for n, jitter in zip(SIZES, JITTER, strict=True):
        for r in RATIOS:
            value = 5 * n**-0.4 * (r * n) ** -0.2
            if n == SIZES[0] and r >= 5:
                value = COINCIDING
            cells.append(cell(n, r * n * jitter, value, at_edge=n == SIZES[0] and r == 1.25))
    return fit_hparam_law(cells, n_bootstrap=50)


def test_lr_vs_n_groups_a_ladder_style_sweep_by_tokens_per_parameter():
    """Grouped by D, each colour would hold one point and its law a stub at one size: grouped
    by D/N, each law line crosses both sizes at that D/N, through the law's values there."""
    law = ladder_style_law()
    ax = hparam_law_figure(law, "N").axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[:4] == ["D/N=1.25", "D/N=2.5", "D/N=5", "D/N=10"]
    dashed = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(dashed) == len(RATIOS)
    for ln, r in zip(dashed, RATIOS, strict=True):
        along = np.asarray(ln.get_xdata(), dtype=float)
        assert along.min() < SIZES[0] and along.max() > SIZES[1], "a line across the sizes"
        at = r * math.sqrt(JITTER[0] * JITTER[1])  # the group's D/N: its cells' geometric mean
        assert close(ln.get_ydata(), [law.predict(n, at * n)[0] for n in along])


def test_every_colour_and_style_drawn_is_in_the_legend():
    """A group whose cells are all at the grid's edge keeps its colour's entry (its dashed
    line was a colour the legend never named), and the hollow marker and the dashed law line
    are keyed."""
    law = ladder_style_law()
    ax = hparam_law_figure(law, "N").axes[0]
    legend = ax.get_legend()
    keyed = {to_rgba(h.get_color()) for h in legend.legend_handles}
    for ln in ax.lines:
        assert to_rgba(ln.get_color()) in keyed, f"{ln.get_label()} drawn in an unnamed colour"
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[4:] == ["optimum at the grid's edge (not fitted)", "lr*(N, D) at each D/N"]
    (hollow,) = [h for h in legend.legend_handles if h.get_label() == texts[4]]
    assert to_rgba(hollow.get_markerfacecolor()) == to_rgba("white")


def test_coinciding_optima_at_one_size_are_drawn_side_by_side():
    """Two cells of one size with the same optimum and interval: their markers at distinct N
    (each within a few % of its size), so neither hides the other."""
    ax = hparam_law_figure(ladder_style_law(), "N").axes[0]
    xs = [
        x
        for ln in ax.lines
        if ln.get_linestyle() == "None"
        for x, y in ln.get_xydata()
        if math.isclose(y, COINCIDING)
    ]
    assert len(xs) == 2 and not math.isclose(xs[0], xs[1], rel_tol=1e-3)
    assert all(math.isclose(x, SIZES[0], rel_tol=0.1) for x in xs)


def test_a_grid_of_shared_horizons_stays_grouped_by_d():
    """D values every size shares (a fixed-D grid) are the groups: D/N would split them."""
    cells = [cell(n, d, 5 * n**-0.4 * d**-0.2) for n in SIZES for d in (1e6, 4e6)]
    ax = hparam_law_figure(fit_hparam_law(cells, n_bootstrap=50), "N").axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert texts == ["D=1M", "D=4M", "lr*(N, D) at each D"]


def test_the_tick_labels_along_d_do_not_run_together():
    """Against D the axis spans about a decade and a half: 3x10^4 and 4x10^4 overlapped; the
    labels drawn (a ladder's compact counts) are each clear of the next."""
    fig = hparam_law_figure(ladder_style_law(), "D")
    FigureCanvasAgg(fig)
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    ticks = ax.xaxis.get_major_ticks() + ax.xaxis.get_minor_ticks()
    lo, hi = ax.get_xlim()
    shown = [t.label1 for t in ticks if t.label1.get_text() and lo <= t.get_loc() <= hi]
    boxes = sorted((t.get_window_extent(renderer) for t in shown), key=lambda b: b.x0)
    assert len(boxes) >= 4
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))

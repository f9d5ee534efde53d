"""The per-size optimal LR under early stopping, and widening a grid whose optimum is at an edge."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from drawn import close, marker
from matplotlib.collections import PathCollection
from matplotlib.colors import to_rgba

from trainer_core.analysis import load, lr_sweep_table, optimal_lr, plot_lr_sweep, widen_lrs
from trainer_core.analysis.plots import lr_sweep_figure

LR0 = 1e-2
FACTORS = (0.125, 0.25, 0.5, 1.0, 2.0)
STOPPED_AT = {0.125: 20, 2.0: 40}
"""Where ASHA stopped the trials it judged worst at its rungs; the others ran to the end."""
TOTAL = 100
BATCH = 4096


def lr_star(step: int) -> float:
    """The best LR falls as the run gets longer (4e-3 at its end, 8.9e-3 at step 20)."""
    return 4e-3 * (TOTAL / step) ** 0.5


def loss_at(lr: float, step: int) -> float:
    return 2.6 + 50 / (step + 60) + 0.05 * math.log(lr / lr_star(step)) ** 2


def write_trial(root: Path, lr: float, last_step: int, status: str) -> None:
    name = f"1M-lr{lr:.3e}"
    run = root / "runs" / name
    run.mkdir(parents=True)
    record = {
        "name": name,
        "size": "1M",
        "num_params": 1_000_000,
        "flops_per_token": 6e6,
        "lr": lr,
        "global_batch_tokens": BATCH,
        "seq_len": 128,
        "total_steps": TOTAL,
        "status": status,
        "last_step": last_step,
    }
    (run / "run.json").write_text(json.dumps(record))
    evals = [s for s in (20, 40, 100) if s <= last_step]
    lines = [{"step": s, "tokens": s * BATCH, "eval/loss": loss_at(lr, s)} for s in evals]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


@pytest.fixture
def asha_sweep(tmp_path: Path) -> Path:
    """ASHA stopped the lowest LR at step 20 and the highest at 40; three ran to the end."""
    for factor in FACTORS:
        last = STOPPED_AT.get(factor, TOTAL)
        write_trial(tmp_path, LR0 * factor, last, "finished" if last == TOTAL else "stopped")
    return tmp_path


def test_trials_are_compared_at_the_end_and_stopped_ones_count_as_worse(
    asha_sweep: Path, tmp_path: Path
):
    """Not at step 20, where the stopped trial's last eval is: there the best LR is twice the
    run's own (8.9e-3), and every annealed loss the sweep paid for would be left unread."""
    table = lr_sweep_table(load(asha_sweep)).sort_values("lr")
    assert list(table["last_eval_step"]) == [20, 100, 100, 100, 40]
    assert table["compared_step"].isna().tolist() == [True, False, False, False, True]
    assert list(table["compared_loss"].iloc[[0, 4]]) == [math.inf, math.inf]
    for row in table.iloc[1:4].itertuples(index=False):
        assert row.compared_loss == pytest.approx(loss_at(row.lr, TOTAL))
    best = optimal_lr(table)
    assert best.step == TOTAL and not best.at_edge and best.method == "quadratic"
    assert best.lr == pytest.approx(lr_star(TOTAL), rel=1e-5)
    assert "at step 100" in str(best)
    png = plot_lr_sweep(table, {"1M": best}, tmp_path / "sweep.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_best_trial_beside_stopped_ones_is_bracketed_by_them(asha_sweep: Path):
    """Early stopping judged the LRs beside it worse: the optimum lies between them."""
    table = lr_sweep_table(load(asha_sweep))
    kept = table[table["lr"] >= LR0 * 0.25 - 1e-12].copy()
    kept.loc[np.isclose(kept["lr"], LR0 * 0.25), ["stopped_early", "compared_loss"]] = (
        True,
        math.inf,
    )
    best = optimal_lr(kept)
    assert (best.method, best.at_edge) == ("grid", False)
    assert best.lr == pytest.approx(LR0 * 0.5)
    assert (best.lr_low, best.lr_high) == pytest.approx((LR0 * 0.25, LR0 * 1.0))
    assert widen_lrs(kept) == {}, "bracketed: nothing to widen"


def test_a_trial_that_failed_early_does_not_pull_the_others_back(asha_sweep: Path):
    """A crashed trial (status failed, last eval at step 20) is left out of the comparison; the
    group is still read at the end its finished trials reached."""
    write_trial(asha_sweep, LR0 * 4.0, 20, "failed")
    table = lr_sweep_table(load(asha_sweep)).sort_values("lr")
    assert set(table["compared_step"].dropna()) == {TOTAL}
    failed = table[table["status"] == "failed"]
    assert failed["compared_loss"].isna().all()
    assert optimal_lr(table).lr == pytest.approx(lr_star(TOTAL), rel=1e-5)


def test_the_sweep_plot_shows_the_common_step(asha_sweep: Path):
    """The finished trials at their loss at step 100, the stopped ones hollow at the top and
    labelled with their last step, the optimum starred with its interval."""
    table = lr_sweep_table(load(asha_sweep)).sort_values("lr")
    best = optimal_lr(table)
    ax = lr_sweep_figure(table, {"1M": best}).axes[0]
    assert ax.get_xscale() == "log"
    (curve,) = [ln for ln in ax.lines if ln.get_label() == "1M (at step 100)"]
    done = table.iloc[1:4]
    at_end = np.column_stack([done["lr"], [loss_at(lr, TOTAL) for lr in done["lr"]]])
    assert close(curve.get_xydata(), at_end)
    filled, hollow = (c for c in ax.collections if isinstance(c, PathCollection))
    assert close(filled.get_offsets(), at_end)
    drawn = [loss_at(lr, TOTAL) for lr in done["lr"]]
    top = max(drawn) + 0.05 * (max(drawn) - min(drawn))  # a band above every drawn loss
    assert close(hollow.get_offsets(), [[LR0 * 0.125, top], [LR0 * 2.0, top]])
    assert close(hollow.get_facecolors(), [to_rgba("white")])
    assert [t.get_text() for t in ax.texts] == ["stopped@20", "stopped@40"]
    assert marker(ax, [[best.lr, best.loss]]).get_marker() == "*"
    (bar,) = ax.containers
    assert close(bar[2][0].get_segments(), [[[best.lr_low, best.loss], [best.lr_high, best.loss]]])


def _table(rows: list[tuple[str, float, float, bool]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["size", "lr", "compared_loss", "diverged"])


def test_widen_beyond_the_edge_by_the_grid_step():
    table = _table(
        [
            ("top", 1e-3, 3.0, False),
            ("top", 2e-3, 2.9, False),
            ("top", 4e-3, 2.8, False),
            ("low", 1e-3, 2.7, False),
            ("low", 4e-3, 2.8, False),
            ("low", 1.6e-2, 2.9, False),
            ("mid", 1e-3, 3.0, False),
            ("mid", 2e-3, 2.8, False),
            ("mid", 4e-3, 2.9, False),
        ]
    )
    wanted = widen_lrs(table)
    assert wanted.keys() == {"top", "low"}
    assert wanted["top"] == [pytest.approx(8e-3)]
    assert wanted["low"] == [pytest.approx(2.5e-4)]


def test_widening_stops_below_divergence_and_skips_tried_lrs():
    capped = _table([("s", 1e-3, 3.0, False), ("s", 2e-3, 2.9, False), ("s", 4e-3, math.nan, True)])
    assert widen_lrs(capped) == {}
    # a diverged LR far above brackets the best, as in the optimum, but leaves a gap: one grid
    # step into it (a grid ending in an LR meant to diverge); not for a gap under two steps
    far = _table([("s", 1e-3, 3.0, False), ("s", 2e-3, 2.9, False), ("s", 1.0, math.nan, True)])
    assert widen_lrs(far) == {"s": [pytest.approx(4e-3)]}
    near = _table([("s", 1e-3, 3.0, False), ("s", 2e-3, 2.9, False), ("s", 7e-3, math.nan, True)])
    assert widen_lrs(near) == {}
    tried = _table([("s", 1e-3, 3.0, False), ("s", 2e-3, 2.9, False), ("s", 4e-3, math.nan, False)])
    assert widen_lrs(tried) == {}
    dead = _table([("s", 1e-3, math.nan, True), ("s", 4e-3, math.nan, True)])
    assert widen_lrs(dead) == {"s": [pytest.approx(5e-4)]}
    single = _table([("s", 1e-3, 3.0, False)])
    assert widen_lrs(single) == {"s": [pytest.approx(5e-4), pytest.approx(2e-3)]}


def test_the_widening_judges_a_diverged_lr_as_the_optimum_does():
    """1e-3..4e-3 finished, the best the largest, and 9e-3 diverged: the optimum is bracketed
    (2e-3 .. 9e-3), yet the widening dropped the diverged trial and asked for 8e-3 below it.
    Both now judge it worse: the grid widens where, and only where, the optimum is at_edge."""
    rows = [("s", 1e-3, 3.0, False), ("s", 2e-3, 2.9, False), ("s", 4e-3, 2.8, False)]
    table = _table([*rows, ("s", 9e-3, math.nan, True)]).rename(columns={"compared_loss": "x"})
    best = optimal_lr(table, loss="x")
    assert not best.at_edge and (best.lr_low, best.lr_high) == pytest.approx((2e-3, 9e-3))
    assert widen_lrs(table, loss="x") == {}
    finished = table[~table["diverged"]]
    assert optimal_lr(finished, loss="x").at_edge
    assert widen_lrs(finished, loss="x") == {"s": [pytest.approx(8e-3)]}


def test_a_diverged_lr_above_the_best_brackets_it(tmp_path: Path):
    """LRs x0.25..x1 finished, the best the largest, and x2 diverged: the optimum was 'NOT
    BRACKETED ... widen it' with an open interval (the widening added nothing, stopped below
    the diverged LR) and the size left out of LR*(N). A diverged trial is worse than any
    finished one: the upper bound is its LR."""
    for factor in (0.25, 0.5, 1.0):
        write_trial(tmp_path, lr_star(TOTAL) * factor, TOTAL, "finished")
    write_trial(tmp_path, lr_star(TOTAL) * 2, 30, "diverged")  # its last loss, at step 20, is low
    table = lr_sweep_table(load(tmp_path))
    best = optimal_lr(table)
    assert not best.at_edge and "NOT BRACKETED" not in str(best)
    assert best.lr == pytest.approx(lr_star(TOTAL))
    assert (best.lr_low, best.lr_high) == pytest.approx((lr_star(TOTAL) / 2, lr_star(TOTAL) * 2))
    assert best.n_trials == 4
    assert widen_lrs(table) == {}

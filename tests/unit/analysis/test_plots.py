"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

from pathlib import Path

from synthetic_experiments import (
    SWEEP_N,
    is_png,
)

from trainer_core.analysis import (
    extrapolation_check,
    fit_loss_vs_compute,
    fit_lr_power_law,
    frontier_points,
    load,
    lr_sweep_table,
    optimal_lrs,
    plot_loss_curves,
    plot_loss_vs_compute,
    plot_lr_sweep,
    plot_lr_vs_size,
)


def test_plots_write_pngs(ladder_dir: Path, sweep_dir: Path, tmp_path: Path):
    res = load(ladder_dir)
    pts = res.fit_points()
    law = fit_loss_vs_compute(pts["flops"], pts["eval_loss"], n_bootstrap=0)
    check = extrapolation_check(pts)
    table = lr_sweep_table(load(sweep_dir))
    optima = optimal_lrs(table)
    n = [SWEEP_N[s] for s in optima]
    lrs = [o.lr for o in optima.values()]
    paths = [
        plot_loss_curves(res, tmp_path / "curves.png"),
        plot_loss_vs_compute(
            pts, law, frontier_points(pts), tmp_path / "compute.png", held_out=check
        ),
        plot_lr_sweep(table, optima, tmp_path / "sweep.png"),
        plot_lr_vs_size(n, lrs, fit_lr_power_law(n, lrs), tmp_path / "sub" / "lr_n.png"),
    ]
    assert all(is_png(p) for p in paths)

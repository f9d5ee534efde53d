"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from trainer_core.analysis import (
    LADDER_LR_EXPONENT,
    AnalysisError,
    ChinchillaFit,
    chinchilla_from_points,
    extrapolation_check,
    fit_chinchilla,
    fit_loss_vs_compute,
    fit_lr_power_law,
    fit_sweep_lr,
    frontier_points,
    load,
    lr_sweep_table,
    optimal_lr,
    optimal_lrs,
    plot_loss_curves,
    plot_loss_vs_compute,
    plot_lr_sweep,
    plot_lr_vs_size,
    predict_loss,
)

TRUE = {"E": 1.7, "A": 400.0, "B": 410.0, "alpha": 0.34, "beta": 0.28}
LADDER_N = {
    "s1": 2_000_000,
    "s2": 5_000_000,
    "s3": 12_000_000,
    "s4": 30_000_000,
    "s5": 80_000_000,
    "s6": 200_000_000,
}
BATCH = 65_536
FRACTIONS = (1 / 8, 1 / 4, 1 / 2, 1)
PEAK_LR = 1e-3


def chinchilla_loss(n: float, d: float) -> float:
    return TRUE["E"] + TRUE["A"] / n ** TRUE["alpha"] + TRUE["B"] / d ** TRUE["beta"]


def write_run(
    run_dir: Path,
    *,
    size: str,
    n: int,
    lr: float,
    total_steps: int,
    status: str = "finished",
    last_step: int | None = None,
    diverged_step: int | None = None,
    tags: dict | None = None,
) -> None:
    run_dir.mkdir(parents=True)
    record = {
        "name": run_dir.name,
        "size": size,
        "num_params": n,
        "flops_per_token": 6 * n,
        "lr": lr,
        "global_batch_tokens": BATCH,
        "seq_len": 512,
        "total_steps": total_steps,
        "status": status,
        "diverged_step": diverged_step,
        "last_step": total_steps if last_step is None else last_step,
        "tags": tags or {},
    }
    (run_dir / "run.json").write_text(json.dumps(record))


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_checkpoint(
    run_dir: Path, step: int, ranks: list[int], world: int, metadata: bool = True
) -> Path:
    path = run_dir / "checkpoints" / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x")
    if metadata:
        (path / ".metadata").write_bytes(b"m")
    for r in ranks:
        (path / f".done-rank{r}-of-{world}").write_text('{"files": {}}')  # lists no files
    return path


def make_ladder(root: Path, noise: float = 0.001, sizes: dict[str, int] = LADDER_N) -> Path:
    """Each size trains 80 N tokens; annealed evals at 1/8..1 of the run, plus a pre-decay eval
    at peak LR (0.2 above the curve) that the fits must leave out."""
    k = 0
    for size, n in sizes.items():
        steps = round(80 * n / BATCH)
        run_dir = root / "runs" / size
        write_run(
            run_dir,
            size=size,
            n=n,
            lr=PEAK_LR,
            total_steps=steps,
            tags={"ladder": "syn", "multiple": 4},
        )
        lines = []
        for frac in FRACTIONS:
            step = round(frac * steps)
            loss = chinchilla_loss(n, step * BATCH) * (1 + noise * math.sin(1.7 * k))
            k += 1
            lines.append(
                {
                    "step": step,
                    "tokens": step * BATCH,
                    "train/loss": loss + 0.05,
                    "lr": 0.1 * PEAK_LR,
                }
            )
            lines.append({"step": step, "tokens": step * BATCH, "eval/loss": loss})
            point = {
                "step": step,
                "tokens": step * BATCH,
                "eval/loss": loss,
                "train/loss": loss + 0.05,
                "lr": 0.1 * PEAK_LR,
            }
            (run_dir / f"metrics_step{step}.json").write_text(json.dumps(point))
            write_checkpoint(run_dir, step, [0, 1], 2)
        pre = round(0.4 * steps)
        pre_point = {
            "step": pre,
            "tokens": pre * BATCH,
            "eval/loss": chinchilla_loss(n, pre * BATCH) + 0.2,
            "lr": PEAK_LR,
        }
        (run_dir / f"metrics_step{pre}.json").write_text(json.dumps(pre_point))
        write_jsonl(run_dir / "metrics.jsonl", sorted(lines, key=lambda r: r["step"]))
    return root


SWEEP_N = {"a": 1_000_000, "b": 4_000_000, "c": 16_000_000, "d": 64_000_000}
SWEEP_B = -0.4


def true_lr(n: float) -> float:
    return 0.02 * (n / 1e6) ** SWEEP_B


def make_sweep(root: Path) -> Path:
    """Loss = L0(N) + 0.05 (ln lr - ln lr*)^2 on a factor-2 grid offset from lr*; per size one
    diverged trial at the top LR (with a spuriously low logged loss) and an early-stopped one."""
    (root / "experiment.yaml").write_text("name: sweep\nsweep: {search: grid}\n")
    for size, n in SWEEP_N.items():
        base = 3.0 + 10 / math.log(n)
        for k in range(-3, 4):
            lr = true_lr(n) * 2.0 ** (k + 0.3)
            name = f"{size}-lr{lr:.3e}"
            loss = base + 0.05 * (math.log(lr) - math.log(true_lr(n))) ** 2
            run = {"size": size, "n": n, "lr": lr, "total_steps": 100}
            if k == 3:
                write_run(
                    root / "runs" / name, **run, status="diverged", last_step=40, diverged_step=41
                )
                write_jsonl(
                    root / "runs" / name / "metrics.jsonl",
                    [{"step": 40, "tokens": 40 * BATCH, "eval/loss": 0.5}],
                )
                continue
            stopped = k == -3
            last = 50 if stopped else 100
            status = "stopped" if stopped else "finished"
            write_run(root / "runs" / name, **run, status=status, last_step=last)
            write_jsonl(
                root / "runs" / name / "metrics.jsonl",
                [
                    {
                        "step": 50,
                        "tokens": 50 * BATCH,
                        "train/loss": loss + 0.3,
                        "eval/loss": loss + 0.2,
                    },
                    *(
                        []
                        if stopped
                        else [
                            {
                                "step": 100,
                                "tokens": 100 * BATCH,
                                "train/loss": loss + 0.1,
                                "eval/loss": loss,
                            }
                        ]
                    ),
                ],
            )
    return root


@pytest.fixture(scope="module")
def ladder_dir(tmp_path_factory) -> Path:
    return make_ladder(tmp_path_factory.mktemp("ladder"))


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    return make_sweep(tmp_path_factory.mktemp("sweep"))


# -- loading -------------------------------------------------------------------------------------


def test_load_builds_tidy_frames(ladder_dir: Path):
    res = load(ladder_dir)
    assert list(res.runs["size"]) == list(LADDER_N)
    s1 = res.runs.iloc[0]
    assert s1["num_params"] == 2_000_000 and s1["status"] == "finished"
    assert s1["tag_ladder"] == "syn" and s1["tag_multiple"] == 4
    assert not res.is_lr_sweep

    m = res.metrics[res.metrics["name"] == "s1"]
    # train and eval lines of the same step are merged into one row
    assert len(m) == len(FRACTIONS)
    assert m["train_loss"].notna().all() and m["eval_loss"].notna().all()
    last = m.iloc[-1]
    assert last["flops"] == pytest.approx(6 * 2_000_000 * last["tokens"])
    assert last["eval_loss"] == pytest.approx(chinchilla_loss(2e6, last["tokens"]), rel=2e-3)

    pts = res.points[res.points["name"] == "s1"]
    assert len(pts) == len(FRACTIONS) + 1
    assert pts["annealed"].sum() == len(FRACTIONS)
    fit_pts = res.fit_points()
    assert len(fit_pts) == len(LADDER_N) * len(FRACTIONS)
    assert set(fit_pts.columns) >= {"N", "tokens", "flops", "eval_loss", "size"}


def test_checkpoint_listing_follows_marker_rule(tmp_path: Path):
    root = make_ladder(tmp_path, sizes={"s1": 2_000_000})
    run_dir = root / "runs" / "s1"
    write_checkpoint(run_dir, 7, [0], 2)  # a rank's marker missing
    write_checkpoint(run_dir, 9, [0, 1], 2, metadata=False)  # .metadata missing
    ck = load(root).checkpoints.set_index("step")
    assert not ck.loc[7, "complete"] and not ck.loc[9, "complete"]
    steps = sorted(round(f * round(80 * 2e6 / BATCH)) for f in FRACTIONS)
    assert ck.loc[steps, "complete"].all()
    assert ck.loc[steps[0], "tokens"] == steps[0] * BATCH
    assert ck.loc[steps[0], "metrics_path"] == run_dir / f"metrics_step{steps[0]}.json"
    assert ck.loc[7, "metrics_path"] is None
    assert ck.loc[7, "path"] == run_dir / "checkpoints" / "step-00000007"


def test_load_single_run_dir(ladder_dir: Path):
    res = load(ladder_dir / "runs" / "s2")
    assert list(res.runs["name"]) == ["s2"]
    assert len(res.points) == len(FRACTIONS) + 1


def test_load_errors_name_the_problem(tmp_path: Path):
    with pytest.raises(AnalysisError, match="no such directory"):
        load(tmp_path / "nope")
    (tmp_path / "runs").mkdir()
    with pytest.raises(AnalysisError, match="no run dirs"):
        load(tmp_path)
    (tmp_path / "runs" / "ghost").mkdir()
    with pytest.raises(AnalysisError, match=r"ghost: run dir without run\.json"):
        load(tmp_path)


def test_bad_metrics_line_names_file_and_line(tmp_path: Path):
    write_run(tmp_path / "runs" / "r", size="s", n=1000, lr=1e-3, total_steps=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 3.0}\n{"step": 2, "train/lo\n{"step": 3}\n')
    with pytest.raises(AnalysisError, match=r"metrics\.jsonl:2: not valid JSON"):
        load(tmp_path)
    # A last line cut mid-write (no newline) is a crash artefact: skipped with a warning.
    path.write_text('{"step": 1, "train/loss": 3.0}\n{"step": 2, "train/lo')
    with pytest.warns(UserWarning, match="cut mid-write"):
        res = load(tmp_path)
    assert list(res.metrics["step"]) == [1]


def test_result_grid_needs_a_tune_dir(ladder_dir: Path):
    with pytest.raises(AnalysisError, match="no Tune experiment"):
        load(ladder_dir).result_grid()


@pytest.mark.ray
@pytest.mark.slow
def test_result_grid_reads_tune_storage(ray_session, tmp_path: Path):
    from ray import tune

    def report_x(config):  # local, so Ray pickles it by value (tests aren't importable on workers)
        tune.report({"eval/loss": float(config["x"])})

    root = make_ladder(tmp_path, sizes={"s1": 2_000_000})
    tune.Tuner(
        report_x,
        param_space={"x": tune.grid_search([3, 2])},
        run_config=tune.RunConfig(name="tune", storage_path=str(root), verbose=0),
    ).fit()
    grid = load(root).result_grid()
    assert len(grid) == 2 and grid.get_best_result().metrics["eval/loss"] == 2.0


# -- fits ----------------------------------------------------------------------------------------


def test_chinchilla_fit_recovers_constants(ladder_dir: Path):
    fit = chinchilla_from_points(load(ladder_dir).fit_points(), n_bootstrap=20)
    assert pytest.approx(TRUE["E"], rel=0.02) == fit.E
    assert fit.alpha == pytest.approx(TRUE["alpha"], abs=0.015)
    assert fit.beta == pytest.approx(TRUE["beta"], abs=0.015)
    assert pytest.approx(TRUE["A"], rel=0.15) == fit.A
    assert pytest.approx(TRUE["B"], rel=0.15) == fit.B
    assert fit.n_points == 24 and fit.n_bootstrap == 20
    for name in ("E", "A", "B", "alpha", "beta"):
        lo, hi = fit.ci[name]
        assert lo <= getattr(fit, name) <= hi and fit.std[name] > 0
    text = str(fit)
    assert "L(N, D) = E + A / N^alpha + B / D^beta" in text and text.count("±") == 5


def test_compute_optimal_matches_numeric_minimum():
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0)
    c = 1e21
    n_opt, d_opt = fit.compute_optimal(c)
    assert 6 * n_opt * d_opt == pytest.approx(c)
    grid = np.logspace(7, 12, 20001)
    best = grid[np.argmin(fit.predict(grid, c / (6 * grid)))]
    assert n_opt == pytest.approx(best, rel=2e-3)
    assert fit.optimal_tokens(n_opt) == pytest.approx(d_opt, rel=1e-9)
    assert fit.optimal_params(d_opt) == pytest.approx(n_opt, rel=1e-9)


def test_loss_vs_compute_fit_recovers_power_law():
    c = np.logspace(15, 20, 12)
    loss = (1.7 + 800 * c**-0.15) * (1 + 0.001 * np.sin(1.3 * np.arange(12)))
    fit = fit_loss_vs_compute(c, loss, n_bootstrap=20)
    assert pytest.approx(1.7, rel=0.02) == fit.E
    assert pytest.approx(800, rel=0.1) == fit.A
    assert fit.alpha == pytest.approx(0.15, abs=0.005)
    assert fit.predict(1e18) == pytest.approx(1.7 + 800 * 1e18**-0.15, rel=2e-3)
    assert fit.std["alpha"] > 0 and "±" in str(fit)


def test_fit_input_errors():
    with pytest.raises(AnalysisError, match="fit_chinchilla needs >= 5 points, got 2"):
        fit_chinchilla([1e6, 2e6], [1e8, 2e8], [3.0, 2.9])
    with pytest.raises(AnalysisError, match="differ in length"):
        fit_chinchilla([1e6] * 5, [1e8] * 5, [3.0] * 4)
    with pytest.raises(AnalysisError, match=">= 3 model sizes"):
        fit_chinchilla(
            [1e6, 2e6] * 3, [1e8, 2e8, 3e8, 4e8, 5e8, 6e8], [3.0, 2.9, 2.8, 2.7, 2.6, 2.5]
        )
    with pytest.raises(AnalysisError, match="every value of L must be a positive finite"):
        fit_loss_vs_compute([1e15, 1e16, 1e17], [3.0, float("nan"), 2.0])


def test_extrapolation_to_held_out_size_is_accurate(tmp_path: Path):
    pts = load(make_ladder(tmp_path, noise=0.0)).fit_points()
    check = extrapolation_check(pts)
    assert check.held_out_size == "s6" and check.held_out_N == 200_000_000
    assert check.tokens == pts["tokens"].max()
    assert check.actual == pytest.approx(chinchilla_loss(2e8, check.tokens))
    chinchilla, frontier = check.predictions
    assert chinchilla.law == "L(N, D)" and abs(chinchilla.rel_error) < 1e-3
    # Each size's points lie near its compute-optimal tokens here, so the frontier predicts too.
    assert frontier.law == "frontier L(C)" and abs(frontier.rel_error) < 0.01
    assert len(check.points) == len(FRACTIONS)
    rel = check.points["L(N, D)"] / check.points["actual"] - 1
    assert rel.abs().max() < 1e-3


def test_predict_loss_modes():
    fit = ChinchillaFit(**TRUE, n_points=0, objective=0.0)
    both = predict_loss(fit, N=1e9, D=2e10)
    assert (
        both.loss == pytest.approx(chinchilla_loss(1e9, 2e10))
        and pytest.approx(6 * 1e9 * 2e10) == both.C
    )
    by_c = predict_loss(fit, C=1e21)
    n_opt, d_opt = fit.compute_optimal(1e21)
    assert pytest.approx((n_opt, d_opt)) == (by_c.N, by_c.D)
    assert by_c.loss == pytest.approx(chinchilla_loss(n_opt, d_opt))
    by_n = predict_loss(fit, N=1e9)
    assert pytest.approx(fit.optimal_tokens(1e9)) == by_n.D
    assert pytest.approx(1e10) == predict_loss(fit, N=1e9, C=6e19).D
    law = fit_loss_vs_compute(
        np.logspace(15, 20, 8), 1.7 + 800 * np.logspace(15, 20, 8) ** -0.15, n_bootstrap=0
    )
    assert predict_loss(law, C=1e22).loss == pytest.approx(1.7 + 800 * 1e22**-0.15, rel=1e-3)
    with pytest.raises(AnalysisError, match="compute budget"):
        predict_loss(law, N=1e9)
    flat = ChinchillaFit(**{**TRUE, "alpha": 0.0}, n_points=0, objective=0.0)  # loss flat in N
    assert predict_loss(flat, N=1e9, D=2e10).loss == pytest.approx(
        TRUE["E"] + TRUE["A"] + 410 * 2e10**-0.28
    )
    for at in ({"C": 1e21}, {"N": 1e9}, {"D": 1e10}):
        with pytest.raises(AnalysisError, match="alpha=0: .* no compute-optimal N, D"):
            predict_loss(flat, **at)


# -- LR sweeps -----------------------------------------------------------------------------------


def test_lr_sweep_table(sweep_dir: Path):
    res = load(sweep_dir)
    assert res.is_lr_sweep
    table = lr_sweep_table(res)
    assert len(table) == 7 * len(SWEEP_N)
    a = table[table["size"] == "a"].reset_index(drop=True)
    assert list(a["lr"]) == sorted(a["lr"])
    top, bottom = a.iloc[-1], a.iloc[0]
    assert top["diverged"] and top["diverged_step"] == 41 and top["status"] == "diverged"
    assert bottom["stopped_early"] and bottom["steps_run"] == 50 and not bottom["diverged"]
    mid = a.iloc[3]
    assert mid["steps_run"] == 100 and mid["final_eval_loss"] < mid["best_eval_loss"] + 1e-12
    assert mid["final_eval_loss"] == pytest.approx(mid["best_eval_loss"])
    # Compared at step 50, the last eval the stopped trial reached; the diverged one is left out.
    assert list(a["compared_step"]) == [50] * 7
    assert mid["compared_loss"] == pytest.approx(mid["final_eval_loss"] + 0.2)
    assert math.isnan(top["compared_loss"])


def test_optimal_lr_interior_quadratic_and_diverged_excluded(sweep_dir: Path):
    table = lr_sweep_table(load(sweep_dir))
    optima = optimal_lrs(table)
    assert list(optima) == list(SWEEP_N)
    for size, n in SWEEP_N.items():
        opt = optima[size]
        assert opt.method == "quadratic" and not opt.at_edge
        # the diverged trial's spurious 0.5 loss would otherwise be the minimum
        assert opt.lr == pytest.approx(true_lr(n), rel=1e-6)
        assert opt.step == 50
        assert opt.loss == pytest.approx(3.2 + 10 / math.log(n), rel=1e-6)
        assert opt.lr_low <= opt.lr <= opt.lr_high


def test_optimal_lr_falls_back_to_grid_minimum_on_monotone_table():
    lrs = [1e-4, 2e-4, 4e-4, 8e-4]
    table = pd.DataFrame(
        {
            "size": "x",
            "N": 1e6,
            "lr": lrs,
            "final_eval_loss": [4.0, 3.9, 3.6, 3.1],  # concave: no usable quadratic
            "diverged": False,
        }
    )
    opt = optimal_lr(table, loss="final_eval_loss")
    assert (opt.method, opt.lr, opt.loss, opt.at_edge) == ("grid", 8e-4, 3.1, True)
    # +- half a grid step (in log LR)
    assert opt.lr_low == pytest.approx(8e-4 / math.sqrt(2)) and opt.lr_high == pytest.approx(
        8e-4 * math.sqrt(2)
    )
    with pytest.raises(AnalysisError, match="no non-diverged trial"):
        optimal_lr(table.assign(diverged=True), loss="final_eval_loss")
    # a size whose every trial diverged is left out of the per-size optima
    dead = table.assign(size="y", N=4e6, diverged=True)
    assert list(optimal_lrs(pd.concat([table, dead]), loss="final_eval_loss")) == ["x"]


def test_lr_power_law_recovers_exponent_and_compares_to_ladder_default(sweep_dir: Path):
    n = np.array([1e6, 4e6, 1.6e7, 6.4e7, 2.56e8])
    wiggle = np.exp(0.03 * np.array([1, -1, 1, -1, 1]))
    fit = fit_lr_power_law(n, [true_lr(x) for x in n] * wiggle)
    assert fit.b == pytest.approx(SWEEP_B, abs=0.02)
    assert 0 < fit.b_stderr < 0.02
    assert fit.sigmas_from_reference == pytest.approx((fit.b - LADDER_LR_EXPONENT) / fit.b_stderr)
    assert fit.sigmas_from_reference < -3  # -0.4 is clearly steeper than -1/3 here
    assert "ladder default" in str(fit)
    from trainer_core.ladder import LRFormula

    assert LRFormula().exponent == LADDER_LR_EXPONENT
    swept = fit_sweep_lr(sweep_dir)
    assert swept.b == pytest.approx(SWEEP_B, abs=1e-6)
    assert swept.predict(8e6) == pytest.approx(true_lr(8e6), rel=1e-5)
    with pytest.raises(AnalysisError, match=">= 2 sizes"):
        fit_lr_power_law([1e6, 1e6], [1e-3, 2e-3])


# -- plots and the CLI ---------------------------------------------------------------------------


def _is_png(path: Path) -> bool:
    return (
        path.is_file()
        and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        and path.stat().st_size > 5000
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
    assert all(_is_png(p) for p in paths)


@pytest.mark.slow
def test_analyze_script_on_ladder_from_a_shell_and_on_a_sweep(
    processes, run_script, ladder_dir: Path, sweep_dir: Path, tmp_path: Path
):
    out = tmp_path / "ladder_plots"
    proc = processes.python(
        "workflows/analyze.py",
        str(ladder_dir),
        "--out",
        str(out),
        "--target-params",
        "1e9",
        "--target-flops",
        "1e21",
        "--bootstrap",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "L(N, D) = E + A / N^alpha + B / D^beta" in text
    assert "held out: s6" in text and "compute-optimal at C = 1e+21 FLOPs" in text
    assert "frontier L(C) = E + A * C^-alpha" in text
    assert text.count("prediction:") == 1
    assert _is_png(out / "loss_vs_compute.png") and _is_png(out / "loss_curves.png")

    code, stdout, stderr = run_script(
        "workflows/analyze.py", str(sweep_dir), "--out", str(tmp_path / "sweep_plots")
    )
    assert code == 0, stderr
    assert "LR sweep" in stdout and "lr*(N) =" in stdout and "quadratic" in stdout
    assert _is_png(tmp_path / "sweep_plots" / "lr_vs_size.png")


def test_three_size_ladder_extrapolates_with_the_frontier(tmp_path: Path):
    """Holding out one of three sizes leaves two, too few for L(N, D): the frontier predicts."""
    from io import StringIO

    from rich.console import Console

    from trainer_core.analysis import report_experiment

    three = {k: LADDER_N[k] for k in ("s1", "s2", "s3")}
    text = StringIO()
    report = report_experiment(
        make_ladder(tmp_path, sizes=three), n_bootstrap=0, console=Console(file=text, width=200)
    )
    check = report.extrapolation
    assert report.chinchilla is not None and check.held_out_size == "s3"
    assert [p.law for p in check.predictions] == ["frontier L(C)"]
    assert check.skipped[0][0] == "L(N, D)" and ">= 3 model sizes" in check.skipped[0][1]
    assert "skipped held-out L(N, D): fit_chinchilla needs >= 3 model sizes" in text.getvalue()
    assert abs(check.predictions[0].rel_error) < 0.05


def test_ladder_takes_its_lr_from_a_sweep(sweep_dir: Path, tmp_path: Path):
    from trainer_core.configio import from_dict
    from trainer_core.ladder import LadderConfig, plan_ladder
    from trainer_core.lr_feedback import lr_function

    ladder = from_dict(
        LadderConfig,
        {"dir": str(tmp_path), "lr": {"from_sweep": str(sweep_dir)}, "sizes": ["1M", "3M"]},
    )
    fit = fit_sweep_lr(sweep_dir)
    plans = plan_ladder(ladder, lr_fn=lr_function(ladder.lr))
    for plan in plans:
        assert plan.lr == pytest.approx(fit.predict(plan.num_params))
        assert plan.lr_source == f"sweep {sweep_dir}"
        cfg = plan.config
        assert cfg.optim.lr == pytest.approx(plan.lr)
        assert f"lr_source=sweep {sweep_dir}" in cfg.tracking.tags
    bad = from_dict(LadderConfig, {"lr": {"from_sweep": str(tmp_path / "nope")}})
    from trainer_core.configio import ConfigError

    with pytest.raises(ConfigError, match="lr.from_sweep: .*nope.* can't give an LR fit"):
        lr_function(bad.lr)

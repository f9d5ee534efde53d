"""The Python API called the wrong way: one AnalysisError saying what to pass, not a wrong fit,
a pandas KeyError or an AttributeError deep inside; and a fit printed alone says what the report
says of it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from synthetic_experiments import make_ladder, write_run

from trainer_core.analysis import (
    AnalysisError,
    ChinchillaFit,
    IsoFLOPFit,
    PowerLawFit,
    chinchilla_from_points,
    device_cost,
    extrapolation_check,
    fit_frontier,
    fit_isoflop,
    load,
    lr_sweep_table,
    optimal_lrs,
    report_experiment,
    sweep_laws,
    target_answer,
)
from trainer_core.analysis.checks import fit_flags, format_flags, unresolved
from trainer_core.analysis.synthetic import CHINCHILLA, SyntheticLadder

SYMMETRIC = ChinchillaFit(n_points=8, objective=0.0, E=1.7, A=400.0, B=400.0, alpha=0.3, beta=0.3)
ISOFLOP = IsoFLOPFit(a=0.5, log_k=math.log(0.4), parabolas=[])
FRONTIER = PowerLawFit(n_points=8, objective=0.0, E=1.7, A=1e3, alpha=0.15)


@pytest.mark.parametrize(
    "fit",
    [
        lambda p: chinchilla_from_points(p),
        lambda p: fit_frontier(p, 0),
        lambda p: fit_isoflop(p, 0),
        lambda p: extrapolation_check(p),
    ],
    ids=["chinchilla_from_points", "fit_frontier", "fit_isoflop", "extrapolation_check"],
)
def test_a_fit_refuses_evals_from_before_a_decay(ladder_dir: Path, request, fit):
    """``results.points`` holds the pre-decay evals too (at peak LR, above the curve): a real
    ladder's L(N, D) came out E 0.19, alpha 0.27 on them against E 0.57, alpha 1.23 on
    ``fit_points()``, without a word."""
    res = load(ladder_dir)
    name = request.node.callspec.id
    assert (~res.points["annealed"]).sum() == 6  # one per size
    with pytest.raises(AnalysisError) as caught:
        fit(res.points)
    assert str(caught.value) == (
        f"{name}: 6 of the 30 points are evals before a decay ended (annealed False), above the "
        "curve a fit is of; pass results.fit_points(): the annealed evals; .points holds every eval"
    )


def test_annealed_points_with_their_column_are_fitted(ladder_dir: Path):
    res = load(ladder_dir)
    annealed = chinchilla_from_points(res.points[res.points["annealed"]])
    assert annealed.params() == pytest.approx(
        chinchilla_from_points(res.fit_points()).params(), rel=1e-4
    )


def test_a_fit_names_the_columns_its_points_lack(ladder_dir: Path):
    res = load(ladder_dir)
    with pytest.raises(AnalysisError) as caught:
        chinchilla_from_points(res.runs)
    assert str(caught.value) == (
        "chinchilla_from_points: the points lack column(s) N, tokens, eval_loss (it reads size, "
        "N, tokens, eval_loss); pass results.fit_points()"
    )
    renamed = res.fit_points().rename(columns={"N": "num_params"})
    with pytest.raises(AnalysisError, match=r"^fit_frontier: the points lack column\(s\) N \("):
        fit_frontier(renamed)
    with pytest.raises(
        AnalysisError,
        match=r"^fit_isoflop: points must be a DataFrame \(results.fit_points\(\)\), not "
        "ExperimentResults$",
    ):
        fit_isoflop(res)


def test_a_fit_prints_the_lines_the_report_flags_it_with():
    """print(fit) showed the demo's E = 1.4e-10 with its interval and nothing else, where the
    report says DEGENERATE: E ... is zero in effect."""
    law = replace(SYMMETRIC, E=1e-10, min_loss=2.0, n_bootstrap=3)
    law.ci = {"E": (1e-12, 1.0), "alpha": (0.2, 0.4), "beta": (0.2, 0.4)}
    assert str(law).splitlines()[-2:] == [
        "  DEGENERATE: E = 1e-10 is zero in effect (the irreducible loss was not identified)",
        "  UNRESOLVED: E: 95% CI 1e-12 .. 1 reaches zero: the irreducible loss is not pinned "
        "down by these sizes (a wider range of N, or longer runs, would)",
    ]
    assert "DEGENERATE" not in law.describe(flags=False)
    steep = replace(ISOFLOP, a=1.05)
    assert str(steep).splitlines()[-1] == (
        "  DEGENERATE: a = 1.05: N_opt and D_opt do not both grow with compute"
    )
    assert str(SYMMETRIC) == SYMMETRIC.describe(flags=False)  # nothing to flag


def test_a_fit_keeps_the_smallest_loss_it_was_fitted_to():
    """What E is judged against: the report's own (the points' least loss)."""
    points = SyntheticLadder(n_sizes=4, noise=0.003).points()
    least = float(points["eval_loss"].min())
    assert chinchilla_from_points(points).min_loss == least
    assert fit_frontier(points, 0).min_loss == least


def ladder_from_points(root: Path, points: pd.DataFrame) -> Path:
    """A ladder dir whose annealed checkpoint evals are ``points`` (batch 1: tokens are steps)."""
    for size, g in points.groupby("size"):
        g = g.sort_values("tokens")
        run = root / "runs" / str(size)
        steps = int(g["tokens"].max())
        write_run(run, size=str(size), n=int(g["N"].iloc[0]), lr=1e-3, total_steps=steps, batch=1)
        for row in g.itertuples(index=False):
            step = int(row.tokens)
            point = {"step": step, "tokens": step, "eval/loss": row.eval_loss, "lr": 1e-5}
            (run / f"metrics_step{step}.json").write_text(json.dumps(point))
    return root


def test_the_report_prints_each_flag_line_once(tmp_path: Path):
    """The report prints a fit, then its flags in colour: with the flags in the fit's own text,
    each would be printed twice."""
    flat_in_d = replace(CHINCHILLA, beta=0.03, B=5.0)  # L(N, D) fits E to zero
    points = SyntheticLadder(law=flat_in_d, n_sizes=4, noise=0.003).points()
    root = ladder_from_points(tmp_path, points)
    console = Console(file=StringIO(), soft_wrap=True)
    report = report_experiment(root, n_bootstrap=5, console=console)
    text = console.file.getvalue()
    fits = text[: text.index("target compute")]
    law = report.chinchilla
    least = float(points["eval_loss"].min())
    degenerate, open_params = fit_flags(law, least), unresolved(law, least)
    assert degenerate and report.flags["L(N, D)"] == degenerate
    assert str(law) == "\n".join(
        [law.describe(flags=False), format_flags(degenerate)]
        + ([format_flags(open_params, "UNRESOLVED")] if open_params else [])
    )
    assert str(law) in fits
    for line in str(law).splitlines()[len(law.describe(flags=False).splitlines()) :]:
        assert fits.count(line) == 1, line


def test_sweep_laws_refuses_a_ladder(ladder_dir: Path, sweep_dir: Path, tmp_path: Path):
    """It gave a ladder a sweep's advice: widen the grid (sweep.factors)."""
    ladder = make_ladder(tmp_path, sizes={"s1": 2_000_000, "s2": 5_000_000})
    (ladder / "experiment.yaml").write_text("name: syn\n")
    advice = "give an LR sweep's dir (python workflows/lr_sweep.py writes <dir>-lr-sweep)"
    with pytest.raises(AnalysisError) as caught:
        sweep_laws(ladder)
    assert str(caught.value) == f"sweep_laws: {ladder} is a ladder, not an LR sweep: {advice}"
    with pytest.raises(AnalysisError) as caught:
        sweep_laws(ladder_dir)
    assert str(caught.value) == f"sweep_laws: {ladder_dir} holds no experiment.yaml: {advice}"
    with pytest.raises(AnalysisError, match=r"^sweep_laws: batch_sweep: .* is a ladder, not an"):
        sweep_laws(sweep_dir, batch_sweep=ladder)


def test_optimal_lrs_takes_the_loaded_sweep(sweep_dir: Path):
    """As fit_sweep_lr does; it failed on 'ExperimentResults' object has no attribute
    'groupby'."""
    results = load(sweep_dir)
    assert optimal_lrs(results) == optimal_lrs(lr_sweep_table(results))


def test_target_answer_names_an_argument_of_the_wrong_type():
    """Fits given in the wrong order failed on an attribute the other fit lacks."""
    cost = device_cost("cpu")
    with pytest.raises(AnalysisError) as caught:
        target_answer(6e20, cost, SYMMETRIC, ISOFLOP, FRONTIER)
    assert str(caught.value) == (
        "target_answer: isoflop is a ChinchillaFit, expected IsoFLOPFit or None; the order is "
        "(C, cost, isoflop, chinchilla, frontier, laws): give the fits by name"
    )
    with pytest.raises(AnalysisError, match="^target_answer: frontier is a ChinchillaFit, exp"):
        target_answer(6e20, cost, frontier=SYMMETRIC)
    with pytest.raises(AnalysisError, match="^target_answer: cost is a str, expected DeviceCost;"):
        target_answer(6e20, "H100", ISOFLOP)
    answer = target_answer(np.float32(6e20), cost, ISOFLOP, SYMMETRIC, FRONTIER)
    assert type(answer.C) is float


def test_a_compute_budget_given_as_a_string_is_refused():
    """It passed the check as its number, then failed a format code: "Unknown format code 'g'
    for object of type 'str'"."""
    with pytest.raises(AnalysisError) as caught:
        target_answer("1e21", device_cost("cpu"), ISOFLOP)
    assert str(caught.value) == (
        "target compute C = '1e21': must be a positive finite number, not a string"
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ISOFLOP.compute_optimal(0), "isoFLOP.compute_optimal: C = 0: "),
        (lambda: ISOFLOP.optimal_intervals(-1.0), "isoFLOP.optimal_intervals: C = -1.0: "),
        (lambda: SYMMETRIC.compute_optimal(0), "L(N, D).compute_optimal: C = 0: "),
        (lambda: SYMMETRIC.optimal_tokens(0.0), "L(N, D).optimal_tokens: N = 0.0: "),
        (lambda: SYMMETRIC.predict(0, 1e9), "L(N, D).predict: N = 0: "),
        (lambda: FRONTIER.predict(0), "L(C).predict: C = 0: "),
        (lambda: FRONTIER.predict(math.nan), "L(C).predict: C = nan: "),
    ],
)
def test_a_law_refuses_a_budget_or_size_that_is_not_positive(call, message):
    """They divided by zero (isoFLOP), gave (0.0, 0.0) (L(N, D)) or inf (L(C))."""
    with pytest.raises(AnalysisError) as caught:
        call()
    assert str(caught.value) == message + "must be a positive finite number"


def test_a_law_refuses_an_array_with_a_value_that_is_not_positive():
    with pytest.raises(AnalysisError) as caught:
        SYMMETRIC.compute_optimal(np.array([6e20, 0.0, -1.0]))
    assert str(caught.value) == (
        "L(N, D).compute_optimal: C: every value must be a positive finite number (2 of 3 are not)"
    )
    n_opt, d_opt = SYMMETRIC.compute_optimal(np.array([6e20, 6e22]))
    assert n_opt == pytest.approx([1e10, 1e11], rel=1e-4)
    assert FRONTIER.predict(np.array([1e20, 1e21])).shape == (2,)

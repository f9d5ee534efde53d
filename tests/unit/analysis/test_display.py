"""Results in a notebook: each shows as the text ``print`` gives, and the target answer comes
as numbers too."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainer_core.analysis import ChinchillaFit, device_cost, load, target_answer
from trainer_core.analysis.target import REFUSED, TargetAnswer, TargetColumn


class Printer:
    """What IPython hands ``_repr_pretty_``: the text it is given is what the cell shows."""

    def __init__(self):
        self.shown = ""

    def text(self, s: str) -> None:
        self.shown += s


def shown(obj) -> str:
    printer = Printer()
    obj._repr_pretty_(printer, cycle=False)
    return printer.shown


def test_a_fit_shows_its_parameters_and_flags_not_its_fields():
    """Displayed, a fit was its dataclass repr: std and ci dicts, and no word that E = 1e-10 is
    zero in effect."""
    fit = ChinchillaFit(
        n_points=8, objective=0.0, E=1e-10, A=400.0, B=400.0, alpha=0.3, beta=0.3, min_loss=2.0
    )
    assert shown(fit) == str(fit)
    assert "DEGENERATE" in shown(fit) and "std=" not in shown(fit)


def test_results_show_their_runs_evals_and_where_to_look(ladder_dir: Path):
    res = load(ladder_dir)
    lines = shown(res).splitlines()
    assert lines[0] == (f"ladder {res.path}: 6 runs (6 finished); sizes s1, s2, s3, s4, s5, s6")
    annealed = int(res.points["annealed"].sum())
    assert lines[1].startswith(
        f"{len(res.metrics)} metrics lines, {len(res.points)} checkpoint evals "
        f"({annealed} annealed), "
    )
    assert lines[2].startswith("frames: .runs .metrics")


def test_the_target_answer_as_a_frame_holds_each_value_and_its_interval():
    law = ChinchillaFit(
        n_points=8,
        objective=0.0,
        E=1.7,
        A=400.0,
        B=400.0,
        alpha=0.3,
        beta=0.3,
        ci={"a": (0.45, 0.55), "b": (0.45, 0.55)},
    )
    answer = target_answer(6e20, device_cost("cpu"), chinchilla=law)
    frame = answer.to_frame()
    row = frame.loc["approach 3 (L(N, D))"]
    # with A = B and alpha = beta, N* = D* = sqrt(C / 6)
    assert row["N"] == pytest.approx(1e10, rel=1e-4) and row["D"] == pytest.approx(1e10, rel=1e-4)
    assert row["flops"] == pytest.approx(6e20, rel=1e-4)
    assert math.isnan(row["lr"]) and row["lr_note"] == ""
    assert shown(answer) == str(answer)

    refused = TargetAnswer(
        C=1.0,
        columns=[TargetColumn("approach 2", N=(2.0, 1.0, 3.0), lr=REFUSED)],
        cost=device_cost("cpu"),
    )
    row = refused.to_frame().loc["approach 2"]
    assert (row["N"], row["N_lo"], row["N_hi"]) == (2.0, 1.0, 3.0)
    assert math.isnan(row["lr"]) and row["lr_note"] == REFUSED
    assert math.isnan(row["device_hours"])

"""The target table's LR* and B* are the ladder plan's: the same laws (cells, seed,
``batch.sweep_law``) read at each column's N_opt, D_opt; the plan's refusal where it refuses; the
laws' MISFIT lines in the footer; the sweep report names the ``batch.sweep_law`` it fits."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from synthetic_hparams import make_hparam_sweep

from trainer_core.analysis import (
    TargetSettings,
    device_cost,
    fit_hparam_laws,
    hparam_table,
    load,
    report_experiment,
    sweep_laws,
    target_answer,
)
from trainer_core.analysis.fits import ChinchillaFit
from trainer_core.analysis.synthetic_sweep import STEP_LAW_LR, PlantedLaw
from trainer_core.analysis.target import REFUSED, TargetColumn
from trainer_core.config.loader import ConfigError, from_dict
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.lr_feedback import SweepRules, sweep_rules
from trainer_core.ladder.plan import plan_ladder

SIZES = ["1M", "3M", "5M"]
B_OF_N = PlantedLaw(60.0, -0.3, 0.6)
"""B* = 60 N^-0.3 D^0.6: moves with N, so B*(D) misfits and B*(N, D) resolves."""
TWENTY_TOKENS = ChinchillaFit(
    n_points=8, objective=0.0, E=1.7, A=400.0 * 0.05**0.3, B=400.0, alpha=0.3, beta=0.3
)
"""Its compute-optimal runs take 20 tokens a parameter, as the sweep's cells do."""
C = 6 * 3e6 * 6e7


def ladder_sizes() -> dict[str, int]:
    return {p.size: p.num_params for p in plan_ladder(from_dict(LadderConfig, {}), SIZES)}


def plan(sweep: Path, batch_law: str = "D") -> SweepRules:
    """The laws a ladder fed from ``sweep`` plans with."""
    fed = {"from_sweep": str(sweep)}
    return sweep_rules(
        from_dict(LadderConfig, {"lr": fed, "batch": {**fed, "sweep_law": batch_law}})
    )


def column(laws) -> TargetColumn:
    (col,) = target_answer(C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=laws).columns
    return col


@pytest.fixture(scope="module")
def b_of_n_sweep(tmp_path_factory) -> Path:
    """A sweep of LR and batch whose record names batch.sweep_law "N,D"."""
    sweep = make_hparam_sweep(tmp_path_factory.mktemp("b_of_n"), ladder_sizes(), batch_law=B_OF_N)
    (sweep / "experiment.yaml").write_text(
        "name: hparams\nbatch: {sweep_law: 'N,D'}\nsweep: {search: grid}\n"
    )
    return sweep


@pytest.mark.parametrize("batch_law", ["D", "N,D"])
def test_the_target_gives_the_plans_lr_and_batch_by_the_ladders_sweep_law(
    b_of_n_sweep, tmp_path, batch_law
):
    """The ladder's recorded batch.sweep_law rules, over the sweep's own ("N,D" here)."""
    ladder = tmp_path / "ladder"
    ladder.mkdir()
    (ladder / "experiment.yaml").write_text(
        f"lr: {{from_sweep: {b_of_n_sweep}}}\n"
        f"batch: {{from_sweep: {b_of_n_sweep}, sweep_law: '{batch_law}'}}\n"
    )
    _, sweep, law = TargetSettings().resolve(ladder)
    col = column(sweep_laws(sweep, law))
    rules = plan(b_of_n_sweep, batch_law)
    N, D = col.N[0], col.D[0]
    for got, want in ((col.lr, rules.lr(N, D)), (col.batch, rules.batch(N, D))):
        assert got == (want.value, want.low, want.high)


def test_a_plain_sweep_dir_fits_b_by_its_own_recorded_sweep_law(b_of_n_sweep):
    batch = plan(b_of_n_sweep, "N,D").batch(3e6, 6e7)
    assert column(sweep_laws(b_of_n_sweep)).batch == (batch.value, batch.low, batch.high)
    assert B_OF_N(3e6, 6e7) == pytest.approx(batch.value, rel=0.1)


def test_the_sweep_report_fits_b_by_the_sweeps_recorded_sweep_law(b_of_n_sweep):
    console = Console(file=StringIO(), width=200, markup=False, soft_wrap=True)
    report_experiment(b_of_n_sweep, n_bootstrap=5, console=console)
    law = plan(b_of_n_sweep, "N,D").batch_law
    assert f"batch.from_sweep (batch.sweep_law: N,D): {law}\n" in console.file.getvalue()


def test_a_misfit_law_says_so_in_the_target_footer(b_of_n_sweep):
    """B*(D) through cells whose B* moves with N: the plan takes it, the table flags it."""
    law = plan(b_of_n_sweep, "D").batch_law
    (misfit,) = [line.strip() for line in str(law).splitlines() if "MISFIT" in line]
    answer = target_answer(
        C,
        device_cost("cpu"),
        chinchilla=TWENTY_TOKENS,
        laws=sweep_laws(b_of_n_sweep, "D"),
    )
    assert f"B*(D): {misfit}" in answer.footer()
    assert misfit.startswith("MISFIT: the cells stray")


def test_fit_hparam_laws_gives_the_plans_laws(b_of_n_sweep):
    """One seed for LR* and B*, cells and law, as the plan fits them."""
    laws = fit_hparam_laws(hparam_table(load(b_of_n_sweep)))
    rules = plan(b_of_n_sweep, "D")
    for fitted, planned in ((laws.lr, rules.lr_law), (laws.batch, rules.batch_law)):
        assert (fitted.formula, fitted.ci) == (planned.formula, planned.ci)


def test_a_law_the_plan_refuses_shows_its_refusal_not_numbers(tmp_path):
    """LR* planted flat in D under noise: D's exponent spans zero, lr.from_sweep refuses."""
    flat = PlantedLaw(STEP_LAW_LR.c, STEP_LAW_LR.a, 0.0)
    sweep = make_hparam_sweep(tmp_path / "flat", ladder_sizes(), flat, noise=0.02)
    with pytest.raises(ConfigError) as refused:
        sweep_rules(from_dict(LadderConfig, {"lr": {"from_sweep": str(sweep)}}))
    answer = target_answer(C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=sweep_laws(sweep))
    assert dict(answer.rows())["lr*"] == [REFUSED]
    assert f"lr*: a ladder's plan stops here: {refused.value}" in answer.footer()

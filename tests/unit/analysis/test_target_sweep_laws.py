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
from trainer_core.analysis.target import REFUSED, LawSources, TargetColumn
from trainer_core.config.loader import ConfigError, from_dict, to_yaml
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.lr_feedback import SweepRules, sweep_rules
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ray.ladder_run import LadderJobConfig

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


def recorded_ladder(root: Path, **sections: dict) -> Path:
    """A ladder dir whose experiment.yaml is written as a real ladder's is (every default
    recorded: batch.sweep_law 'D' where the config sets none)."""
    config = from_dict(LadderJobConfig, {"dir": str(root), **sections})
    root.mkdir()
    (root / "experiment.yaml").write_text(to_yaml(config))
    return root


def report_text(sweep: Path) -> str:
    console = Console(file=StringIO(), width=200, markup=False, soft_wrap=True)
    report_experiment(sweep, n_bootstrap=5, console=console)
    return console.file.getvalue()


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
    _, sweeps = TargetSettings().resolve(ladder)
    col = column(sweep_laws(sweeps.lr, sweeps.batch_law, batch_sweep=sweeps.batch))
    rules = plan(b_of_n_sweep, batch_law)
    N, D = col.N[0], col.D[0]
    for got, want in ((col.lr, rules.lr(N, D)), (col.batch, rules.batch(N, D))):
        assert got == (want.value, want.low, want.high)


def test_a_plain_sweep_dir_fits_b_by_its_own_recorded_sweep_law(b_of_n_sweep):
    batch = plan(b_of_n_sweep, "N,D").batch(3e6, 6e7)
    assert column(sweep_laws(b_of_n_sweep)).batch == (batch.value, batch.low, batch.high)
    assert B_OF_N(3e6, 6e7) == pytest.approx(batch.value, rel=0.1)


def test_the_sweep_report_fits_b_by_the_sweeps_recorded_sweep_law(b_of_n_sweep):
    """The report prints the laws sweep_laws gives the target table: the plan's."""
    rules, text = plan(b_of_n_sweep, "N,D"), report_text(b_of_n_sweep)
    assert f"batch.from_sweep (batch.sweep_law: N,D): {rules.batch_law}\n" in text
    assert f"lr.from_sweep: each size at its run's final D: {rules.lr_law}\n" in text
    laws = sweep_laws(b_of_n_sweep)
    assert (str(laws.rules.lr_law), str(laws.rules.batch_law), laws.batch_law) == (
        str(rules.lr_law),
        str(rules.batch_law),
        "N,D",
    )


@pytest.mark.parametrize("batch_from", ["", "other", "this"])
def test_the_target_fits_b_by_the_ladders_sweep_law_only_from_its_own_batch_sweep(
    b_of_n_sweep, tmp_path, batch_from
):
    """A ladder records batch.sweep_law 'D' whether or not it takes its batch from a sweep: it
    rules only where its batch.from_sweep is the sweep read (it took B*(D) from it); else the
    sweep's own "N,D" does, as in the sweep's report."""
    batch = {"from_sweep": str(b_of_n_sweep if batch_from == "this" else tmp_path / "other")}
    ladder = recorded_ladder(
        tmp_path / "ladder",
        lr={"from_sweep": str(tmp_path / "other")},
        batch={**batch, "sweep_law": "D"} if batch_from else {},
    )
    _, sweeps = TargetSettings(hparam_sweep=str(b_of_n_sweep)).resolve(ladder)
    want = "D" if batch_from == "this" else "N,D"
    laws = sweep_laws(sweeps.lr, sweeps.batch_law, batch_sweep=sweeps.batch)
    answer = target_answer(C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=laws)
    (col,) = answer.columns
    planned = plan(b_of_n_sweep, want).batch(col.N[0], col.D[0])
    assert col.batch == (planned.value, planned.low, planned.high)
    assert f"batch.from_sweep with batch.sweep_law: {want};" in answer.footer()[1]


def test_a_ladder_fed_its_lr_alone_fits_b_by_the_sweeps_own_law(b_of_n_sweep, tmp_path):
    """A ladder with only lr.from_sweep: its target table's B* is the sweep report's B*(N, D)."""
    ladder = recorded_ladder(tmp_path / "ladder", lr={"from_sweep": str(b_of_n_sweep)})
    assert "sweep_law: D" in (ladder / "experiment.yaml").read_text()
    _, sweeps = TargetSettings().resolve(ladder)
    assert sweeps == LawSources(str(b_of_n_sweep), str(b_of_n_sweep), "")
    assert sweep_laws(sweeps.lr, sweeps.batch_law, batch_sweep=sweeps.batch).batch_law == "N,D"


def test_lr_and_batch_from_two_sweeps_each_come_from_its_own(b_of_n_sweep, tmp_path):
    """lr.from_sweep A, batch.from_sweep B: the table read both from A (B* of another sweep
    than the plan's), and its footer named A alone."""
    lr_only = make_hparam_sweep(tmp_path / "lr_only", ladder_sizes(), batch_factors=(1,))
    ladder = recorded_ladder(
        tmp_path / "ladder",
        lr={"from_sweep": str(lr_only)},
        batch={"from_sweep": str(b_of_n_sweep), "sweep_law": "N,D"},
    )
    _, sweeps = TargetSettings().resolve(ladder)
    assert sweeps == LawSources(str(lr_only), str(b_of_n_sweep), "N,D")
    laws = sweep_laws(sweeps.lr, sweeps.batch_law, batch_sweep=sweeps.batch)
    answer = target_answer(C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=laws)
    (col,) = answer.columns
    N, D = col.N[0], col.D[0]
    fed = from_dict(
        LadderConfig,
        {
            "lr": {"from_sweep": str(lr_only)},
            "batch": {"from_sweep": str(b_of_n_sweep), "sweep_law": "N,D"},
        },
    )
    rules = sweep_rules(fed)
    for got, want in ((col.lr, rules.lr(N, D)), (col.batch, rules.batch(N, D))):
        assert got == (want.value, want.low, want.high)
    assert answer.footer()[1].startswith(
        f"lr*: the law of {lr_only} (lr.from_sweep), B*: the law of {b_of_n_sweep} "
        "(batch.from_sweep with batch.sweep_law: N,D); each read at each column's N_opt, D_opt"
    )


@pytest.fixture(scope="module")
def lr_refused_sweep(tmp_path_factory) -> Path:
    """LR* planted flat in D under noise, one batch: lr.from_sweep refuses, no B* to fit."""
    flat = PlantedLaw(STEP_LAW_LR.c, STEP_LAW_LR.a, 0.0)
    root = tmp_path_factory.mktemp("lr_refused") / "sweep"
    return make_hparam_sweep(root, ladder_sizes(), flat, noise=0.02, batch_factors=(1,))


def test_every_law_refused_the_footer_claims_no_law_read(lr_refused_sweep):
    """No column got an LR* or B*: the footer says so (it said the laws were read there, with
    batch.sweep_law: D) and the refusal below says why."""
    laws = sweep_laws(lr_refused_sweep)
    assert list(laws.refused) == ["lr"] and laws.rules.batch_law is None
    answer = target_answer(
        C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=laws, hparam_source="S"
    )
    assert dict(answer.rows())["lr*"] == [REFUSED]
    assert answer.footer()[1:] == [
        "lr*, B*: no law of S that a ladder's plan takes (why: the lines below)",
        f"lr*: a ladder's plan stops here: {laws.refused['lr']}",
    ]


def test_an_lr_law_alone_names_no_batch_sweep_law(tmp_path):
    """A one-horizon LR-only sweep: LR*(N) read, no B* law, so no batch.sweep_law named."""
    sweep = make_hparam_sweep(tmp_path / "one", ladder_sizes(), ratios=(40.0,), batch_factors=(1,))
    answer = target_answer(
        C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=sweep_laws(sweep), hparam_source="S"
    )
    assert answer.footer()[1] == (
        "lr*: the laws of S, read at each column's N_opt, D_opt, as a ladder's plan fits them "
        "(lr.from_sweep; their intervals: the laws' bootstrap there; N_opt's own spread not "
        "carried)"
    )


def test_the_sweep_report_and_the_target_give_one_refusal_line(lr_refused_sweep):
    """One code path: the sweep report's line stopping the plan is the target footer's."""
    laws = sweep_laws(lr_refused_sweep)
    footer = target_answer(C, device_cost("cpu"), chinchilla=TWENTY_TOKENS, laws=laws).footer()
    (line,) = [ln for ln in footer if "stops here" in ln]
    assert f"\n{line}\n" in report_text(lr_refused_sweep)


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
    # named by the dir its laws came from (the README's call passes no hparam_source: "the sweep")
    assert f"the laws of {b_of_n_sweep}" in "\n".join(answer.footer())


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

"""The dry run's tables and the notes under them (:mod:`trainer_core.ladder.plan_notes`)."""

from __future__ import annotations

import pytest

from trainer_core.config.loader import from_dict, load_config
from trainer_core.ladder.config import LadderConfig
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ladder.plan_notes import (
    PLAN_TABLES,
    _fmt,
    plan_notes,
    print_plan,
    vocabulary_warning,
)


def gpu_plans(repo_root, *overrides: str):
    from trainer_core.ray.ladder_run import LadderJobConfig

    job = load_config(
        LadderJobConfig, repo_root / "workflows" / "configs" / "ladder-gpu.yaml", list(overrides)
    )
    return job, plan_ladder(job)


def test_the_tables_print_every_column_within_100_characters_and_a_total(repo_root, capsys):
    """One table of 22 columns was 370 characters wide and had no total; each table is narrow
    now, every column of the plan's row is in one, and the cost table sums FLOPs and hours."""
    job, plans = gpu_plans(repo_root)
    rows = [p.table_row(job) for p in plans]
    shown = {key for keys in PLAN_TABLES.values() for key in keys}
    assert set(rows[0]) - {"size"} <= shown
    print_plan(job, plans)
    out = capsys.readouterr().out
    assert max(len(line.rstrip()) for line in out.splitlines() if "│" in line) <= 100
    total = next(line for line in out.splitlines() if line.startswith("│ total"))
    flops, hours = sum(r["FLOPs"] for r in rows), sum(r["device-h"] for r in rows)
    assert total.split("│")[2:4] == [f" {_fmt(flops):>7} ", f" {_fmt(hours):>8} "]
    assert hours == pytest.approx(1050, rel=0.01)  # shown as 1,050, not 1.05e+03
    for header in ("beta2", "warmup steps", "wall h", "layers/d/heads/kv/mlp"):
        assert f" {header} ┃" in out


def test_the_notes_say_what_the_cost_and_memory_columns_assume(repo_root):
    """device-h assumed an MFU and a peak FLOP/s the output never named, and headroom was
    against the usable memory (memory_fraction of the device's) without saying so."""
    job, plans = gpu_plans(repo_root, "--assumed_mfu=0.5", "--memory_fraction=0.9")
    cost, memory = plan_notes(job, plans)[:2]
    assert cost == (
        "cost: device-h = FLOPs / (989 TFLOP/s, H100's dense bf16 peak, x assumed_mfu 0.5); "
        "wall h = device-h / devices"
    )
    assert memory == (
        "memory: mem GiB is the estimate per device, headroom what it leaves of the usable "
        "72.0 GiB (memory_fraction 0.9 x 80 GiB)"
    )


@pytest.mark.parametrize(
    "value, text",
    [
        (21_149.3, "21,100"),
        (1_049.6, "1,050"),
        (667.2, "667"),
        (5.891, "5.89"),
        (4.0, "4"),
        (0.00491, "0.00491"),
        (9.5e20, "9.5e20"),
        (1_234_567.0, "1.23e6"),
        (4.2e-5, "4.2e-5"),
        (102_347_833_344, "102,347,833,344"),
    ],
)
def test_numbers_print_one_way(value, text):
    """A 7B's device-hours printed as 2.11e+04 beside 667 and 9.5e+20."""
    assert _fmt(value) == text


def test_a_size_whose_n_is_mostly_the_lm_head_is_warned_of():
    """15K with a 100,352-entry vocabulary planned silently: 99.4% of its N is the head."""
    ladder = from_dict(LadderConfig, {"sizes": ["15K", "1M"], "vocab_size": 100352})
    small, _ = plans = plan_ladder(ladder)
    assert vocabulary_warning("15K", small) == [
        "warning: 15K: the LM head (vocab_size 100,352 x d_model 24) is 99.4% of its N "
        "(2,408,448 of 2,422,440): its point measures the head, not the blocks, and bends a "
        "law fitted in N (drop the size, or use a smaller vocab_size)"
    ]
    warned = [line for line in plan_notes(ladder, plans) if "the LM head" in line]
    assert [line.split(":")[1] for line in warned] == [" 15K", " 1M"]
    demo = from_dict(LadderConfig, {"sizes": ["15K", "1M"]})  # vocab 320: 35% at 15K
    assert not [line for line in plan_notes(demo, plan_ladder(demo)) if "LM head" in line]


def test_beta2_steps_between_neighbouring_sizes_and_its_source_is_named(repo_root):
    """The rule was credited to OLMo-core's ladder with no date (its ladder ran 0.95 at every
    size before allenai/OLMo-core#543), and nothing said it jumps within a ladder."""
    from trainer_core.ladder.formulas import Beta2Formula

    job, plans = gpu_plans(repo_root)
    assert [p.table_row(job)["beta2"] for p in plans] == [0.99, 0.95, 0.95, 0.95, 0.95]
    doc = " ".join(Beta2Formula.__doc__.split())
    assert "allenai/OLMo-core#543" in doc and "Porian et al. 2024" in doc
    assert "jumps between the two neighbouring sizes" in doc

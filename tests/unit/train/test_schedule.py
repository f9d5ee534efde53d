"""LR schedules: values pinned by hand at the key steps, cycles, validation, checkpointing, plots.

Convention under test: the multiplier for update ``s`` (0-based) is the schedule after ``s + 1``
updates, so a 10-step warmup gives 0.1 at step 0 and 1.0 at step 9; a decay of D updates takes
them at progress 1/(D+1) .. D/(D+1), so a cycle ending at step E has its lowest LR at step E - 1,
still above the floor (no update is spent at LR 0), and starts the next cycle at step E.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ScheduleConfig
from trainer_core.train.schedule import (
    annealed_steps,
    build_scheduler,
    cycle_boundaries,
    decay_windows,
    lr_multiplier,
    plot_schedule,
    schedule_figure,
    short_decays,
    wsds_schedule,
)

TOTAL = 100


def lr(step: int, **kw) -> float:
    return lr_multiplier(step, TOTAL, ScheduleConfig(**kw))


def ends(**kw) -> list[int]:
    return cycle_boundaries(TOTAL, ScheduleConfig(kind="wsd", warmup=0, **kw))


# warmup 9, decay = the other 91 updates (9..99) at t = k/92: step 54 is 46/92 = halfway.
@pytest.mark.parametrize(
    "kind, first_decay, mid_decay, last_decay",
    [
        (
            "cosine",
            0.1 + 0.45 * (1 + math.cos(math.pi / 92)),
            0.55,
            0.1 + 0.45 * (1 + math.cos(math.pi * 91 / 92)),
        ),
        ("linear", 1 - 0.9 / 92, 0.55, 0.1 + 0.9 / 92),  # 1 - 0.9 t
        # (1 + 99 t) ** -0.5, 100 ** -0.5 = 0.1 at t = 1
        ("inv_sqrt", (1 + 99 / 92) ** -0.5, 50.5**-0.5, (1 + 99 * 91 / 92) ** -0.5),
        ("inv", 1 / (1 + 9 / 92), 1 / 5.5, 1 / (1 + 9 * 91 / 92)),  # 1 / (1 + 9 t)
    ],
)
def test_decaying_kinds_pin_key_steps(kind, first_decay, mid_decay, last_decay):
    kw = {"kind": kind, "warmup": 9, "min_lr_ratio": 0.1}
    assert lr(0, **kw) == pytest.approx(1 / 9)  # the first update is not wasted
    assert lr(4, **kw) == pytest.approx(5 / 9)
    assert lr(8, **kw) == pytest.approx(1.0)  # warmup done
    assert lr(9, **kw) == pytest.approx(first_decay)  # no stable phase by default
    assert lr(54, **kw) == pytest.approx(mid_decay)
    assert lr(99, **kw) == pytest.approx(last_decay)  # the last update: just above the floor
    assert lr(99, **kw) > 0.1
    assert lr(500, **kw) == pytest.approx(last_decay)  # past the end: clamped
    assert decay_windows(TOTAL, ScheduleConfig(**kw)) == [(9, 100)]


def test_warmup_fraction_and_explicit_decay_leave_a_stable_phase():
    kw = {"kind": "linear", "warmup": 0.05, "decay": 0.4, "min_lr_ratio": 0.0}
    assert lr(0, **kw) == pytest.approx(0.2)  # 5 warmup steps
    assert lr(30, **kw) == 1.0
    assert lr(59, **kw) == 1.0  # decay covers updates 60..99 at t = k/41
    assert lr(79, **kw) == pytest.approx(21 / 41)
    assert lr(99, **kw) == pytest.approx(1 / 41)  # the last update still moves the weights


@pytest.mark.parametrize(
    "kind, mid",
    [
        # the k of a 0.1 floor, the curve lowered linearly from [0.1, 1] onto [0, 1]
        ("inv", 1 / 11),  # (1 / (1 + 9 * 0.5) - 0.1) / 0.9
        ("inv_sqrt", (50.5**-0.5 - 0.1) / 0.9),  # k = 0.1 ** -2 - 1 = 99
    ],
)
def test_inv_kinds_with_zero_floor_end_near_zero_and_fall_monotonically(kind, mid):
    kw = {"kind": kind, "warmup": 9, "min_lr_ratio": 0.0}
    assert lr(54, **kw) == pytest.approx(mid)  # halfway: 46 of 92
    assert 0 < lr(99, **kw) < 0.01
    values = [lr(s, **kw) for s in range(8, TOTAL)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))


def test_constant_ignores_min_lr_and_rewarms_from_peak():
    kw = {"kind": "constant", "warmup": 10, "min_lr_ratio": 0.1}
    assert lr(0, **kw) == pytest.approx(0.1)
    assert lr(9, **kw) == 1.0
    assert lr(99, **kw) == 1.0
    # its cycles end at peak, so a rewarmup has nothing to climb
    assert lr(50, cycles=2, rewarmup=5, **kw) == 1.0
    assert decay_windows(TOTAL, ScheduleConfig(cycles=2, **kw)) == [(50, 50), (100, 100)]


def test_wsd_default_decays_the_last_fifth():
    kw = {"kind": "wsd", "warmup": 0.1, "min_lr_ratio": 0.0}
    assert lr(0, **kw) == pytest.approx(0.1)
    assert lr(9, **kw) == 1.0
    assert lr(50, **kw) == 1.0  # mid stable
    assert lr(79, **kw) == 1.0  # last stable update
    assert lr(80, **kw) == pytest.approx(20 / 21)  # 20 decay updates at t = k/21
    assert lr(89, **kw) == pytest.approx(11 / 21)
    assert lr(99, **kw) == pytest.approx(1 / 21)
    assert decay_windows(TOTAL, ScheduleConfig(**kw)) == [(80, 100)]


def test_cycle_boundary_without_rewarmup_jumps_back_to_peak():
    kw = {"kind": "wsd", "warmup": 10, "decay": 0.1, "min_lr_ratio": 0.1, "cycles": 2}
    assert decay_windows(TOTAL, ScheduleConfig(**kw)) == [(45, 50), (95, 100)]
    assert lr(44, **kw) == 1.0
    assert lr(47, **kw) == pytest.approx(0.55)  # 1 - 0.9 * 3/6
    assert lr(49, **kw) == pytest.approx(0.25)  # right before the boundary: 1 - 0.9 * 5/6
    assert lr(50, **kw) == 1.0  # right after it
    assert lr(99, **kw) == pytest.approx(0.25)


@pytest.mark.parametrize("rewarmup", [5, 0.1])  # 0.1 of the 50-step cycle = 5 steps
def test_cycle_boundary_with_rewarmup_climbs_from_the_floor(rewarmup):
    kw = {"kind": "wsd", "warmup": 10, "decay": 0.1, "min_lr_ratio": 0.1, "cycles": 2}
    kw["rewarmup"] = rewarmup
    assert lr(49, **kw) == pytest.approx(0.25)
    assert lr(50, **kw) == pytest.approx(0.28)  # 0.1 + 0.9 * 1/5
    assert lr(52, **kw) == pytest.approx(0.64)  # 0.1 + 0.9 * 3/5
    assert lr(54, **kw) == 1.0
    assert lr(94, **kw) == 1.0
    assert lr(99, **kw) == pytest.approx(0.25)


def test_cycles_as_a_list_of_ends():
    kw = {"kind": "linear", "warmup": 0, "min_lr_ratio": 0.0, "cycles": [30, 60]}
    assert ends(cycles=[30, 60]) == [30, 60, 100]
    assert ends(cycles=[30, 60, 100]) == [30, 60, 100]
    assert lr(0, **kw) == pytest.approx(30 / 31)  # no warmup: decays from the first update
    assert lr(14, **kw) == pytest.approx(16 / 31)
    assert lr(29, **kw) == pytest.approx(1 / 31)
    assert lr(30, **kw) == pytest.approx(30 / 31)
    assert lr(79, **kw) == pytest.approx(21 / 41)  # third cycle: 20 of 40 updates
    assert lr(99, **kw) == pytest.approx(1 / 41)


def test_cycles_as_a_count_and_as_lengths():
    assert ends(cycles=2) == [50, 100]
    assert ends(cycles=3) == [33, 66, 100]  # the last cycle absorbs the remainder
    assert ends(cycle_length=25) == [25, 50, 75, 100]
    assert ends(cycle_length=30) == [30, 60, 100]  # 100 // 30 cycles, the last one 40 steps
    assert ends(cycle_length=25.0) == [25, 50, 75, 100]
    assert ends(cycle_length=0.5) == [50, 100]
    assert ends(cycle_length=0.3) == [30, 60, 100]
    assert ends(cycle_length=[20, 30]) == [20, 100]  # the last length stretches to the end
    assert ends(cycle_length=[20, 30, 50]) == [20, 50, 100]


def test_cycle_length_cosine_values():
    kw = {"kind": "cosine", "warmup": 10, "min_lr_ratio": 0.2, "cycle_length": 50}

    def cos(t: float) -> float:
        return 0.2 + 0.4 * (1 + math.cos(math.pi * t))

    assert lr(29, **kw) == pytest.approx(cos(20 / 41))  # 20 of the 40 decay updates
    assert lr(49, **kw) == pytest.approx(cos(40 / 41))
    assert lr(50, **kw) == pytest.approx(cos(1 / 51))
    assert lr(74, **kw) == pytest.approx(cos(25 / 51))  # second cycle: decay fills all 50
    assert lr(99, **kw) == pytest.approx(cos(50 / 51))


def test_wsds_helper_places_decays_at_the_requested_steps():
    cfg = wsds_schedule([125, 250, 500, 1000], 0.1, warmup_steps=20, min_lr_ratio=0.0)
    assert (cfg.kind, cfg.cycles, cfg.decay, cfg.rewarmup) == ("wsd", [125, 250, 500], 0.1, 0.0)
    assert cycle_boundaries(1000, cfg) == [125, 250, 500, 1000]
    # each decay is the last 10% of its own period (12.5 rounds up to 13)
    assert decay_windows(1000, cfg) == [(112, 125), (237, 250), (475, 500), (950, 1000)]
    assert lr_multiplier(0, 1000, cfg) == pytest.approx(0.05)
    assert lr_multiplier(111, 1000, cfg) == 1.0
    assert lr_multiplier(112, 1000, cfg) == pytest.approx(13 / 14)
    assert lr_multiplier(124, 1000, cfg) == pytest.approx(1 / 14)  # the decay's last update
    assert lr_multiplier(125, 1000, cfg) == 1.0
    assert lr_multiplier(974, 1000, cfg) == pytest.approx(26 / 51)
    single = wsds_schedule([200], warmup_steps=0, min_lr_ratio=0.1)
    assert single.cycles is None and decay_windows(200, single) == [(180, 200)]


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"cycles": [60, 30]}, "schedule.cycles: [60, 30] must be a non-empty list of strictly"),
        ({"cycles": [50, 150]}, "schedule.cycles: [50, 150] must be a non-empty list"),
        ({"cycles": []}, "schedule.cycles: [] must be"),
        ({"cycles": 0}, "schedule.cycles: 0 cycles do not fit in 100 steps"),
        ({"cycles": 101}, "schedule.cycles: 101 cycles do not fit in 100 steps"),
        ({"cycle_length": [60, 60]}, "schedule.cycle_length: [60, 60] must be a non-empty list"),
        ({"cycle_length": 150}, "schedule.cycle_length: 150 gives cycles of 150 steps"),
        (
            {"warmup": 60, "decay": 50},
            "schedule.warmup: 60 warmup steps + 50 decay steps exceed cycle 1 of 100 steps",
        ),
        (
            {"warmup": 10, "cycles": 2, "rewarmup": 30, "decay": 0.5},
            "schedule.rewarmup: 30 rewarmup steps + 25 decay steps exceed cycle 2 of 50 steps "
            "(steps 50..100)",
        ),
    ],
)
def test_bad_schedules_fail_when_the_scheduler_is_built(kw, message):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError) as err:
        build_scheduler(opt, ScheduleConfig(kind="wsd", **kw), TOTAL)
    assert message in str(err.value)


def test_warmup_longer_than_the_run_and_bad_wsds_inputs():
    with pytest.raises(ConfigError, match="schedule.warmup: 120 warmup steps"):
        lr(0, kind="cosine", warmup=120)
    with pytest.raises(ConfigError, match="total_steps: 0 must be >= 1"):
        lr_multiplier(0, 0, ScheduleConfig())
    with pytest.raises(ConfigError, match=r"decay_end_steps: \[50, 20\]"):
        wsds_schedule([50, 20], warmup_steps=5, min_lr_ratio=0.0)
    with pytest.raises(ConfigError, match="decay_fraction: 1.5 must be in"):
        wsds_schedule([50], 1.5, warmup_steps=5, min_lr_ratio=0.0)


def _run(sched: torch.optim.lr_scheduler.LambdaLR, steps: int) -> list[list[float]]:
    lrs = []
    for _ in range(steps):
        sched.optimizer.step()
        sched.step()
        lrs.append(sched.get_last_lr())
    return lrs


def _scheduler(cfg: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    p, q = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([{"params": [p], "lr": 2.0}, {"params": [q], "lr": 1.0}])
    return build_scheduler(opt, cfg, TOTAL)


def test_scheduler_state_round_trips_through_a_checkpoint():
    cfg = ScheduleConfig(kind="cosine", warmup=5, min_lr_ratio=0.1)
    first = _scheduler(cfg)
    assert first.get_last_lr() == pytest.approx([2 * 0.2, 0.2])  # step 0: 1/5 of peak
    _run(first, 30)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    fresh = _scheduler(cfg)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.get_last_lr() == first.get_last_lr()
    expected = _run(first, 10)
    assert _run(fresh, 10) == expected
    # update 40 is (41 - 5) / 96 of the way through the 95-update cosine decay
    at_40 = 0.1 + 0.45 * (1 + math.cos(math.pi * 36 / 96))
    assert expected[-1] == pytest.approx([2 * at_40, at_40])


def test_plot_writes_a_png(tmp_path):
    cfg = ScheduleConfig(kind="wsd", cycles=3, warmup=5, rewarmup=3)
    path = plot_schedule(cfg, 300, 3e-3, tmp_path / "sub" / "lr.png", title="three cycles")
    data = path.read_bytes()
    assert path == tmp_path / "sub" / "lr.png"
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000


def test_plot_draws_the_schedule():
    """The curve is the LR each update gets; cycle ends dotted; each decay shaded."""
    cfg = ScheduleConfig(kind="wsd", cycles=3, warmup=5, rewarmup=3)
    ax = schedule_figure(cfg, 300, 3e-3, "three cycles").axes[0]
    curve, *ends = ax.lines
    assert curve.get_label() == "LR"
    assert np.array_equal(curve.get_xdata(), np.arange(300))
    lrs = [3e-3 * lr_multiplier(s, 300, cfg) for s in range(300)]
    assert np.allclose(curve.get_ydata(), lrs, rtol=1e-5, atol=0)
    assert [e.get_xdata()[0] for e in ends] == cycle_boundaries(300, cfg)[:-1] == [100, 200]
    spans = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    assert spans == decay_windows(300, cfg)
    assert ax.get_title() == "three cycles"


def test_a_decay_of_one_or_two_updates_does_not_anneal():
    """A short run's 20% of a 7-step period is one update, taken at half the peak LR: the demo's
    LR sweep fitted such points as finished runs (its 15K trials at 1/8 and 1/4 of 53 steps)."""
    cfg = wsds_schedule([7, 13, 26, 53], 0.2, warmup_steps=5, min_lr_ratio=0.0)
    windows = decay_windows(53, cfg)
    assert [end - start for start, end in windows] == [1, 1, 3, 5]
    assert lr_multiplier(6, 53, cfg) == pytest.approx(0.5, rel=1e-4)  # cycle 1's one decayed update
    assert annealed_steps(53, cfg) == {26, 53}
    assert short_decays(53, cfg) == [7, 13]

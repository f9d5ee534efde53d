from __future__ import annotations

import pytest
import torch

from trainer_core.config import ScheduleConfig
from trainer_core.configio import ConfigError
from trainer_core.schedule import (
    build_scheduler,
    cycle_boundaries,
    decay_windows,
    lr_multiplier,
    plot_schedule,
    wsds_schedule,
)

TOTAL = 100


def lr(step, **kw):
    return lr_multiplier(step, TOTAL, ScheduleConfig(**kw))


@pytest.mark.parametrize(
    "kind, mid_decay",
    [
        ("cosine", 0.55),  # 0.1 + 0.9 * 0.5 * (1 + cos(pi/2))
        ("linear", 0.55),  # 1 - 0.9 * 0.5
        ("inv_sqrt", 50.5**-0.5),  # (1 + 99 * 0.5) ** -0.5, k = 0.1**-2 - 1
        ("inv", 1 / 5.5),  # 1 / (1 + 9 * 0.5), k = 1/0.1 - 1
    ],
)
def test_decaying_kinds_pin_key_steps(kind, mid_decay):
    kw = {"kind": kind, "warmup": 10, "min_lr_ratio": 0.1}
    assert lr(0, **kw) == pytest.approx(0.1)  # (0 + 1) / 10: the first update moves
    assert lr(9, **kw) == pytest.approx(1.0)  # end of warmup
    # decay covers steps 10..99 (90 steps); step 54 is exactly halfway
    assert lr(54, **kw) == pytest.approx(mid_decay, rel=1e-6)
    assert lr(99, **kw) == pytest.approx(0.1)  # last step lands on min_lr_ratio


def test_constant_and_wsd():
    assert lr(50, kind="constant", warmup=10) == 1.0
    assert lr(99, kind="constant", warmup=10) == 1.0
    wsd = {"kind": "wsd", "warmup": 0.1, "min_lr_ratio": 0.0}
    assert lr(50, **wsd) == 1.0  # mid stable
    assert lr(79, **wsd) == 1.0  # last stable step (decay = last 20%)
    assert lr(89, **wsd) == pytest.approx(0.5)  # (89 - 80 + 1) / 20 into the decay
    assert lr(99, **wsd) == pytest.approx(0.0)


def test_cycles_without_and_with_rewarmup():
    kw = {"kind": "wsd", "warmup": 10, "decay": 0.1, "min_lr_ratio": 0.1, "cycles": 2}
    assert cycle_boundaries(TOTAL, ScheduleConfig(**kw)) == [50, 100]
    assert lr(44, **kw) == 1.0
    assert lr(49, **kw) == pytest.approx(0.1)  # end of first decay
    assert lr(50, **kw) == 1.0  # rewarmup 0: jump back to peak
    assert lr(99, **kw) == pytest.approx(0.1)
    kw["rewarmup"] = 5
    assert lr(50, **kw) == pytest.approx(0.1 + 0.9 * 1 / 5)
    assert lr(54, **kw) == pytest.approx(1.0)


def test_cycle_specifications():
    def ends(**kw):
        return cycle_boundaries(TOTAL, ScheduleConfig(kind="wsd", warmup=0, **kw))

    assert ends(cycles=[30, 60]) == [30, 60, 100]
    assert ends(cycle_length=25) == [25, 50, 75, 100]
    assert ends(cycle_length=0.5) == [50, 100]
    assert ends(cycle_length=[20, 30]) == [20, 100]


def test_wsds_helper_places_decays_at_the_requested_steps():
    cfg = wsds_schedule(
        [125, 250, 500, 1000], decay_fraction=0.1, warmup_steps=20, min_lr_ratio=0.0
    )
    windows = decay_windows(1000, cfg)
    assert [end for _, end in windows] == [125, 250, 500, 1000]
    # each decay is the last 10% of its own period
    assert [end - start for start, end in windows] == [12, 12, 25, 50]
    assert lr_multiplier(124, 1000, cfg) == pytest.approx(0.0)
    assert lr_multiplier(125, 1000, cfg) == 1.0


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"cycles": [60, 30]}, "schedule.cycles: [60, 30] must be increasing"),
        ({"cycles": [50, 150]}, "schedule.cycles"),
        ({"cycle_length": [60, 60]}, "schedule.cycle_length"),
        ({"warmup": 60, "decay": 50}, "schedule.warmup: warmup (60) + decay (50) steps exceed"),
    ],
)
def test_bad_schedules_are_config_errors(kw, message):
    with pytest.raises(ConfigError) as err:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        build_scheduler(opt, ScheduleConfig(kind="wsd", **kw), TOTAL)
    assert message in str(err.value)


def test_scheduler_state_round_trip():
    cfg = ScheduleConfig(kind="cosine", warmup=5)
    p = torch.nn.Parameter(torch.zeros(1))
    a = torch.optim.SGD([p], lr=1.0)
    sched_a = build_scheduler(a, cfg, TOTAL)
    for _ in range(30):
        a.step()
        sched_a.step()
    b = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched_b = build_scheduler(b, cfg, TOTAL)
    sched_b.load_state_dict(sched_a.state_dict())
    for _ in range(10):
        a.step()
        sched_a.step()
        b.step()
        sched_b.step()
        assert sched_b.get_last_lr() == sched_a.get_last_lr()
    assert sched_a.get_last_lr()[0] == pytest.approx(lr_multiplier(40, TOTAL, cfg))


def test_plot_writes_png(tmp_path):
    path = plot_schedule(
        ScheduleConfig(kind="wsd", cycles=3, warmup=5), 300, 3e-3, tmp_path / "lr.png"
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000

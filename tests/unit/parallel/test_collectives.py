"""The device rule for collectives (issue 25, fix 1), tested as a rule.

NCCL takes only CUDA tensors and gloo CPU ones; a CPU tensor handed to an NCCL group raises at
the first collective, which a CPU run on gloo never shows. So every collective the loop makes is
recorded in a 2-rank gloo run and checked against :func:`collective_device`, the one place the
rule lives, and the rule itself is checked for each backend a run can have.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from ranks import join_as_rank
from spawned_build import TINY

from trainer_core.config.loader import load_config
from trainer_core.config.sections import TrainConfig
from trainer_core.parallel.process_group import (
    CUDA_BACKEND,
    backend_devices,
    collective_device,
    device_for,
    served_devices,
    teardown,
)
from trainer_core.train.build import build_trainer

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
TENSOR_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
)
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list")


@pytest.mark.parametrize(
    "backend, run_device, expected",
    [
        ("nccl", CUDA, CUDA),
        ("nccl", CPU, CUDA),  # a CPU tensor on NCCL: the crash the rule prevents
        ("gloo", CPU, CPU),
        ("gloo", CUDA, CPU),
        (CUDA_BACKEND, CUDA, CUDA),  # device tensors take NCCL...
        (CUDA_BACKEND, CPU, CPU),  # ...CPU ones (objects) the gloo beside it
    ],
)
def test_the_rule_for_each_backend(backend, run_device, expected):
    """The rule as a function of the backend string: NCCL and the CUDA pair need no GPU here."""
    assert device_for(backend_devices(backend), run_device) == expected


def test_served_devices_prefers_the_accelerator():
    assert backend_devices(CUDA_BACKEND) == ["cuda", "cpu"]
    assert backend_devices("cuda:nccl,cpu:gloo") == ["cuda", "cpu"]  # whatever the order


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo"])
def test_a_real_gloo_group_takes_what_the_rule_sends_it(free_port, backend):
    """On a live one-rank gloo group (as a CPU run's, or named per device): the group serves
    CPU, a CUDA run's tensors are sent to CPU, and gloo reduces a tensor put where the rule says."""
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        assert served_devices() == ["cpu"]
        assert collective_device(None, CPU) == CPU
        where = collective_device(None, CUDA)
        assert where == CPU
        tensor = torch.ones(3, device=where)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_without_a_group_the_run_device_is_used():
    assert not dist.is_initialized()
    assert collective_device(None, CPU) == CPU


def _recording_worker(rank: int, world: int, port: int, out: str) -> None:
    """A tiny 2-rank run with minute-based saves on, every collective recorded: its name, the
    step it ran in (0: before the first), its tensors' devices and the devices its group
    serves by the rule."""
    join_as_rank(rank, world, port)
    seen: list[dict] = []
    step = [0]
    originals = {name: getattr(dist, name) for name in TENSOR_COLLECTIVES + OBJECT_COLLECTIVES}

    def recorder(name: str):
        def call(*args, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [t for a in args if isinstance(a, list) for t in a if torch.is_tensor(t)]
            group = kwargs.get("group")
            seen.append(
                {
                    "name": name,
                    "step": step[0],
                    "devices": sorted({t.device.type for t in tensors}),
                    "rule": collective_device(group, run_device[0]).type,
                    "served": served_devices(group),
                }
            )
            return originals[name](*args, **kwargs)

        return call

    for name in originals:
        setattr(dist, name, recorder(name))
    run_device = [CPU]
    try:
        overrides = [
            f"--trainer.run_dir={Path(out).parent / 'run'}",
            "--checkpoint.enabled=true",
            "--checkpoint.save_interval_minutes=1000",
            "--checkpoint.save_final=true",
        ]
        cfg = load_config(TrainConfig, None, [*TINY, *overrides])
        trainer = build_trainer(cfg)
        run_device[0] = trainer.module.device
        train_batch = trainer.module.train_batch

        def counted(batch):
            step[0] += 1
            return train_batch(batch)

        trainer.module.train_batch = counted
        trainer.fit()
        Path(f"{out}.{rank}").write_text(json.dumps(seen))
    finally:
        teardown()


@pytest.mark.slow
def test_every_collective_in_the_loop_is_on_the_device_its_group_serves(spawn_ranks, tmp_path):
    """Metrics, token counts, eval, gradients and the save decision: each collective's tensors
        sit on the device the rule names for its group. Objects are gathered only before the first
        step (where each rank is placed) and by the checkpoint save, never per step (minute-based saves
    on)."""
    out = tmp_path / "seen"
    spawn_ranks(_recording_worker, 2, str(out), timeout=240)
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.{rank}").read_text())
        tensor_calls = [c for c in seen if c["name"] in TENSOR_COLLECTIVES]
        assert {c["name"] for c in tensor_calls} >= {"all_reduce", "broadcast"}
        assert {c["step"] for c in tensor_calls} >= set(range(1, 11))  # every step has some
        for call in tensor_calls:
            assert call["devices"] == [call["rule"]], call
            assert call["rule"] in call["served"], call
        object_steps = {c["step"] for c in seen if c["name"] in OBJECT_COLLECTIVES}
        assert object_steps == {0, 10}, object_steps  # the start, and the save's planning

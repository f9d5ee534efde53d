"""The calls whose arguments differ between torch releases, on both sides of the change.

This torch (the development pin) takes the newer arguments; the older releases' side is taken
by functions with their signatures (torch 2.6's DCP ``save`` has no ``no_dist`` and warns when
it finds no process group). ``make test-torch-floor`` runs the whole suite on torch 2.6 itself.
"""

from __future__ import annotations

import warnings

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import distribute_tensor

from trainer_core.compat import (
    dcp_async_save,
    dcp_call,
    dcp_runs_collectives,
    fsdp_runs_on,
    shard_of_whole,
    takes,
)

NO_GROUP_WARNING = (
    "torch.distributed is unavailable or uninitialized, assuming the intent is to save in a "
    "single process."
)
"""What torch 2.6's ``dcp.save`` says at every call in a process without a group."""


def save_before_2_7(state, *, storage_writer=None, process_group=None):
    """torch 2.6's ``dcp.save`` signature, and its warning without a group."""
    warnings.warn(NO_GROUP_WARNING, stacklevel=2)
    return {"state": state, "storage_writer": storage_writer}


def save_from_2_7(state, *, storage_writer=None, process_group=None, no_dist=False):
    return {"state": state, "storage_writer": storage_writer, "no_dist": no_dist}


def test_the_newer_arguments_are_found_from_torch_2_7_on():
    import torch

    newer = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 7)
    assert [takes(fn, "no_dist") for fn in (dcp.save, dcp.async_save, dcp.load)] == [newer] * 3
    assert takes(distribute_tensor, "src_data_rank") == newer
    assert takes(dcp.async_save, "async_stager") == newer
    assert fsdp_runs_on(torch.device("cpu")) == newer


def test_one_process_saves_alone_on_either_side_of_the_change():
    assert dcp_call(save_from_2_7, {"a": 1}, storage_writer="w") == {
        "state": {"a": 1},
        "storage_writer": "w",
        "no_dist": True,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dcp_call(save_before_2_7, {"a": 1}, storage_writer="w") == {
            "state": {"a": 1},
            "storage_writer": "w",
        }
    assert not dcp_runs_collectives()  # no process group in this test process


def test_only_the_no_group_warning_is_dropped():
    def save_that_warns_of_something_else(state, *, storage_writer=None):
        warnings.warn("a real problem", stacklevel=2)

    with pytest.warns(UserWarning, match="a real problem"):
        dcp_call(save_that_warns_of_something_else, {})


def test_an_async_save_before_2_7_is_given_a_copy_of_the_cpu_state(monkeypatch):
    """2.6 "offloads" the state to the CPU, which leaves a CPU tensor as it is: the step after
    the save changed what the background write then read."""
    import torch
    from torch.distributed.checkpoint.stateful import Stateful

    given = {}

    def async_save_before_2_7(state, *, storage_writer=None, process_group=None):
        given.update(state)
        return "future"

    weight = torch.zeros(3)

    class Model(Stateful):
        def state_dict(self):
            return {"w": weight, "nested": [weight]}

        def load_state_dict(self, state):
            raise AssertionError("not loaded here")

    monkeypatch.setattr(dcp, "async_save", async_save_before_2_7)
    assert dcp_async_save({"model": Model(), "trainer": {"step": 1}}) == "future"
    weight.add_(1.0)  # the next optimizer step, while the write runs
    assert torch.equal(given["model"]["w"], torch.zeros(3))
    assert torch.equal(given["model"]["nested"][0], torch.zeros(3))
    assert given["trainer"] == {"step": 1}


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo group of one rank in this process; destroyed after."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def one_rank_mesh(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (1,))


def test_fsdp2_on_a_cpu_it_cannot_shard_on_is_refused_in_one_line(one_rank_group, monkeypatch):
    """torch 2.6 failed at the first forward with "'Stream' object has no attribute
    'record_event'" from inside FSDP2's all-gather."""
    import torch

    from trainer_core.config.loader import ConfigError
    from trainer_core.config.sections import ModelConfig, ParallelConfig
    from trainer_core.model.transformer import Transformer
    from trainer_core.parallel import wrap

    monkeypatch.setattr(wrap, "fsdp_runs_on", lambda device: False)
    mesh = wrap.build_mesh(ParallelConfig(), 1, "cpu", one_rank=True)
    with torch.device("meta"):
        model = Transformer(ModelConfig(size="15K", vocab_size=320), 16)
    with pytest.raises(
        ConfigError, match=r"FSDP2 over 1 data-parallel rank\(s\) on CPU needs torch 2\.7"
    ):
        wrap.parallelize_model(model, mesh, ParallelConfig(), torch.device("cpu"))


@pytest.mark.parametrize("cuts_locally", [True, False], ids=["from_2_7", "before_2_7"])
def test_a_rank_keeps_its_part_of_a_whole_value_either_way(
    one_rank_mesh, monkeypatch, cuts_locally
):
    import torch
    from torch.distributed.tensor import Replicate, Shard

    import trainer_core.compat as compat

    if not cuts_locally:
        monkeypatch.setattr(compat, "takes", lambda fn, argument: False)
    value = torch.arange(12.0).reshape(4, 3)
    for placements in ([Shard(0)], [Replicate()]):
        part = shard_of_whole(value, one_rank_mesh, placements)
        assert part.placements == tuple(placements)
        assert torch.equal(part.full_tensor(), value)

"""Which RNG states a checkpoint holds: CUDA's only for a run that computes on CUDA."""

from __future__ import annotations

import torch

from trainer_core.checkpoint.rng import restore_rng, rng_state


def test_a_cpu_run_on_a_gpu_machine_leaves_cuda_alone(monkeypatch):
    """Saving asked CUDA for its generator whenever CUDA was there, so every rank of a CPU run
    on a GPU machine made a context on GPU 0 (and a CUDA state was restored into it)."""
    touched = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a: touched.append("get"))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a: touched.append("set"))
    cpu = torch.device("cpu")
    state = rng_state(0, cpu)
    assert set(state["rank0"]) == {"python", "numpy", "torch"}
    restore_rng({"rank0": {**state["rank0"], "cuda": torch.zeros(8, dtype=torch.uint8)}}, 0, cpu)
    assert touched == []


def test_the_states_restored_draw_the_numbers_drawn_after_the_save():
    cpu = torch.device("cpu")
    torch.manual_seed(3)
    saved = rng_state(0, cpu)
    after_save = torch.rand(4)
    torch.manual_seed(4)
    assert restore_rng(saved, 0, cpu)
    assert torch.equal(torch.rand(4), after_save)

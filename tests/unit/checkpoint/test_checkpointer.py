"""Checkpoints: exact resume (1 and 2 FSDP2 ranks), atomic commit, keep policy, clear errors."""

from __future__ import annotations

import json
import logging
import pickle
import random
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer_core.checkpoint.checkpointer import Checkpointer
from trainer_core.checkpoint.keep import CheckpointPolicy
from trainer_core.checkpoint.listing import (
    CheckpointError,
    CorruptCheckpointError,
    latest_checkpoint,
    list_checkpoints,
    listed_files,
    marker_name,
)
from trainer_core.checkpoint.renames import RENAMED, rename_parameters
from trainer_core.checkpoint.rng import restore_rng, rng_state
from trainer_core.config.sections import CheckpointConfig, KeepRule, ModelConfig, TrainModuleConfig
from trainer_core.errors import RunWarning
from trainer_core.io.run_dir import step_dir
from trainer_core.model.transformer import Transformer
from trainer_core.train.train_module import TrainModule

# The module filters this DCP notice globally; pytest resets filters per test.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

TINY = ModelConfig(d_model=64, n_layers=2, n_heads=4, mlp_hidden=128)
K = 3  # steps before and after the checkpoint


# -- a tiny training setup shared by the in-process and the spawned tests ----------------------


def build(world: int, cfg: ModelConfig = TINY, init_seed: int = 0) -> TrainModule:
    model = Transformer(cfg, init_seed=init_seed)
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    return TrainModule(
        model, opt, sched, TrainModuleConfig(), seq_len=16, device=torch.device("cpu")
    )


def train(state: TrainModule, steps: int) -> list[float]:
    """CE on tokens drawn from the global torch RNG, scaled by Python/NumPy draws, so the loss
    sequence only repeats if every RNG, the weights, the optimizer and the schedule do."""
    losses = []
    for _ in range(steps):
        tokens = torch.randint(0, TINY.vocab_size, (2, 17))
        logits = state.model(tokens[:, :-1])
        scale = (1 + random.random() / 100) * (1 + float(np.random.rand()) / 100)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten()) * scale
        loss.backward()
        state.optimizer.step()
        state.scheduler.step()
        state.optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def app_state(mos: TrainModule, rank: int, step: int = 0, epoch: int = 0) -> dict:
    return {
        "train_module": mos,
        "trainer": {"step": step, "tokens": step * 32},
        "data": {"epoch": epoch, "offset": step * 2},
        "rng": rng_state(rank),
    }


def local_tensors(mos: TrainModule) -> dict[str, torch.Tensor]:
    """Model and optimizer tensors of this rank (its shard under FSDP2), flattened and cloned."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict({k: v for k, v in mos.state_dict().items() if k != "scheduler"})
    return {
        k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone()
        for k, v in flat.items()
        if isinstance(v, torch.Tensor)
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def resume_matches(run_dir: Path, rank: int, world: int) -> None:
    """Train K, save, train K more; then a fresh model loads and trains the same K steps."""
    seed_all(100 + rank)
    mos = build(world)
    train(mos, K)
    ckpt = Checkpointer(run_dir, CheckpointConfig(), rank=rank, world_size=world)
    saved = local_tensors(mos)
    path = ckpt.save(K, app_state(mos, rank, step=K, epoch=1), tokens=K * 32, permanent=False)
    uninterrupted = train(mos, K)

    seed_all(999)  # scramble every RNG and start from other weights
    fresh = build(world, init_seed=7)
    state = app_state(fresh, rank)
    ckpt.load(path, state)
    assert restore_rng(state["rng"], rank)
    assert state["trainer"] == {"step": K, "tokens": K * 32}
    assert state["data"] == {"epoch": 1, "offset": K * 2}
    assert_same(local_tensors(fresh), saved)
    assert fresh.scheduler.last_epoch == K
    assert train(fresh, K) == uninterrupted  # bit for bit


# -- spawning gloo ranks --------------------------------------------------------------------------


def _rank_main(rank: int, world: int, port: int, fn_name: str, *args) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        globals()[fn_name](*args, rank, world)
    finally:
        dist.destroy_process_group()


# -- exact resume ---------------------------------------------------------------------------------


def test_resume_is_exact_single_rank(tmp_path):
    resume_matches(tmp_path, 0, 1)
    [info] = list_checkpoints(tmp_path)
    assert (info.step, info.tokens, info.complete, info.permanent) == (K, K * 32, True, False)
    assert {p.name for p in info.path.iterdir()} >= {".metadata", marker_name(0, 1), "info.json"}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_resume_is_exact_with_two_fsdp2_ranks(spawn_ranks, tmp_path):
    spawn_ranks(_rank_main, 2, "resume_matches", tmp_path)
    [info] = list_checkpoints(tmp_path)
    assert info.complete
    assert {".done-rank0-of-2", ".done-rank1-of-2"} <= {p.name for p in info.path.iterdir()}
    assert json.loads((info.path / "info.json").read_text())["world_size"] == 2
    # Each rank lists the files it wrote; together they cover every file but the markers.
    rank0, rank1 = (
        set(json.loads((info.path / marker_name(r, 2)).read_text())["files"]) for r in (0, 1)
    )
    assert {".metadata", "info.json"} <= rank0 and all(n.startswith("__1_") for n in rank1)
    assert rank0 | rank1 == {p.name for p in info.path.iterdir() if not p.name.startswith(".done")}


def test_the_marker_lists_every_file_with_its_size_and_crc32(tmp_path):
    path = Checkpointer(tmp_path, CheckpointConfig()).save(
        1, tiny_state(1), tokens=10, permanent=True
    )
    listing = json.loads((path / marker_name(0, 1)).read_text())["files"]
    assert set(listing) == {".metadata", "__0_0.distcp", "info.json"}
    for name, entry in listing.items():
        data = (path / name).read_bytes()
        assert entry == {"size": len(data), "crc32": zlib.crc32(data)}


def test_each_rank_gets_its_own_rng_state(tmp_path):
    """Two ranks' RNG entries in one checkpoint (DCP would keep one copy of a shared key)."""
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    seed_all(1)
    rank0 = rng_state(0)
    seed_all(2)
    rank1 = rng_state(1)
    path = ckpt.save(1, {"rng": {**rank0, **rank1}}, tokens=0, permanent=False)
    for rank, seed in ((0, 1), (1, 2)):
        seed_all(seed)
        expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
        seed_all(50)
        state = {"rng": rng_state(rank)}
        ckpt.load(path, state)
        restore_rng(state["rng"], rank)
        assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected


def resume_on_two_ranks(run_dir: Path, expected_file: Path, rank: int, world: int) -> None:
    expected = torch.load(expected_file, weights_only=True)
    mos = build(world, init_seed=7)
    state = app_state(mos, rank)
    Checkpointer(run_dir, CheckpointConfig(), rank, world).load(step_dir(run_dir, K), state)
    full = {
        k: v.full_tensor() if hasattr(v, "full_tensor") else v
        for k, v in mos.model.state_dict().items()
    }
    assert_same(full, expected["model"])
    assert mos.scheduler.last_epoch == K
    assert state["trainer"] == {"step": K, "tokens": K * 32}
    # Rank 0 gets the saved RNG state; rank 1 did not exist and keeps its own.
    assert restore_rng(state["rng"], rank) == (rank == 0)
    assert all(np.isfinite(train(mos, 1)))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_rank_checkpoint_resumes_on_two_fsdp2_ranks(spawn_ranks, tmp_path):
    """DCP reshards the FSDP2 DTensor state; the new rank's RNG entry is simply absent."""
    seed_all(0)
    mos = build(1)
    train(mos, K)
    Checkpointer(tmp_path, CheckpointConfig()).save(
        K, app_state(mos, 0, K), tokens=K * 32, permanent=True
    )
    expected = tmp_path / "expected.pt"
    torch.save({"model": mos.model.state_dict()}, expected)
    spawn_ranks(_rank_main, 2, "resume_on_two_ranks", tmp_path, expected)


# -- commit, discovery, keep policy ---------------------------------------------------------------


def tiny_state(step: int = 0) -> dict:
    torch.manual_seed(step)
    return {"weights": {"w": torch.randn(4, 3)}, "trainer": {"step": step, "tokens": 10 * step}}


def test_latest_skips_incomplete_and_tmp_dirs_with_a_warning(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    for step in (1, 2):
        ckpt.save(step, tiny_state(step), tokens=10 * step, permanent=True)
    (step_dir(tmp_path, 2) / marker_name(0, 1)).unlink()
    tmp = step_dir(tmp_path, 3).with_name("step-00000003.tmp-deadbeef")
    tmp.mkdir()
    with pytest.warns(RunWarning) as caught:
        found = latest_checkpoint(tmp_path)
    messages = " ".join(str(w.message) for w in caught)
    assert found.step == 1
    assert str(step_dir(tmp_path, 2)) in messages and marker_name(0, 1) in messages
    assert str(tmp) in messages
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 2]
    assert [c.complete for c in list_checkpoints(tmp_path)] == [True, False]


def test_temporary_checkpoints_are_replaced_and_permanent_ones_kept(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    for step, permanent in ((1, False), (2, True), (3, False), (4, False), (5, True), (6, False)):
        ckpt.save(
            step,
            tiny_state(step),
            tokens=10 * step,
            permanent=permanent,
            metrics={"eval/loss": step / 10},
        )
    infos = list_checkpoints(tmp_path)
    assert [(c.step, c.permanent) for c in infos] == [(2, True), (5, True), (6, False)]
    assert [c.tokens for c in infos] == [20, 50, 60]
    assert infos[0].metrics_path == tmp_path / "metrics_step2.json"
    assert infos[2].metrics_path is None  # metrics files only at permanent steps
    assert json.loads(infos[0].metrics_path.read_text()) == {
        "step": 2,
        "tokens": 20,
        "eval/loss": 0.2,
    }
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000002",
        "step-00000005",
        "step-00000006",
    ]
    info = json.loads((infos[1].path / "info.json").read_text())
    assert {k: info[k] for k in ("step", "tokens", "world_size", "permanent")} == {
        "step": 5,
        "tokens": 50,
        "world_size": 1,
        "permanent": True,
    }


def test_a_permanent_checkpoint_is_never_complete_without_its_metrics(tmp_path, monkeypatch):
    """Killed between the rename that completes a permanent checkpoint and the write of its
    metrics file, a run once resumed past that step and the analysis lost the annealed point for
    good. The metrics now come first: killed at the rename, the checkpoint is incomplete (the
    run replays the step) and the file is already there."""
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    ckpt.save(1, tiny_state(1), tokens=10, permanent=True, metrics={"eval/loss": 0.5})

    def killed(self, pending) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Checkpointer, "_put_in_place", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(2, tiny_state(2), tokens=20, permanent=True, metrics={"eval/loss": 0.4})
    assert [(c.step, c.complete) for c in list_checkpoints(tmp_path)] == [(1, True)]
    assert json.loads((tmp_path / "metrics_step2.json").read_text())["eval/loss"] == 0.4


def test_resaving_a_step_replaces_it_and_keeps_it_permanent(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    ckpt.save(4, tiny_state(1), tokens=1, permanent=True)
    ckpt.save(4, tiny_state(2), tokens=2, permanent=False)
    [info] = list_checkpoints(tmp_path)
    assert (info.tokens, info.permanent, info.complete) == (2, True, True)
    state = tiny_state(0)
    ckpt.load(info.path, state)
    assert torch.equal(state["weights"]["w"], tiny_state(2)["weights"]["w"])


def test_a_swap_interrupted_between_renames_is_recovered_by_the_next_commit(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    ckpt.save(6, tiny_state(6), tokens=60, permanent=True)
    path = ckpt.save(7, tiny_state(7), tokens=70, permanent=True)
    path.rename(path.with_name("step-00000007.old-12345678"))
    with pytest.warns(UserWarning, match="step-00000007.old-12345678"):
        assert latest_checkpoint(tmp_path).step == 6  # listing has no side effects
    ckpt.save(8, tiny_state(8), tokens=80, permanent=False)
    assert [c.step for c in list_checkpoints(tmp_path)] == [6, 7, 8]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir())[1] == "step-00000007"


def test_levanter_keep_rules():
    rules = [KeepRule(1000, 10000), KeepRule(5000, 40000), KeepRule(10000)]
    policy = CheckpointPolicy(
        CheckpointConfig(keep=rules, keep_steps=[1234], save_interval_minutes=None)
    )
    permanent = [1000, 2000, 10000, 15000, 20000, 40000, 50000, 60000, 1234]
    not_permanent = [0, 1, 999, 1500, 11000, 12000, 41000, 45000, 55000]
    assert all(policy.is_permanent(s) for s in permanent)
    assert not any(policy.is_permanent(s) for s in not_permanent)
    assert [policy.decide(s, 0.0) for s in (1000, 11000, 15000)] == [
        "permanent",
        "none",
        "permanent",
    ]


def test_temporary_saves_by_steps_and_minutes():
    by_steps = CheckpointPolicy(
        CheckpointConfig(save_interval_steps=5, save_interval_minutes=None, keep_steps=[10])
    )
    assert [by_steps.decide(s, 0.0) for s in range(4, 12)] == [
        "none", "temporary", "none", "none", "none", "none", "permanent", "none",
    ]  # fmt: skip
    assert by_steps.decide(12, 0.0, final=True) == "permanent"

    by_time = CheckpointPolicy(CheckpointConfig(save_interval_minutes=1.0))
    times = [0.0, 30.0, 59.0, 61.0, 100.0, 121.0, 122.0]
    assert [by_time.decide(s + 1, t) for s, t in enumerate(times)] == [
        "none", "none", "none", "temporary", "none", "temporary", "none",
    ]  # fmt: skip
    assert CheckpointPolicy(CheckpointConfig(enabled=False)).decide(1, 1e9, final=True) == "none"
    assert by_time.decide_all_ranks(8, 500.0) == "temporary"  # no process group: this rank's


def test_async_save_commits_only_when_finished(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig(async_save=True))
    state = tiny_state(1)
    before = state["weights"]["w"].clone()
    path = ckpt.save(1, state, tokens=10, permanent=False)
    state["weights"]["w"].add_(1.0)  # training goes on while the save runs
    assert ckpt.last_committed is None
    ckpt.close()
    assert ckpt.last_committed == path
    assert latest_checkpoint(tmp_path).path == path
    assert set(listed_files(path)) == {".metadata", "__0_0.distcp", "info.json"}
    loaded = tiny_state(0)
    ckpt.load(path, loaded)
    assert torch.equal(loaded["weights"]["w"], before)
    ckpt.save(2, tiny_state(2), tokens=20, permanent=False)
    assert not step_dir(tmp_path, 2).exists()  # still in flight / uncommitted
    ckpt.save(3, tiny_state(3), tokens=30, permanent=False)  # commits 2 first, then drops 1
    ckpt.close()
    assert [c.step for c in list_checkpoints(tmp_path)] == [3]


def async_saves_on_ranks(run_dir: Path, rank: int, world: int) -> None:
    """Two async saves on gloo, committed in order; the time-based decision is rank 0's."""
    policy = CheckpointPolicy(CheckpointConfig(save_interval_minutes=1.0))
    policy.decide_all_ranks(1, 0.0)
    assert policy.decide_all_ranks(2, 100.0 if rank == 0 else 1.0) == "temporary"
    ckpt = Checkpointer(run_dir, CheckpointConfig(async_save=True), rank, world)
    for step in (1, 2):
        seed_all(step)
        shared = {"x": torch.randn(3)}  # identical on every rank, as non-rng values must be
        seed_all(100 * step + rank)
        ckpt.save(step, {"w": shared, "rng": rng_state(rank)}, tokens=step, permanent=False)
    ckpt.close()
    if rank == 0:  # rank 0 drops superseded checkpoints after the commit, while the others go on
        assert [c.step for c in list_checkpoints(run_dir)] == [2]
    state = {"w": {"x": torch.zeros(3)}, "rng": rng_state(rank)}
    ckpt.load(step_dir(run_dir, 2), state)
    restore_rng(state["rng"], rank)
    draws = torch.rand(2)
    seed_all(2)
    assert torch.equal(state["w"]["x"], torch.randn(3))
    seed_all(200 + rank)
    assert torch.equal(draws, torch.rand(2))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_async_save_with_two_ranks(spawn_ranks, tmp_path):
    spawn_ranks(_rank_main, 2, "async_saves_on_ranks", tmp_path)


def remote_save_fails_on_one_rank(failing: int, what: str, rank: int, world: int) -> None:
    """A run dir on object storage whose write fails on one rank: rank 0's metrics file, or
    one rank's upload. Every rank must get the same one-line error at once."""
    from trainer_core.checkpoint import checkpointer

    def fail(*args, **kwargs):
        raise OSError(f"simulated 503 on {what}")

    if rank == failing:
        if what == "metrics":
            checkpointer.write_metrics_step = fail
        else:
            checkpointer.storage.put_file = fail
    ckpt = Checkpointer("memory://bucket/run", CheckpointConfig(), rank=rank, world_size=world)
    with pytest.raises(CheckpointError) as err:
        ckpt.save(5, tiny_state(5), tokens=5, permanent=True, metrics={"eval/loss": 1.0})
    doing = "write the metrics of" if what == "metrics" else f"rank {failing} could not upload"
    assert doing in str(err.value) and f"simulated 503 on {what}" in str(err.value)


def async_save_fails_on_one_rank(run_dir: Path, rank: int, world: int) -> None:
    """Rank 1's background save fails (a full local disk): rank 0 went on into the commit's
    collectives while rank 1 raised, and waited there until the process group timed out."""
    from concurrent.futures import Future

    ckpt = Checkpointer(run_dir, CheckpointConfig(async_save=True), rank=rank, world_size=world)
    if rank == 1:
        save = ckpt._async_save

        def failed(*args, **kwargs):
            save(*args, **kwargs).result()  # the collective write, then this rank's own failure
            future = Future()
            future.set_exception(OSError("simulated: no space left on device"))
            return future

        ckpt._async_save = failed
    ckpt.save(5, tiny_state(5), tokens=5, permanent=False)
    with pytest.raises(CheckpointError, match="async save of step 5 .* no space left on device"):
        ckpt.wait()
    assert list_checkpoints(run_dir) == []


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_async_save_failed_on_one_rank_fails_every_rank_alike(spawn_ranks, tmp_path):
    spawn_ranks(_rank_main, 2, "async_save_fails_on_one_rank", tmp_path, timeout=60)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("failing, what", [(0, "metrics"), (1, "upload"), (0, "upload")])
def test_a_failed_remote_write_on_one_rank_fails_every_rank_alike(spawn_ranks, failing, what):
    """Rank 0 skipped the upload's barrier when its metrics write failed, and another rank's
    failed upload skipped it too: the others waited on it until the process group timed out."""
    spawn_ranks(_rank_main, 2, "remote_save_fails_on_one_rank", failing, what, timeout=60)


# -- integrity: checksums verified on load -------------------------------------------------------


def flip_bytes(path: Path, count: int = 64) -> None:
    """Change ``count`` bytes in the middle of a file, keeping its size."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + count] = bytes(b ^ 0xFF for b in data[middle : middle + count])
    path.write_bytes(bytes(data))


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def saved_steps(run_dir: Path, steps: tuple[int, ...], cfg: CheckpointConfig) -> Checkpointer:
    ckpt = Checkpointer(run_dir, cfg)
    for step in steps:
        ckpt.save(step, tiny_state(step), tokens=10 * step, permanent=True)
    return ckpt


def test_a_corrupt_latest_checkpoint_is_named_set_aside_and_the_one_before_loaded(tmp_path, caplog):
    ckpt = saved_steps(tmp_path, (1, 2, 3), CheckpointConfig())
    flip_bytes(step_dir(tmp_path, 3) / "__0_0.distcp")
    assert latest_checkpoint(tmp_path).step == 3  # listing checks sizes only
    state = tiny_state(0)
    with caplog.at_level(logging.WARNING, logger="trainer_core.checkpoint"):
        assert ckpt.load_latest(state).step == 2
    assert f"checkpoint {step_dir(tmp_path, 3)} is corrupt: __0_0.distcp has CRC32" in caplog.text
    assert torch.equal(state["weights"]["w"], tiny_state(2)["weights"]["w"])
    assert state["trainer"] == {"step": 2, "tokens": 20}
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 2]
    [aside] = (tmp_path / "checkpoints").glob("step-00000003.corrupt-*")
    assert not (tmp_path / "checkpoints" / "step-00000003").exists() and aside.is_dir()


def test_on_corrupt_fail_names_the_file_and_changes_nothing(tmp_path):
    ckpt = saved_steps(tmp_path, (1, 2), CheckpointConfig(on_corrupt="fail"))
    flip_bytes(step_dir(tmp_path, 2) / "info.json", count=1)
    before = snapshot(tmp_path)
    with pytest.raises(CorruptCheckpointError, match=r"step-00000002 is corrupt: info\.json has"):
        ckpt.load_latest(tiny_state(0))
    assert snapshot(tmp_path) == before


def test_with_no_checkpoint_that_verifies_the_run_does_not_start_over(tmp_path):
    ckpt = saved_steps(tmp_path, (1,), CheckpointConfig())
    flip_bytes(step_dir(tmp_path, 1) / ".metadata", count=1)
    before = snapshot(tmp_path)
    with pytest.raises(CorruptCheckpointError, match="no checkpoint of .* passes its checksums"):
        ckpt.load_latest(tiny_state(0))
    assert snapshot(tmp_path) == before
    assert Checkpointer(tmp_path / "new", CheckpointConfig()).load_latest(tiny_state(0)) is None


def fallback_on_ranks(run_dir: Path, rank: int, world: int) -> None:
    """Rank 1's file of the newest checkpoint is corrupt: both ranks see it (each verifies a
    share of the files) and both load the checkpoint before."""
    ckpt = Checkpointer(run_dir, CheckpointConfig(), rank, world)
    for step in (1, 2):
        seed_all(step)
        ckpt.save(
            step, {"w": {"x": torch.randn(3)}, "rng": rng_state(rank)}, tokens=step, permanent=True
        )
    if rank == 0:
        flip_bytes(step_dir(run_dir, 2) / "__1_0.distcp", count=8)
    dist.barrier()
    state = {"w": {"x": torch.zeros(3)}, "rng": rng_state(rank)}
    assert ckpt.load_latest(state).step == 1
    seed_all(1)
    assert torch.equal(state["w"]["x"], torch.randn(3))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_agree_on_a_corrupt_file_only_one_of_them_wrote(spawn_ranks, tmp_path):
    spawn_ranks(_rank_main, 2, "fallback_on_ranks", tmp_path)
    assert [c.step for c in list_checkpoints(tmp_path)] == [1]


# -- errors ---------------------------------------------------------------------------------------


def saved_tiny_model(tmp_path: Path) -> tuple[Checkpointer, Path]:
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    seed_all(0)
    mos = build(1)
    train(mos, 1)
    return ckpt, ckpt.save(1, app_state(mos, 0, 1), tokens=32, permanent=True)


def test_load_errors_name_the_problem(tmp_path):
    ckpt, path = saved_tiny_model(tmp_path)
    with pytest.raises(CheckpointError, match="checkpoint .*step-00000009 does not exist"):
        ckpt.load(step_dir(tmp_path, 9), app_state(build(1), 0))

    marker = (path / marker_name(0, 1)).read_bytes()
    (path / marker_name(0, 1)).unlink()
    with pytest.raises(CheckpointError, match=r"incomplete \(\.done-rank0-of-1 is missing\)"):
        ckpt.load(path, app_state(build(1), 0))
    (path / marker_name(0, 1)).write_bytes(marker)

    shard = path / "__0_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as err:
        ckpt.load(path, app_state(build(1), 0))
    assert (
        f"checkpoint {path} is incomplete (__0_0.distcp is {len(data) // 2} bytes, "
        f"listed as {len(data)})"
    ) in str(err.value)

    shard.write_bytes(bytes(64) + data[64:])  # right size, other bytes inside
    with pytest.raises(CorruptCheckpointError, match=f"checkpoint {path} is corrupt: __0_0.distcp"):
        ckpt.load(path, app_state(build(1), 0))


def test_load_lists_mismatched_keys_and_shapes(tmp_path):
    ckpt, path = saved_tiny_model(tmp_path)
    narrow = ModelConfig(d_model=32, n_layers=2, n_heads=4, mlp_hidden=128)
    with pytest.raises(CheckpointError) as err:
        ckpt.load(path, app_state(build(1, narrow), 0))
    text = str(err.value)
    assert "does not match the current model/optimizer state" in text
    assert "train_module.model.embed.weight: checkpoint [320, 64], current [320, 32]" in text
    assert (
        "train_module.model.blocks.0.attn.wq.weight: checkpoint [64, 64], current [32, 32]" in text
    )
    assert (
        "train_module.optim.state.blocks.0.attn.wk.weight.exp_avg: checkpoint [64, 64], current [32, 32]"
        in text
    )
    assert text.endswith("... and 55 more")  # 25 model tensors + 50 moments, 20 listed

    deeper = ModelConfig(d_model=64, n_layers=3, n_heads=4, mlp_hidden=128)
    with pytest.raises(CheckpointError) as err:
        ckpt.load(path, app_state(build(1, deeper), 0))
    assert "missing from checkpoint: train_module.model.blocks.2.attn.wq.weight" in str(err.value)
    assert "shape mismatch" not in str(err.value)

    shallow = ModelConfig(d_model=64, n_layers=1, n_heads=4, mlp_hidden=128)
    with pytest.raises(CheckpointError) as err:
        ckpt.load(path, app_state(build(1, shallow), 0))
    assert "unexpected in checkpoint: train_module.model.blocks.1.mlp.w_gate.weight" in str(
        err.value
    )


def test_loading_never_unpickles_arbitrary_objects(tmp_path):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    path = ckpt.save(1, {"trainer": {"step": 1, "ratio": Fraction(1, 3)}}, tokens=0, permanent=True)
    with pytest.raises(CheckpointError, match="could not be read.*Fraction"):
        ckpt.load(path, {"trainer": {"step": 0, "ratio": 0}})

    path = ckpt.save(2, tiny_state(2), tokens=0, permanent=True)
    payload = pickle.dumps(Fraction(1, 3))
    (path / ".metadata").write_bytes(payload)
    # Checksums catch accidents, not an attacker, who can rewrite the listing too.
    marker = path / marker_name(0, 1)
    record = json.loads(marker.read_text())
    record["files"][".metadata"] = {"size": len(payload), "crc32": zlib.crc32(payload)}
    marker.write_text(json.dumps(record))
    with pytest.raises(
        CheckpointError, match="unreadable .metadata.*refusing to unpickle fractions.Fraction"
    ):
        ckpt.load(path, tiny_state(0))


def test_non_tensor_values_round_trip(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    values = {"step": 3, "tokens": 2**40, "name": "x", "ratio": 0.25, "none": None, "pair": (1, 2)}
    path = ckpt.save(3, {"trainer": dict(values), "rng": rng_state(0)}, tokens=0, permanent=True)
    state = {"trainer": dict.fromkeys(values, 0), "rng": rng_state(1)}
    with caplog.at_level(logging.WARNING, logger="trainer_core.checkpoint"):
        ckpt.load(path, state)
    assert state["trainer"] == values
    assert state["rng"] == {} and "no RNG state for rank1" in caplog.text


def legacy_names_resume(run_dir: Path, rank: int, world: int) -> None:
    """Save this rank's state (its shard under FSDP2) under the parameter names used before the
    LM head became one module (``norm.weight``, ``head.weight``); a fresh model loads it into
    today's ``lm_head``: weights, Adam moments, step and schedule, and training goes on exactly
    (the same ops in the same order in this process: bit for bit)."""
    seed_all(5 + rank)
    mos = build(world)
    train(mos, K)
    ckpt = Checkpointer(run_dir, CheckpointConfig(), rank=rank, world_size=world)
    old_state = app_state(mos, rank, step=K)
    old_names = {new: old for old, new in RENAMED.items()}
    old_state["train_module"] = rename_parameters(mos.state_dict(), old_names)
    path = ckpt.save(K, old_state, tokens=K * 32, permanent=False)
    if rank == 0:
        saved_keys = set(pickle.loads((path / ".metadata").read_bytes()).state_dict_metadata)
        assert "train_module.model.head.weight" in saved_keys
        assert "train_module.optim.state.norm.weight.exp_avg" in saved_keys
    saved = local_tensors(mos)
    uninterrupted = train(mos, K)

    seed_all(999)
    fresh = build(world, init_seed=7)
    state = app_state(fresh, rank)
    ckpt.load(path, state)
    restore_rng(state["rng"], rank)
    assert state["trainer"] == {"step": K, "tokens": K * 32}
    assert fresh.scheduler.last_epoch == K
    assert_same(local_tensors(fresh), saved)
    assert train(fresh, K) == uninterrupted


def test_a_checkpoint_saved_before_the_lm_head_rename_resumes(tmp_path):
    legacy_names_resume(tmp_path, 0, 1)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_checkpoint_saved_before_the_lm_head_rename_resumes_on_two_fsdp2_ranks(
    spawn_ranks, tmp_path
):
    spawn_ranks(_rank_main, 2, "legacy_names_resume", tmp_path)

"""The GPU path on one CUDA device: bf16, compile, float8, the attention kernel, checkpoints.

Each trains the tiny run of tests/conftest.py (a 2-layer 1M model on the demo corpus) on the GPU
and compares it with the run it replaces. Tolerances are stated per test: bf16 keeps about three
significant digits, compile reorders float sums, float8 keeps two to three.
"""

from __future__ import annotations

import json

import pytest
import torch

from trainer_core.checkpoint.rng import restore_rng, rng_state
from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import ModelConfig
from trainer_core.model.attention import SDPA_BACKENDS, attention_backends_run
from trainer_core.model.transformer import Transformer
from trainer_core.parallel import float8 as float8_module
from trainer_core.parallel.float8 import MIN_CAPABILITY, converts
from trainer_core.train.build import build_trainer
from trainer_core.train.callbacks import BaseCallback

pytestmark = pytest.mark.cuda

GPU = ("--trainer.device=cuda", "--checkpoint.enabled=false")
BF16 = "--parallel.param_dtype=bfloat16"


def logged_losses(run_dir) -> list[float]:
    """Each log line's mean training loss over its interval: one micro-batch's loss drifts
    with the trajectory (float8 vs bf16 on an H100: 0.101 once in 10 log steps, the rest 0.03
    or less), the interval's mean shows a bias."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["train/loss"] for line in lines]


def fit(tiny_config, run_dir, *overrides: str) -> tuple[dict, list[float]]:
    summary = build_trainer(tiny_config(run_dir, *overrides)).fit()
    return summary, logged_losses(run_dir)


def test_bf16_tracks_fp32_over_50_steps(tmp_path, tiny_config):
    """One GPU, ``param_dtype: bfloat16``: bf16 autocast over fp32 weights. Every logged loss of
    50 steps within 0.1 of fp32's, the final eval within 0.03, and not identical (bf16 ran).
    The same runs on CPU, single micro-batch losses: 0.056 at most per logged step, 0.001 in eval."""
    steps = (*GPU, "--trainer.max_steps=50")
    trainer = build_trainer(tiny_config(tmp_path / "bf16", *steps, BF16))
    assert trainer.module.autocast_dtype == torch.bfloat16
    bf16 = trainer.fit()
    fp32, fp32_losses = fit(tiny_config, tmp_path / "fp32", *steps)
    diffs = [abs(a - b) for a, b in zip(logged_losses(tmp_path / "bf16"), fp32_losses, strict=True)]
    assert len(diffs) == 10 and 0 < max(diffs) < 0.1, diffs
    assert bf16["eval/loss"] == pytest.approx(fp32["eval/loss"], abs=0.03)
    assert fp32_losses[-1] < fp32_losses[0] - 0.5  # it learns: the curves are not flat


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-3), ("bf16", 5e-2)])
def test_compile_matches_eager(tmp_path, tiny_config, precision, tolerance):
    """Per-block torch.compile (inductor kernels) against eager over 20 steps."""
    extra = (BF16,) if precision == "bf16" else ()
    eager, eager_losses = fit(tiny_config, tmp_path / "eager", *GPU, *extra)
    compiled, compiled_losses = fit(
        tiny_config, tmp_path / "compiled", *GPU, *extra, "--parallel.compile=true"
    )
    diffs = [abs(a - b) for a, b in zip(compiled_losses, eager_losses, strict=True)]
    assert max(diffs) < tolerance, diffs
    assert compiled["eval/loss"] == pytest.approx(eager["eval/loss"], abs=tolerance)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_tracks_bf16_over_50_steps(tmp_path, tiny_config, recipe, monkeypatch):
    """float8 blocks (compiled, as float8 is meant to run) against bf16 over 50 steps: every
    log interval's mean loss within 0.1, the final eval within 0.05; exactly the 14 block linears
    converted. A GPU without float8
    tensor cores refuses the setting in one line instead. The tiny model's layers are all below
    torchao's rowwise widths, so that filter is set aside to see the rowwise casts train."""
    monkeypatch.setattr(float8_module, "float8_filter", lambda cfg: converts)
    steps = (*GPU, "--trainer.max_steps=50", BF16, "--parallel.compile=true")
    float8 = (*steps, f"--parallel.float8={recipe}")
    if torch.cuda.get_device_capability() < MIN_CAPABILITY[recipe]:
        with pytest.raises(ConfigError, match=r"parallel.float8: .* needs compute capability"):
            build_trainer(tiny_config(tmp_path / "float8", *float8))
        return
    trainer = build_trainer(tiny_config(tmp_path / "float8", *float8))
    converted = [
        n for n, m in trainer.module.model.named_modules() if "Float8Linear" in str(type(m))
    ]
    assert len(converted) == 2 * 7 and all(n.startswith("blocks.") for n in converted)
    low = trainer.fit()
    bf16, bf16_losses = fit(tiny_config, tmp_path / "bf16", *steps)
    diffs = [
        abs(a - b) for a, b in zip(logged_losses(tmp_path / "float8"), bf16_losses, strict=True)
    ]
    assert max(diffs) < 0.1, diffs
    assert low["eval/loss"] == pytest.approx(bf16["eval/loss"], abs=0.05)


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("backend", [*SDPA_BACKENDS, "auto"])
def test_the_attention_backend_that_ran(backend, kv_heads):
    """A named backend is the one whose kernel ran (forward and backward, bf16 autocast), with
    grouped-query heads too (as 3B and 7B have); left to torch, a fused kernel (flash or cuDNN)
    runs, never the math fallback."""
    cfg = ModelConfig(size="1M", n_layers=2, n_kv_heads=kv_heads, attention_backend=backend)
    model = Transformer(cfg, 128).cuda()
    tokens = torch.randint(0, cfg.vocab_size, (4, 128), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
        logits.float().logsumexp(-1).mean().backward()

    ran = attention_backends_run(step)
    if backend == "auto":
        assert len(ran) == 1 and ran <= {"flash", "cudnn"}, ran
    else:
        assert ran == {backend}


class StopAtCheckpoint(BaseCallback):
    """Ends the run like a crash right after the checkpoint of ``step`` is committed."""

    def __init__(self, step: int):
        self.step = step

    def on_checkpoint(self, step, path, permanent) -> None:
        if step == self.step:
            raise KeyboardInterrupt


def test_checkpoint_save_and_resume_on_gpu(tmp_path, tiny_config):
    """Stopped after its step-10 checkpoint and resumed, a GPU run logs the losses of an
    uninterrupted one (the math attention kernel: its backward is deterministic)."""
    run = ("--trainer.device=cuda", "--model.attention_backend=math")
    straight, straight_losses = fit(
        tiny_config, tmp_path / "straight", *run, "--checkpoint.enabled=false"
    )
    cfg = tiny_config(tmp_path / "run", *run, "--checkpoint.save_interval_steps=10")
    with pytest.raises(KeyboardInterrupt):
        build_trainer(cfg, extra_callbacks=[StopAtCheckpoint(10)]).fit()
    assert (tmp_path / "run" / "checkpoints" / "step-00000010").is_dir()
    resumed = build_trainer(cfg).fit()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [5, 10, 15, 20]
    assert [r["train/loss"] for r in lines] == pytest.approx(straight_losses, abs=1e-5)
    assert resumed["eval/loss"] == pytest.approx(straight["eval/loss"], abs=1e-5)


def test_a_gpu_runs_checkpoint_keeps_its_devices_cuda_generator():
    """The CUDA generator of the run's device is saved and restored (a CPU run's is not)."""
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.manual_seed(3)
    saved = rng_state(0, device)
    after_save = torch.rand(4, device=device)
    torch.cuda.manual_seed(4)
    assert "cuda" in saved["rank0"] and restore_rng(saved, 0, device)
    assert torch.equal(torch.rand(4, device=device), after_save)


class SyncsAreErrors(BaseCallback):
    """CUDA's own check (``set_sync_debug_mode``) turned to "error" from the end of step 1 to
    the end of step ``last``: any host sync in the steps between raises there."""

    def __init__(self, last: int):
        self.last = last

    def on_step_end(self, step: int) -> None:
        torch.cuda.set_sync_debug_mode("error" if 1 <= step < self.last else "default")


def test_steps_between_log_steps_make_no_host_sync_on_cuda(tmp_path, tiny_config):
    """The CPU test counts the ops that would sync (tests/unit/train/test_step_on_device.py);
    here CUDA itself says so, for bf16, z-loss, clipping, fused AdamW and the batch's copy.
    A list index on a device tensor once made a blocking copy every step."""
    steps = 8
    cfg = tiny_config(
        tmp_path / "run",
        *GPU,
        BF16,
        f"--trainer.max_steps={steps}",
        f"--trainer.log_interval={steps}",
        f"--trainer.eval_interval={steps}",
        "--train_module.z_loss_multiplier=1e-4",
        "--train_module.max_grad_norm=1.0",
        "--optim.fused=true",
    )
    try:
        summary = build_trainer(cfg, extra_callbacks=[SyncsAreErrors(steps - 1)]).fit()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert summary["steps"] == steps and "eval/loss" in summary


def test_the_cuda_group_takes_device_tensors_and_objects(free_port, monkeypatch):
    """A one-rank group made as a CUDA run makes it ("cpu:gloo,cuda:nccl"): the rule sends
    tensors to the GPU (NCCL), objects still gather, and a CPU tensor goes to gloo."""
    import torch.distributed as dist

    from trainer_core.parallel import process_group as pg

    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group(backend=pg.CUDA_BACKEND, device_id=torch.device("cuda", 0))
    try:
        assert pg.served_devices() == ["cuda", "cpu"]
        where = pg.collective_device(None, torch.device("cuda", 0))
        tensor = torch.ones(3, device=where)
        dist.all_reduce(tensor)
        assert where.type == "cuda" and tensor.tolist() == [1.0, 1.0, 1.0]
        on_cpu = torch.ones(2)
        dist.all_reduce(on_cpu)
        gathered = [None]
        dist.all_gather_object(gathered, {"rank": 0})
        assert gathered == [{"rank": 0}]
    finally:
        dist.destroy_process_group()

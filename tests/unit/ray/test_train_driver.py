"""The message a failed Ray Train run ends with: the resume hint only where there is a checkpoint."""

from __future__ import annotations

import pytest
import torch

from trainer_core.checkpoint.checkpointer import Checkpointer
from trainer_core.checkpoint.listing import marker_name
from trainer_core.config.sections import CheckpointConfig
from trainer_core.io.run_dir import step_dir
from trainer_core.ray.train_driver import failure_message

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

REASON = "rank 1's shard is unreadable"


def save(run_dir, step: int) -> None:
    state = {"weights": {"w": torch.zeros(2)}, "trainer": {"step": step, "tokens": step}}
    Checkpointer(run_dir, CheckpointConfig()).save(step, state, tokens=step, permanent=False)


def test_a_run_with_a_checkpoint_is_told_a_rerun_resumes_it(tmp_path):
    run_dir = tmp_path / "run"
    save(run_dir, 4)
    assert failure_message(run_dir, REASON) == (
        f"run run failed: {REASON}\n  checkpoints and metrics so far are kept in {run_dir}; "
        "fix the cause and re-run the same command to resume"
    )


def test_a_run_that_saved_nothing_gets_the_error_line_alone(tmp_path):
    """No run dir, an empty one, or only an incomplete checkpoint: nothing to resume from."""
    run_dir = tmp_path / "run"
    assert failure_message(run_dir, REASON) == f"run run failed: {REASON}"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    assert failure_message(run_dir, REASON) == f"run run failed: {REASON}"
    save(run_dir, 4)
    (step_dir(run_dir, 4) / marker_name(0, 1)).unlink()
    assert failure_message(run_dir, REASON) == f"run run failed: {REASON}"

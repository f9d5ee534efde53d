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


def save(run_dir, step: int, permanent: bool = False) -> None:
    state = {"weights": {"w": torch.zeros(2)}, "trainer": {"step": step, "tokens": step}}
    Checkpointer(run_dir, CheckpointConfig()).save(step, state, tokens=step, permanent=permanent)


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


def corrupt(run_dir, step: int) -> None:
    """Flip a byte in the middle of the checkpoint's tensor file: its size stays, its CRC not."""
    (shard,) = step_dir(run_dir, step).glob("*.distcp")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_a_run_whose_every_checkpoint_fails_its_checksums_is_not_told_a_rerun_resumes(tmp_path):
    """The checkpointer's own error says to move them away and start over: no resume hint."""
    run_dir = tmp_path / "run"
    save(run_dir, 4)
    corrupt(run_dir, 4)
    reason = f"no checkpoint of {run_dir} passes its checksums; move them away to start over"
    assert failure_message(run_dir, reason) == f"run run failed: {reason}"


def test_a_corrupt_newest_checkpoint_with_a_good_one_before_it_keeps_the_hint(tmp_path):
    run_dir = tmp_path / "run"
    save(run_dir, 4, permanent=True)  # kept when step 8 commits
    save(run_dir, 8)
    corrupt(run_dir, 8)
    assert failure_message(run_dir, REASON).endswith("re-run the same command to resume")


def test_a_lost_controller_hints_a_resume_without_reading_the_checkpoints(tmp_path):
    """Tune stops trials by removing their controllers too: the hint then lists, not reads."""
    run_dir = tmp_path / "run"
    save(run_dir, 4)
    corrupt(run_dir, 4)
    assert failure_message(run_dir, REASON, verify=False).endswith("to resume")
    assert failure_message(run_dir, REASON) == f"run run failed: {REASON}"

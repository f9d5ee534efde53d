"""The run-dir layout module: names, the run.json record and its rewrites, without torch or Ray."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer_core.errors import RunWarning
from trainer_core.io import run_dir
from trainer_core.io.run_dir import RUN_FIELDS, RunInfo, WorkerGroup

INFO = RunInfo(
    name="1M",
    num_params=1000,
    flops_per_token=6000,
    peak_lr=1e-3,
    global_batch_tokens=512,
    seq_len=64,
    total_steps=10,
    size="1M",
    tags={"ladder": "demo"},
)


def test_run_json_is_written_whole_in_the_documented_order(tmp_path):
    run_dir.write_run_json(tmp_path, INFO, "running", last_step=3)
    record = json.loads((tmp_path / "run.json").read_text())
    assert tuple(record) == RUN_FIELDS
    assert record["status"] == "running" and record["last_step"] == 3
    assert record["tags"] == {"ladder": "demo"} and record["diverged_step"] is None
    assert record["workers"] == []
    run_dir.write_run_json(tmp_path, INFO, "failed", last_step=4, error="bad shard")
    assert run_dir.read_run_json(tmp_path)["error"] == "bad shard"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]  # no .tmp left behind
    assert run_dir.read_run_json(tmp_path / "absent") is None


def test_worker_groups_are_kept_in_order_across_rewrites(tmp_path):
    """Each (re)start's placement, read back as written; marking the run stopped keeps them."""
    assert run_dir.worker_groups(tmp_path) == []
    first = WorkerGroup(start_step=0, time=1.0, ranks=[{"host": "a", "node_id": "n1"}])
    second = WorkerGroup(start_step=5, time=2.0, ranks=[{"host": "b", "node_id": "n2"}])
    run_dir.write_run_json(tmp_path, INFO, "running", last_step=5, workers=[first, second])
    assert run_dir.worker_groups(tmp_path) == [first, second]
    run_dir.mark_stopped(tmp_path)
    assert run_dir.read_run_json(tmp_path)["status"] == "stopped"
    assert run_dir.worker_groups(tmp_path) == [first, second]


def test_mark_stopped_touches_only_runs_cut_short(tmp_path):
    short, done, cut_at_end = tmp_path / "short", tmp_path / "done", tmp_path / "cut_at_end"
    for path in (short, done, cut_at_end):
        path.mkdir()
        run_dir.write_run_json(path, INFO, "running", last_step=0)
    (short / "metrics.jsonl").write_text('{"step": 5}\n{"step": 1')  # a line cut mid-write
    run_dir.write_run_json(done, INFO, "finished", last_step=10)
    # stopped by ASHA at its last report, before it could write "finished"
    (cut_at_end / "metrics.jsonl").write_text('{"step": 5}\n{"step": 10}\n')
    with pytest.warns(RunWarning, match=r"short/metrics\.jsonl:2: ignoring a line cut mid-write"):
        for path in (short, done, cut_at_end, tmp_path / "never-started"):
            run_dir.mark_stopped(path)
    assert run_dir.read_run_json(short)["status"] == "stopped"
    assert run_dir.read_run_json(short)["last_step"] == 5
    assert run_dir.read_run_json(done)["status"] == "finished"
    assert run_dir.read_run_json(cut_at_end)["status"] == "finished"
    assert run_dir.read_run_json(cut_at_end)["last_step"] == 10


def test_mark_failed_records_the_reason_where_rank_0_could_not(tmp_path):
    """A bad shard met by rank 1 (each rank reads its own rows) ends the run while rank 0, the
    one writer of run.json, never saw an error: the driver records it from Ray's error."""
    cut, done = tmp_path / "cut", tmp_path / "done"
    for path in (cut, done):
        path.mkdir()
    run_dir.write_run_json(cut, INFO, "running", last_step=0)
    (cut / "metrics.jsonl").write_text('{"step": 5}\n')
    run_dir.write_run_json(done, INFO, "finished", last_step=10)
    for path in (cut, done, tmp_path / "never-started"):
        run_dir.mark_failed(path, "rank 1: shard 3: row group 2 is corrupt")
    record = run_dir.read_run_json(cut)
    assert (record["status"], record["last_step"]) == ("failed", 5)
    assert record["error"] == "rank 1: shard 3: row group 2 is corrupt"
    assert run_dir.read_run_json(done)["status"] == "finished"
    assert not (tmp_path / "never-started").exists()


def test_checkpoint_and_metrics_names(tmp_path):
    assert run_dir.step_dir(tmp_path, 7) == tmp_path / "checkpoints" / "step-00000007"
    for name in ("step-00000002.tmp-ab12", "step-00000003.old-cd34", "step-00000004.corrupt-ef"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert [p.name for p in run_dir.scratch_dirs(tmp_path)] == [
        "step-00000002.tmp-ab12",
        "step-00000003.old-cd34",
    ]
    assert [p.name for p in run_dir.scratch_dirs(tmp_path, "old")] == ["step-00000003.old-cd34"]
    for step in (10, 2):
        run_dir.write_metrics_step(tmp_path, step, {"eval/loss": 1.5})
    (tmp_path / "metrics_stepX.json").write_text("{}")
    assert [s for s, _ in run_dir.metrics_step_files(tmp_path)] == [10, 2]  # by file name
    assert json.loads(run_dir.metrics_step_path(tmp_path, 2).read_text()) == {"eval/loss": 1.5}


@pytest.mark.parametrize(
    "module",
    ["trainer_core.io.run_dir", "trainer_core.checkpoint.listing", "trainer_core.analysis"],
)
def test_reading_results_loads_neither_torch_nor_ray(module):
    code = f"import sys, {module}; print(sorted({{'torch', 'ray'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

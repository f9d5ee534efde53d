"""The "trial" runner (``ray.runner: trial``): a run trained in its Tune trial's own process.
Equal to the plain loop, resumed from its checkpoint after its process is SIGKILLed, and bad
input failing the trial once, in one line, not retried."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from ray import tune
from reference import SIXTEEN_STEPS, fit_on_one_thread

from trainer_core.io.run_dir import TUNE
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.tune_run import (
    TrialsFailedError,
    TrialSpec,
    TuneSettings,
    max_concurrent_trials,
    run_trials,
)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

IN_TRIAL = (*SIXTEEN_STEPS, "--ray.runner=trial", "--ray.cpus_per_worker=0.8")


class KillTrialProcess(tune.Callback):
    """SIGKILLs the trial's process (the pid Tune puts in every result) at its first result of
    step ``step`` or later, once; logs every result's step and pid to ``log``."""

    def __init__(self, log: Path, step: int):
        self.log = str(log)
        self.step = step
        self.done = False

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        entry = {"step": result.get("step"), "pid": result["pid"]}
        if not self.done and (result.get("step") or 0) >= self.step:
            self.done = True
            os.kill(result["pid"], signal.SIGKILL)
            entry["killed"] = True
        with open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\n")


def records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_relaunch_where_every_run_ended_starts_neither_ray_nor_tune(
    no_local_ray, tiny_config, tmp_path, capsys
):
    """First in this file, while no Ray runs: the runs' ends are read from their records, said,
    and nothing else happens (a relaunch to see the report again took a Ray start and a trial
    process per run)."""
    import ray

    run_dir = tmp_path / "runs" / "run"
    fit_on_one_thread(tiny_config(run_dir, *SIXTEEN_STEPS))
    record = (run_dir / "run.json").read_text()
    spec = TrialSpec("run", tiny_config(run_dir, *IN_TRIAL, cls=RayTrainConfig))

    done = run_trials([spec], tmp_path, TuneSettings(), resume=False)

    assert done.grid is None and not ray.is_initialized()
    assert capsys.readouterr().out == "[run] finished before at step 16: not trained again\n"
    assert done.concurrency_report() == (
        "1 run, each ended before this launch: nothing trained, Ray and Tune not started"
    )
    assert (run_dir / "run.json").read_text() == record and not (tmp_path / TUNE).exists()


def test_a_trial_killed_mid_run_resumes_from_its_checkpoint_to_the_plain_loops_losses(
    ray_session, tiny_config, tmp_path
):
    """Results (step 8's eval, the checkpoints at 4, 8, 12) reach Tune after their checkpoint
    commits; the kill lands at the step-8 result, so the restarted trial resumes at 8 or 12.
    The trial's one CPU-share is one torch thread, as the reference's: equal to 1e-5."""
    plain_dir, run_dir = tmp_path / "plain", tmp_path / "runs" / "run"
    fit_on_one_thread(tiny_config(plain_dir, *SIXTEEN_STEPS))
    cfg = tiny_config(run_dir, *IN_TRIAL, "--ray.max_failures=1", cls=RayTrainConfig)
    log = tmp_path / "results.jsonl"

    run_trials(
        [TrialSpec("run", cfg)], tmp_path, TuneSettings(callbacks=[KillTrialProcess(log, 8)]), False
    )

    results = [json.loads(x) for x in log.read_text().splitlines()]
    killed = [r for r in results if r.get("killed")]
    assert len(killed) == 1 and killed[0]["step"] == 8
    after = results[results.index(killed[0]) + 1 :]
    assert after and all(r["pid"] != killed[0]["pid"] for r in after)
    summary = json.loads((run_dir / "run.json").read_text())
    assert summary["status"] == "finished" and summary["last_step"] == 16
    assert [g["start_step"] for g in summary["workers"]] in ([0, 8], [0, 12])
    assert "runner: trial" in (run_dir / "config.yaml").read_text()
    # the replayed steps are recorded once, with the plain loop's losses
    ours, plain = records(run_dir), records(plain_dir)
    assert [r["step"] for r in ours] == [r["step"] for r in plain]
    for key in ("train/loss_last", "eval/loss"):
        got = {r["step"]: r[key] for r in ours if key in r}
        want = {r["step"]: r[key] for r in plain if key in r}
        assert got.keys() == want.keys() and got == pytest.approx(want, abs=1e-5)


def test_a_trial_killed_with_no_retry_left_records_its_run_failed(
    ray_session, tiny_config, tmp_path
):
    """Nothing of the run outlives its trial process: the driver records the failure, which
    run.json went on calling "running" (a status only a live run may have)."""
    run_dir = tmp_path / "runs" / "run"
    cfg = tiny_config(run_dir, *IN_TRIAL, "--ray.max_failures=0", cls=RayTrainConfig)
    kill = KillTrialProcess(tmp_path / "results.jsonl", 8)
    with pytest.raises(TrialsFailedError) as failed:
        run_trials([TrialSpec("run", cfg)], tmp_path, TuneSettings(callbacks=[kill]), False)
    record = json.loads((run_dir / "run.json").read_text())
    (line,) = [x for x in str(failed.value).splitlines() if x.startswith("  run: ")]
    assert record["status"] == "failed" and record["last_step"] >= 8
    assert record["error"] == line.removeprefix("  run: ") and record["error"]


def test_bad_input_fails_the_trial_once_in_one_line(ray_session, tiny_config, tmp_path):
    """A retry could not fix missing shards: the trial fails once though restarts are allowed."""
    missing = tmp_path / "no-shards-here"
    bad = tiny_config(
        tmp_path / "runs" / "bad",
        *IN_TRIAL,
        f"--data.shards={missing}",
        "--ray.max_failures=3",
        cls=RayTrainConfig,
    )
    with pytest.raises(TrialsFailedError) as failed:
        run_trials([TrialSpec("bad", bad)], tmp_path, TuneSettings(), resume=False)
    lines = str(failed.value).splitlines()
    assert lines[0] == "1 of 1 runs failed:"
    assert lines[1].startswith("  bad: run bad failed: ") and str(missing) in lines[1]
    assert "Traceback" not in str(failed.value)
    errors = (tmp_path / "tune" / "bad" / "error.txt").read_text()
    assert "Failure # 1 " in errors and "Failure # 2 " not in errors


class MostRunning(tune.Callback):
    """The most trials Tune had running at once, seen at each result."""

    def __init__(self):
        self.most = 0

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.most = max(self.most, sum(t.status == "RUNNING" for t in trials))


def test_trials_at_once_reaches_tune(ray_session, tiny_config, tmp_path):
    """``ray.max_concurrent_trials`` (TuneSettings.max_concurrent) caps what Tune runs at once,
    below what the cluster's CPUs would hold: an autoscaling cluster with no GPU node yet is
    sized at launch, so a ladder names the width it scales to."""
    specs = [
        TrialSpec(name, tiny_config(tmp_path / "runs" / name, *IN_TRIAL, cls=RayTrainConfig))
        for name in ("a", "b")
    ]
    assert max_concurrent_trials(specs) == 2  # two 0.8-CPU trials fit the session's 2 CPUs
    seen = MostRunning()
    run = run_trials(specs, tmp_path, TuneSettings(max_concurrent=1, callbacks=[seen]), False)
    assert seen.most == 1 and run.concurrency == 1
    for name in ("a", "b"):
        assert json.loads((tmp_path / "runs" / name / "run.json").read_text())["last_step"] == 16

"""Runs through Ray Train: equality with the plain loop, worker-failure recovery, a lost
controller retried by Tune, W&B offline, bad input failing at once (no retries) with one line."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import ray.train
import ray_train_hooks
from ray import tune
from ray_train_hooks import FAILURES_ENV, CountFailures, KillWorker
from reference import SIXTEEN_STEPS
from restarts import restart_lines

from trainer_core.config.loader import from_dict, to_dict
from trainer_core.config.sections import TrainConfig
from trainer_core.data.shards import DataError
from trainer_core.errors import RunFailedError
from trainer_core.ray.node_view import MARK, DriverView
from trainer_core.ray.run_config import RayTrainConfig
from trainer_core.ray.train_driver import build_torch_trainer, ray_train_reason, run_training
from trainer_core.ray.tune_run import TrialsFailedError, TrialSpec, TuneSettings, run_trials
from trainer_core.train.build import build_trainer

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ON_RAY = (*SIXTEEN_STEPS, "--ray.num_workers=2", "--ray.cpus_per_worker=0.5")
"""The tiny run on two Ray Train workers, 16 steps with a checkpoint every 4."""


@pytest.fixture(scope="session")
def config(tiny_config):
    """``config(run_dir, *overrides)``: the tiny run on Ray (:data:`ON_RAY`)."""

    def make(run_dir: Path, *overrides: str) -> RayTrainConfig:
        return tiny_config(run_dir, *ON_RAY, *overrides, cls=RayTrainConfig)

    return make


def losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss_last"] for r in lines if "train/loss_last" in r}


@pytest.fixture(scope="module")
def reference_run(ray_session, config, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ray") / "reference"
    summary = run_training(config(run_dir, "--tracking.wandb=true"))
    return run_dir, summary


def without_ray(cfg: RayTrainConfig) -> TrainConfig:
    """The same run without its ray section, for the plain (no Ray) loop."""
    data = to_dict(cfg)
    data.pop("ray")
    return from_dict(TrainConfig, data)


def test_two_worker_run_matches_plain_loop(reference_run, config, tmp_path):
    run_dir, summary = reference_run
    assert summary["status"] == "finished" and summary["last_step"] == 16
    # run.json says where the ranks ran: one worker group, both ranks on this Ray's one node
    (group,) = summary["workers"]
    node = ray.get_runtime_context().get_node_id()
    assert group["start_step"] == 0
    assert [r["node_id"] for r in group["ranks"]] == [node, node]
    build_trainer(without_ray(config(tmp_path / "plain"))).fit()
    ray_losses, plain = losses(run_dir), losses(tmp_path / "plain")
    assert sorted(ray_losses) == list(range(2, 17, 2))
    for step, value in plain.items():
        assert ray_losses[step] == pytest.approx(value, abs=1e-4), step


def test_wandb_offline_files_and_no_secrets(reference_run):
    run_dir, _ = reference_run
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1
    assert list(offline[0].glob("*.wandb"))
    dumped = (run_dir / "config.yaml").read_text() + (run_dir / "run.json").read_text()
    assert "api_key" not in dumped.lower()


def test_finished_run_is_not_rerun(reference_run, config):
    run_dir, summary = reference_run
    before = (run_dir / "metrics.jsonl").stat().st_mtime
    again = run_training(config(run_dir))
    assert again["last_step"] == 16 and (run_dir / "metrics.jsonl").stat().st_mtime == before


def test_a_worker_that_does_not_see_the_drivers_run_dir_fails_at_once(
    ray_session, config, tmp_path
):
    """As a worker on a node whose run dir is its own local one: one line naming the setting,
    no training there (its results would stay on that node)."""
    run_dir = tmp_path / "run"
    view = DriverView("10.0.0.1", str(run_dir / MARK), "the-drivers-token")
    with pytest.raises(ray.train.TrainingFailedError) as failed:
        build_torch_trainer(config(run_dir), view=view).fit()
    assert ray_train_reason(failed.value).startswith(
        f"trainer.run_dir {run_dir}: this node ("
    ) and "does not see the dir the driver wrote on node 10.0.0.1" in ray_train_reason(failed.value)
    assert not (run_dir / "run.json").exists()


# Ray's processes cannot import the tests: they get these classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
ray.cloudpickle.register_pickle_by_value(ray_train_hooks)


def interrupted_run(cfg: RayTrainConfig, steps: int) -> None:
    """The run dir of ``cfg`` as left by a plain-loop run stopped after ``steps`` steps."""
    trainer = build_trainer(without_ray(cfg))
    batches = trainer.train_batches

    def stop(start):
        yield from itertools.islice(batches(start), steps - start)
        raise KeyboardInterrupt

    trainer.train_batches = stop
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()


def our_files(run_dir: Path) -> dict[str, bytes]:
    """The run dir's files that rayladder writes (Ray Train adds its own beside them)."""
    names = ["config.yaml", "run.json", "metrics.jsonl"]
    files = [run_dir / n for n in names] + sorted((run_dir / "checkpoints").rglob("*"))
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in files if p.is_file()}


def test_a_refused_checkpoint_fails_at_once_in_one_line_and_changes_nothing(
    ray_session, config, tiny_args, run_script, tmp_path, monkeypatch
):
    """No retry can make a 2-layer checkpoint fit a 3-layer model (a run branched from it):
    one attempt, not four, and ``workflows/train.py`` prints why in one message, without the
    driver's or the worker's traceback (Ray's own log lines from its processes come to stderr
    too). Relaunched into the 2-layer run's own dir, it is refused before Ray starts."""
    run_dir = tmp_path / "run"
    interrupted_run(config(run_dir, "--checkpoint.keep_steps=[4]"), 4)
    before = our_files(run_dir)
    failures = tmp_path / "failures.txt"
    monkeypatch.setenv("RAY_TRAIN_CALLBACKS", "ray_train_hooks.CountFailures")
    monkeypatch.setenv(FAILURES_ENV, str(failures))
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    deeper = ("--model.n_layers=3", "--ray.max_failures=3")
    code, _, err = run_script("workflows/train.py", *tiny_args(run_dir, *ON_RAY, *deeper))
    assert code == 2 and "records a run trained with other model.n_layers" in err
    assert not failures.exists()
    branch = (*deeper, f"--checkpoint.resume_from={checkpoint}")
    code, _, err = run_script(
        "workflows/train.py", *tiny_args(tmp_path / "branch", *ON_RAY, *branch)
    )
    assert code == 2
    assert len(failures.read_text().splitlines()) == 1
    ours = err[err.index("error: run branch failed: ") :].splitlines()
    assert ours[0] == (
        f"error: run branch failed: checkpoint {checkpoint} does not "
        "match the current model/optimizer state (different config?):"
    )
    # The branch saved nothing: no promise that a re-run resumes it.
    assert not any("checkpoints and metrics so far are kept in" in line for line in ours)
    assert "Traceback" not in "\n".join(ours)
    assert "RunFailedError" not in err and "FatalRunError" not in err
    assert our_files(run_dir) == before


def test_a_run_ray_train_gives_up_on_is_recorded_failed_with_the_reason(
    ray_session, config, tmp_path
):
    """Rank 1 SIGKILLed with no restart allowed: rank 0, the one writer of run.json, saw no error
    of its own and left it "running"; the driver now records the run failed, with Ray's reason,
    and the work so far stays."""
    run_dir = tmp_path / "run"
    kill = KillWorker(tmp_path / "hook.jsonl", step=8, rank=1)
    with pytest.raises(RunFailedError) as failed:
        run_training(config(run_dir, "--ray.max_failures=0"), callbacks=[kill])
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and 8 <= record["last_step"] < 16
    assert record["error"] and record["error"] in str(failed.value)
    assert (run_dir / "checkpoints" / "step-00000008").is_dir()


def test_a_corrupt_checkpoint_costs_one_restart_from_the_one_before(
    reference_run, config, tmp_path, capfd
):
    """The newest checkpoint (step 8, from a plain-loop run stopped there) fails its checksums
    after Ray Data was set up to start at it: the workers restart once, said in one line with
    no traceback, the data starts at step 4, and the run ends at the reference run's losses,
    each replayed step logged once. (A SIGKILLed worker's restart: the S3 ladder's test,
    tests/e2e/test_object_storage_on_ray.py.)"""
    ref_dir, ref_summary = reference_run
    run_dir = tmp_path / "run"
    interrupted_run(config(run_dir, "--checkpoint.keep_steps=[4, 8]"), 8)
    shard = run_dir / "checkpoints" / "step-00000008" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    failures = tmp_path / "failures.txt"
    summary = run_training(
        config(run_dir, "--ray.max_failures=2"), callbacks=[CountFailures(failures)]
    )
    assert len(failures.read_text().splitlines()) == 1
    out, err = capfd.readouterr()
    (said,) = restart_lines(out)
    assert said["run"] == "run" and said["count"] == "restart 1, ray.max_failures 2", said
    assert re.fullmatch(
        r"ranks? [01, ]+: resumed at step 4, not 8: the checkpoint of step 8 failed its "
        r"checksums after the data was set to start there",
        said["causes"],
    ), said
    assert "Traceback" not in out + err
    assert list((run_dir / "checkpoints").glob("step-00000008.corrupt-*"))
    assert summary["status"] == "finished" and summary["last_step"] == 16
    # run.json's worker groups: the last one started at the fallback (4)
    assert summary["workers"][-1]["start_step"] == 4
    # the plain loop's checkpoint, so the tolerance of the plain-loop-against-Ray comparison
    assert summary["train/loss_last"] == pytest.approx(ref_summary["train/loss_last"], abs=1e-4)
    assert summary["eval/loss"] == pytest.approx(ref_summary["eval/loss"], abs=1e-4)
    # the replayed steps are recorded once: the metrics file has the reference's steps
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").open()]
    ref_steps = [json.loads(x)["step"] for x in (ref_dir / "metrics.jsonl").open()]
    assert steps == ref_steps == sorted(set(steps))
    assert losses(run_dir) == pytest.approx(losses(ref_dir), abs=1e-4)


def test_unusable_shards_fail_in_the_driver_before_ray_train_starts(config, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match=r"manifest\.json: unreadable manifest"):
        run_training(config(tmp_path / "run", f"--data.shards={shards}"))
    assert not (tmp_path / "run").exists()


def console(capfd, ray_log: list[logging.LogRecord]) -> str:
    """What the test printed and Ray logged, as the console shows it (tracebacks included)."""
    out, err = capfd.readouterr()
    formatter = logging.Formatter()
    return out + err + "\n".join(formatter.format(r) for r in ray_log)


def test_a_failed_trial_fails_the_experiment_and_names_the_run(
    ray_session, config, tmp_path, capfd, ray_log
):
    """A trial that errors is not a finished experiment: the error names the run and the cause,
    and the run is not recorded as stopped early. Bad input is not retried though Tune may
    retry the trial (``ray.max_failures=3``), and the console shows no traceback: Tune's report
    of the failure (~35 lines) is dropped, the error's summary says it in one line."""
    missing = tmp_path / "no-shards-here"
    bad = config(tmp_path / "runs" / "bad", f"--data.shards={missing}", "--ray.max_failures=3")
    with pytest.raises(TrialsFailedError) as failed:
        run_trials([TrialSpec("bad", bad)], tmp_path, TuneSettings(), resume=False)
    message = str(failed.value)
    assert message.startswith("1 of 1 runs failed:\n  bad: ")
    assert str(missing) in message.splitlines()[1] and "--resume" in message
    assert "Traceback" not in message
    assert not (tmp_path / "runs" / "bad" / "run.json").exists()
    errors = (tmp_path / "tune" / "bad" / "error.txt").read_text()
    assert "Failure # 1 " in errors and "Failure # 2 " not in errors
    shown = console(capfd, ray_log)
    assert "Traceback" not in shown and "Trials did not complete" not in shown


def controller_of(trial_pid: int) -> int:
    """The pid of the Ray Train controller that the trial process ``trial_pid`` owns, from Ray's
    actor table (GCS, no dashboard needed): the one whose owner's address is the trial's."""
    from ray._private.state import actors

    alive = [a for a in actors().values() if a["State"] == "ALIVE"]
    (trial,) = [a for a in alive if a["Pid"] == trial_pid]

    def where(address: dict) -> tuple:
        return address["IPAddress"], address["Port"]

    (pid,) = [
        a["Pid"]
        for a in alive
        if a["ActorClassName"] == "TrainController"
        and where(a["OwnerAddress"]) == where(trial["Address"])
    ]
    return pid


class KillController(tune.Callback):
    """SIGKILLs the trial's Ray Train controller, once, at the trial's first result of step
    ``step`` or later: a report follows its step's checkpoint, so the run has one to resume
    from. The controller is the one the trial's process (its pid in the result) owns."""

    def __init__(self, step: int):
        self.step = step
        self.killed: int | None = None

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if self.killed is not None or (result.get("step") or 0) < self.step:
            return
        self.killed = controller_of(result["pid"])
        os.kill(self.killed, signal.SIGKILL)


def trial_losing_its_controller(cfg: RayTrainConfig, exp_dir: Path, kill: KillController) -> None:
    """``cfg`` as one Tune trial under ``exp_dir`` whose Ray Train controller ``kill`` SIGKILLs."""
    run_trials([TrialSpec("run", cfg)], exp_dir, TuneSettings(callbacks=[kill]), resume=False)


def test_a_lost_ray_train_controller_costs_its_trial_one_retry(
    ray_session, config, tmp_path, capfd, ray_log
):
    """The trial's Ray Train controller SIGKILLed mid-run (its workers die with it): the trial's
    driver records the run failed with why, Tune retries the trial (``ray.max_failures=1``)
    and the retry resumes the run from its latest checkpoint to the end. The console says so
    in one line, with no traceback."""
    run_dir, kill = tmp_path / "runs" / "run", KillController(step=8)
    trial_losing_its_controller(config(run_dir, "--ray.max_failures=1"), tmp_path, kill)
    assert kill.killed is not None
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["last_step"] == 16
    first, again = [g["start_step"] for g in record["workers"]]
    assert first == 0 and again in (4, 8, 12)
    shown = console(capfd, ray_log)
    (retry,) = [line for line in shown.splitlines() if line.startswith("[run] trial failed")]
    assert "(run run failed: its Ray Train controller was lost: " in retry
    assert retry.endswith("retrying it from its latest checkpoint (retry 1 of 1)")
    assert "Traceback" not in shown


def test_a_lost_controller_with_no_retry_left_records_its_run_failed(ray_session, config, tmp_path):
    """``ray.max_failures=0``: the trial fails for good, and nothing of the run is left to say
    so but the experiment's driver; run.json went on saying "running" (the lost controller's
    error is a one-line run failure, which the driver took for a refused launch)."""
    run_dir, kill = tmp_path / "runs" / "run", KillController(step=8)
    with pytest.raises(TrialsFailedError) as failed:
        trial_losing_its_controller(config(run_dir, "--ray.max_failures=0"), tmp_path, kill)
    assert kill.killed is not None
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and record["last_step"] >= 8
    assert "its Ray Train controller was lost" in record["error"]
    assert "its Ray Train controller was lost" in str(failed.value)


def test_a_run_started_from_another_runs_checkpoint_on_ray(reference_run, config, tmp_path):
    """``checkpoint.resume_from`` on Ray, its two workers reading their own rows
    (``ray.reader: worker``, the only two-worker run on that reader): each rank starts at that
    checkpoint's step (not the new run dir's latest, which has none) with its own share of the
    batch, so the branch continues the reference, which read through Ray Data. Ray Data's
    datasets start at :func:`resume_step` (unit-tested to honour ``resume_from``), shown at a
    step other than 0 by the corrupt-checkpoint test above. The source checkpoint comes from
    the plain loop (no Ray run only to keep its step 8)."""
    ref_dir, _ = reference_run
    source = tmp_path / "source"
    interrupted_run(config(source, "--checkpoint.keep_steps=[8]"), 8)
    start = source / "checkpoints" / "step-00000008"
    branch_dir = tmp_path / "branch"
    branch = run_training(
        config(branch_dir, f"--checkpoint.resume_from={start}", "--ray.reader=worker")
    )
    assert branch["status"] == "finished" and branch["last_step"] == 16
    assert "reader: worker" in (branch_dir / "config.yaml").read_text()
    resumed = losses(branch_dir)
    assert min(resumed) > 8
    expected = {step: loss for step, loss in losses(ref_dir).items() if step > 8}
    # the plain loop's checkpoint, so the tolerance of the plain-loop-against-Ray comparison
    assert resumed == pytest.approx(expected, abs=1e-4)

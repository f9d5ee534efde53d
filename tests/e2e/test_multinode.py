"""A ladder on a real two-node Ray cluster on this machine, and a node lost mid-run; a local
`ladder.py --benchmark` beside that cluster.

The cluster is started as a user starts one (:mod:`ray_cluster`): a head and a worker node of
1 CPU each. A tiny 2-size ladder runs one 0.8-CPU worker per size; its trial drivers (and so
their Ray Train controllers) sit on the head, the Tune driver's node, and take no CPU, so one
size's worker fits on the head and the other's only on the worker node. Both runs are held at
their step-5 report (:class:`ray_train_hooks.HoldUntilReleased`); the test SIGKILLs the worker
node's raylet, starts a replacement node and releases them: Ray Train restarts the lost run's
worker group from its latest complete checkpoint on the capacity left, the other run goes on.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray_cluster import RayCluster
from ray_train_hooks import RELEASE_ENV, read_log
from reference import fit_on_one_thread
from restarts import restart_lines
from waiting import wait_for

from trainer_core.config.loader import from_dict, load_yaml
from trainer_core.config.sections import TrainConfig

pytestmark = [pytest.mark.ray, pytest.mark.slow]

LADDER = "workflows/ladder.py"
SIZES = ("300K", "1M")
HEAD, WORKER, SPARE = "rl_head", "rl_worker", "rl_spare"
"""Each node's resource label: the head, the worker node that is lost, its replacement."""
DETECTION = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
"""The GCS declares a silent node dead after ~3 missed 1 s checks (Ray's default: 5 of 3 s)."""
HOLD_STEP = 5
NO_AUTH = {"RAY_AUTH_MODE": "disabled"}
"""The cluster runs without token auth (as cluster.yaml's does), and so must every client: this
process (the session's setting, see conftest) and the ladder driver it starts."""


@dataclass
class MultiNode:
    cluster: RayCluster
    hook_log: Path
    release: Path


@pytest.fixture(scope="module")
def multinode(tmp_path_factory, _ray_owner, repo_root):
    """A head and a worker node, this process connected to them; every node stopped after."""
    import ray

    from trainer_core.ray.runtime import init_ray

    if ray.is_initialized():
        ray.shutdown()  # the session's local Ray: this process joins the cluster instead
    root = tmp_path_factory.mktemp("multinode")
    hook_log, release = root / "hook.jsonl", root / "release"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    pythonpath = [
        str(repo_root / "tests" / "support"),
        *filter(None, [os.environ.get("PYTHONPATH")]),
    ]
    env.update(
        NO_AUTH,
        RAY_TRAIN_CALLBACKS="ray_train_hooks.HoldUntilReleased",
        PYTHONPATH=os.pathsep.join(pythonpath),
        **{RELEASE_ENV: f"{HOLD_STEP}:{hook_log}:{release}"},
    )
    cluster = RayCluster(root, env, DETECTION)
    try:
        # The worker node starts once the head runs: two nodes starting at once on 2 cores
        # compete with the head's GCS for the 30 s Ray gives it.
        cluster.start_head_and_wait(cpus=1, label=HEAD, timeout=120)
        cluster.add_node(cpus=1, label=WORKER)
        init_ray(cluster.address)
        cluster.wait_alive({HEAD, WORKER}, timeout=120)
        yield MultiNode(cluster, hook_log, release)
    finally:
        ray.shutdown()
        cluster.close()


def hook_records(multinode: MultiNode, key: str) -> list[dict]:
    """The hook's lines that carry ``key`` (held, controller, failure), in order."""
    found = read_log(multinode.hook_log) if multinode.hook_log.exists() else []
    return [r for r in found if key in r]


def losses(run_dir: Path, key: str = "train/loss_last") -> dict[int, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in lines if key in r}


def uninterrupted(run_dir: Path, out: Path) -> Path:
    """The same run as ``run_dir``'s config, in this process without Ray (the local reader
    yields the batches Ray Data does: tests/e2e/test_ray_data.py) nor checkpoints, into ``out``."""
    data = load_yaml(run_dir / "config.yaml")
    data.pop("ray")
    data["trainer"]["run_dir"] = str(out)
    data["checkpoint"]["enabled"] = False
    fit_on_one_thread(from_dict(TrainConfig, data))
    return out


def test_a_ladder_spans_two_nodes_and_a_lost_node_costs_one_run_a_restart(
    multinode, tiny_experiment, processes, tmp_path, capsys
):
    cluster = multinode.cluster
    config = tiny_experiment(
        "exp",
        sizes=list(SIZES),
        duration={"chinchilla_multiple": 0.0009765625},  # 15 and 21 steps
        run={
            "trainer": {"log_interval": 1, "eval_interval": 1000000},
            "checkpoint": {"save_interval_steps": 5},
        },
        ray={"address": cluster.address, "reader": "ray_data"},  # restarts rebuild Ray Data
    )
    exp = tmp_path / "exp"
    log = tmp_path / "ladder.log"
    ladder = processes.start(sys.executable, LADDER, "--config", config, log=log, env=NO_AUTH)
    processes.wait_until(lambda: len(hook_records(multinode, "held")) == 2, ladder, log, 300)

    nodes = cluster.node_ids()
    runs = {s: json.loads((exp / "runs" / s / "run.json").read_text()) for s in SIZES}
    # both nodes train, one run (of one worker) on each
    placed = {s: [r["node_id"] for r in run["workers"][0]["ranks"]] for s, run in runs.items()}
    assert sorted(placed.values()) == sorted([[nodes[HEAD]], [nodes[WORKER]]])
    (victim,) = [s for s in SIZES if placed[s] == [nodes[WORKER]]]
    (other,) = set(SIZES) - {victim}

    killed_at = time.time()
    os.kill(cluster.node(WORKER).raylet_pid(), signal.SIGKILL)
    cluster.add_node(cpus=1, label=SPARE)
    multinode.release.touch()
    wait_for(lambda: WORKER not in cluster.node_ids(), timeout=60)
    declared_dead_s = time.time() - killed_at
    ladder.wait(timeout=300)
    assert ladder.returncode == 0, log.read_text()[-4000:]

    runs = {s: json.loads((exp / "runs" / s / "run.json").read_text()) for s in SIZES}
    for run in runs.values():
        assert run["status"] == "finished" and run["last_step"] == run["total_steps"]
    # every trial driver, so every Ray Train controller, ran on the head (the Tune driver's
    # node): none was lost with the worker node
    controllers = hook_records(multinode, "controller")
    assert sorted(r["run"] for r in controllers) == sorted(SIZES)
    assert {r["controller"] for r in controllers} == {nodes[HEAD]}
    # the lost run restarted once, on a live node, from a checkpoint at or after the hold;
    # the other run was never restarted
    failures = hook_records(multinode, "failure")
    assert [r["run"] for r in failures] == [victim]
    assert len(runs[other]["workers"]) == 1
    _, restart = runs[victim]["workers"]
    (moved_to,) = [r["node_id"] for r in restart["ranks"]]
    assert moved_to != nodes[WORKER] and moved_to in cluster.node_ids().values()
    assert restart["start_step"] >= HOLD_STEP
    # Ray's words for the loss ("The actor's node was terminated unexpectedly: health check
    # failed ...") or, when the controller saw it first, ours for an unreachable worker
    (said,) = restart_lines(log.read_text())
    assert said["run"] == f"exp-{victim}" and said["causes"].startswith("rank 0: "), said
    assert "node" in said["causes"] and said["count"] == "restart 1, ray.max_failures 3"

    reference = uninterrupted(exp / "runs" / victim, tmp_path / "reference")
    got, want = losses(exp / "runs" / victim), losses(reference)
    assert sorted(got) == sorted(want) == list(range(1, runs[victim]["total_steps"] + 1))
    assert got == pytest.approx(want, abs=1e-5)
    final = max(got)
    evals = losses(exp / "runs" / victim, "eval/loss"), losses(reference, "eval/loss")
    assert evals[0][final] == pytest.approx(evals[1][final], abs=1e-5)
    with capsys.disabled():
        print(
            f"\nnode loss: {victim} held at step {HOLD_STEP} on the lost node; declared dead "
            f"{declared_dead_s:.1f} s after the raylet SIGKILL, its controller acted at "
            f"{failures[0]['failure'] - killed_at:.1f} s, training resumed from step "
            f"{restart['start_step']} at {restart['time'] - killed_at:.1f} s on the "
            f"{'head' if moved_to == nodes[HEAD] else 'replacement node'}; final loss "
            f"{got[final]:.6f} vs uninterrupted {want[final]:.6f} (|diff| "
            f"{abs(got[final] - want[final]):.1e}), eval {evals[0][final]:.6f} vs "
            f"{evals[1][final]:.6f}"
        )


def test_a_local_benchmark_beside_a_started_cluster_keeps_its_placement_group_guard(
    multinode, processes, tiny_experiment, tmp_path
):
    """The `ray start` cluster above stays up (as the README's walk-through leaves one) while
    ``ladder.py --benchmark`` starts a local Ray of its own: Ray Train's placement-group cleaner
    in the local Ray looks its controller up in its own cluster, not the other one, so it neither
    crashes ("multiple active Ray instances") nor takes the live controller for dead; one worker
    group, no noise, and the benchmark's figures: 20 steps without checkpoints, tokens/s and MFU."""
    config = tiny_experiment("exp", sizes=["1M"], ray={"address": "local"})
    out = processes.python(LADDER, "--config", config, "--benchmark", "1M", timeout=240)
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-3000:]
    assert "PlacementGroupCleaner" not in output and "Traceback" not in output
    assert "placement group" not in output.lower()
    match = re.search(
        r"benchmark 1M: ([\d,]+) tokens/s per device, MFU ([\d.]+)% on 1 device", out.stdout
    )
    assert match, out.stdout[-2000:]
    assert int(match.group(1).replace(",", "")) > 0 and 0 < float(match.group(2)) < 100
    (run_dir,) = (tmp_path / "exp" / "benchmarks").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and len(record["workers"]) == 1
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 20 and not (run_dir / "checkpoints").exists()


def test_joining_a_cluster_without_its_dashboard_warns_of_the_cleaners_it_leaves(
    tmp_path, processes
):
    """Ray Train's placement-group cleaner learns that its run ended through the dashboard's
    state API: on a cluster started without the dashboard one stayed after every killed run
    (~200 MB each). A script joining such a cluster says so in one line, before any run."""
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, **NO_AUTH}
    cluster = RayCluster(tmp_path, env, {})
    try:
        cluster.start_head_and_wait(cpus=1, label=HEAD, timeout=120, dashboard=False)
        joined = processes.python(
            "-c",
            "from trainer_core.config.cli import exit_on_error\n"
            "from trainer_core.ray.runtime import init_ray\n"
            f"exit_on_error(lambda: init_ray({cluster.address!r}))",
            env=env,
        )
    finally:
        cluster.close()
    assert joined.returncode == 0, joined.stderr[-3000:]
    said = [line for line in joined.stderr.splitlines() if line.startswith("warning: ")]
    assert said == [
        f"warning: the Ray cluster at {cluster.address} runs without its dashboard: each Ray "
        "Train run leaves a placement-group cleaner behind (a process of ~200 MB that never "
        "exits: it learns that its run ended through the dashboard's state API); start the "
        "cluster with the dashboard, as `ray start --head` and cluster.yaml do unless "
        "--include-dashboard=false"
    ]

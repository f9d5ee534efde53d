"""The ladder workflow's checks before any trial: dry runs (CPU and the GPU config, the ladder's
and its LR sweep's), bad input.
Ladders that train: tests/e2e/test_object_storage_on_ray.py (killed and resumed on S3) and
tests/e2e/test_multinode.py (a node lost; the benchmark mode beside a started cluster)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

LADDER = "workflows/ladder.py"
SWEEP = "workflows/lr_sweep.py"


@pytest.fixture
def ladder_yaml(tiny_experiment) -> Path:
    """1M and 3M for 1/1024 of their Chinchilla tokens, a checkpoint every 5 steps, in
    ``<tmp_path>/exp``."""
    return tiny_experiment(
        "exp",
        sizes=["1M", "3M"],
        duration={"chinchilla_multiple": 0.0009765625},
        run={
            "trainer": {"log_interval": 5, "eval_interval": 1000000},
            "checkpoint": {"save_interval_steps": 5},
        },
    )


def test_dry_run_from_a_shell_prints_the_plan_and_plots_the_schedule(
    processes, ladder_yaml, tmp_path
):
    out = processes.python(LADDER, "--config", ladder_yaml, "--dry-run")
    assert out.returncode == 0, out.stderr
    for column in ("batch tokens", "micro seqs", "accum", "peak lr", "ckpt steps", "device-h"):
        assert column in out.stdout
    assert "1M" in out.stdout and "3M" in out.stdout
    png = tmp_path / "exp" / "lr_schedule.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


EVAL_REPEATS = re.compile(r"eval windows asked of .*(\d count twice|each counts up to \d+ times)")


def test_dry_runs_say_which_runs_would_read_their_data_twice(
    run_script, ladder_yaml, make_shards, random_texts, tmp_path
):
    """A ladder (and its sweep) planned past its shards' training windows, or evaluated on more
    windows than the validation split holds, trained on without a word before."""
    shards = make_shards(random_texts(60))
    data = (f"--run.data.shards={shards}", "--vocab_size=320")
    code, out, err = run_script(LADDER, "--config", str(ladder_yaml), "--dry-run", *data)
    assert code == 0, err
    said = [line for line in out.splitlines() if str(shards) in line]
    for size in ("1M", "3M"):
        mine = [line for line in said if line.startswith(f"warning: {size}: {shards}: ")]
        assert len(mine) == 2 and "times over" in mine[0] and EVAL_REPEATS.search(mine[1]), said
    code, out, err = run_script(
        SWEEP,
        "--config",
        str(ladder_yaml),
        "--dry-run",
        "--sizes=1M",
        *data,
        f"--sweep.dir={tmp_path / 's'}",
    )
    assert code == 0, err
    assert f"warning: every run: {shards}: " in out and EVAL_REPEATS.search(out)
    code, out, err = run_script(LADDER, "--config", str(ladder_yaml), "--dry-run")
    assert code == 0, err
    assert "times over" not in out and not EVAL_REPEATS.search(out)


def test_dry_runs_name_the_data_the_runs_would_train_on(
    run_script, ladder_yaml, make_shards, random_texts, repo_root, tmp_path
):
    """A ladder without run.data.shards trained on the demo corpus without a word: the first
    line of a ladder's (and a sweep's) plan now names the data, its tokenizer and its tokens."""
    from trainer_core.data.shards import verify_shards

    code, out, err = run_script(LADDER, "--config", str(ladder_yaml), "--dry-run")
    assert code == 0, err
    assert re.fullmatch(
        r"data: the built-in demo corpus \(Python standard library; run.data.shards sets yours\), "
        r"byte tokenizer \(vocab 259\), [1-9][\d,]* train / [1-9][\d,]* validation tokens",
        out.splitlines()[0],
    )
    shards = make_shards(random_texts(60))
    manifest = verify_shards(shards)
    said = (
        f"data: {shards}, byte tokenizer (vocab 259), {manifest.num_train_tokens:,} train / "
        f"{manifest.num_val_tokens:,} validation tokens\n"
    )
    data = (f"--run.data.shards={shards}", "--vocab_size=320")
    code, out, err = run_script(LADDER, "--config", str(ladder_yaml), "--dry-run", *data)
    assert code == 0, err
    assert out.startswith(said)
    sweep_dir = f"--sweep.dir={tmp_path / 's'}"
    code, out, err = run_script(SWEEP, "--config", str(ladder_yaml), "--dry-run", *data, sweep_dir)
    assert code == 0, err
    assert out.startswith(said + "LR sweep ")
    gpu = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    code, out, err = run_script(
        LADDER, "--config", str(gpu), "--dry-run", f"--dir={tmp_path / 'g'}"
    )
    assert code == 0, err
    assert out.startswith(
        "data: /mnt/shared/shards/corpus (not opened here: see the warning below)\n"
    )


def test_gpu_dry_run_plans_without_the_cluster_data(run_script, repo_root, tmp_path):
    """The GPU config's shards live on the cluster: the plan comes from the config, with a
    warning, and the mesh, memory and headroom per size."""
    gpu = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    args = ("--config", str(gpu), "--dry-run", f"--dir={tmp_path / 'gpu'}", "--run.parallel.tp=2")
    code, out, err = run_script(LADDER, *args)
    assert code == 0, err
    assert "warning: /mnt/shared/shards/corpus/manifest.json: no shard manifest there" in out
    assert "a launch stops here" in out
    for column in ("mesh r/s/tp", "mem GiB", "headroom", "grad reduce"):
        assert column in out
    assert re.search(r"│ 1B .*│ +64 │ +1/32/2 │ +32 │", out)
    assert (tmp_path / "gpu" / "lr_schedule.png").exists()
    assert "note: max_devices" not in out  # 64 devices: 8 whole nodes
    code, out, err = run_script(LADDER, *args, "--max_devices=37")
    assert code == 0, err
    assert (
        "note: max_devices 37: runs use at most 32 (a power of two within a node or whole " in out
    )
    code, _, err = run_script(LADDER, *args[:2], f"--dir={tmp_path / 'gpu'}")
    assert code == 2 and "no shard manifest there" in err  # a launch stops


def test_gpu_dry_run_makes_no_cluster_dir_here(run_script, repo_root, tmp_path, monkeypatch):
    """A dir whose parents this machine lacks (a cluster's /mnt/shared/...) is not made: a
    stray tree would shadow the mount point. The plot goes to the current dir instead; the
    local default dir is still made."""
    monkeypatch.chdir(tmp_path)
    gpu = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    cluster = tmp_path / "mnt" / "shared" / "runs" / "ladder"
    code, out, err = run_script(LADDER, "--config", str(gpu), "--dry-run", f"--dir={cluster}")
    assert code == 0, err
    png = tmp_path / "olmo-style-lr_schedule.png"
    assert f"LR schedule plot: {png}\n" in out and png.read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "mnt").exists()
    code, out, err = run_script(LADDER, "--dry-run")
    assert code == 0, err
    assert (tmp_path / "runs" / "ladder-demo" / "lr_schedule.png").exists()


def test_sweep_dry_run_warns_where_a_launch_stops(run_script, repo_root, tmp_path):
    """As the ladder's: the cluster's shards and an uncreatable dir are warnings."""
    gpu = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    nope = "/proc/rayladder-cannot-write/ladder"
    code, out, err = run_script(SWEEP, "--config", str(gpu), "--dry-run", f"--dir={nope}")
    assert code == 0, err
    assert "warning: /mnt/shared/shards/corpus/manifest.json: no shard manifest there" in out
    assert f"warning: sweep.dir: {nope}-lr-sweep can't be created" in out
    assert out.count("(planned from the config; a launch stops here)") == 2
    code, _, err = run_script(SWEEP, f"--dir={nope}")
    assert code == 2
    assert err.startswith(f"error: sweep.dir: {nope}-lr-sweep can't be created")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "1M,30M"], "sizes: '30M' is not in the size table"),
        # the ladder's own key (it refuses run.model.vocab_size, which the message named)
        (["--vocab_size=200"], "more than vocab_size=200; set vocab_size >= 259"),
        (["--dir=/proc/rayladder-cannot-write"], "is not writable"),
        (["--benchmark=1M", "--dry-run"], "--benchmark times one size and trains no ladder"),
    ],
)
def test_bad_input_fails_before_any_trial(run_script, ladder_yaml, tmp_path, args, message):
    code, _, err = run_script(LADDER, "--config", str(ladder_yaml), *args)
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "exp" / "tune").exists()


def test_a_dir_holding_an_lr_sweep_is_refused(run_script, ladder_yaml, tmp_path):
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / "experiment.yaml").write_text("name: s\nsweep: {search: grid}\n")
    code, _, err = run_script(LADDER, "--config", str(ladder_yaml))
    assert code == 2, err
    assert "already holds a different experiment (LR sweep" in err and err.count("\n") == 1
    assert not (tmp_path / "exp" / "tune").exists()
    # and a sweep into a ladder's dir, naming the setting that chose it
    (tmp_path / "exp-lr-sweep").mkdir()
    (tmp_path / "exp-lr-sweep" / "experiment.yaml").write_text("name: s\nsizes: [1M]\n")
    code, _, err = run_script("workflows/lr_sweep.py", "--config", str(ladder_yaml))
    assert code == 2, err
    assert err.startswith("error: sweep.dir: ") and "pick another --sweep.dir" in err


def test_a_refused_relaunch_leaves_the_experiment_plot_as_it_was(run_script, ladder_yaml, tmp_path):
    """The plot was drawn before a launch's checks: a relaunch refused for its changed LR left
    the experiment's lr_schedule.png showing the schedule it refused."""
    from trainer_core.config.loader import load_config, to_yaml
    from trainer_core.ladder.plan import plan_ladder
    from trainer_core.ray.ladder_run import LadderJobConfig, ladder_trials

    job = load_config(LadderJobConfig, ladder_yaml, [])
    for spec in ladder_trials(job, plan_ladder(job)):  # as a launch leaves them
        run_dir = tmp_path / "exp" / "runs" / spec.name
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(to_yaml(spec.config))
    png = tmp_path / "exp" / "lr_schedule.png"
    png.write_bytes(b"the launch's plot")
    code, _, err = run_script(LADDER, "--config", str(ladder_yaml), "--lr.coef=1e-3")
    assert code == 2 and "records run 3M trained with other lr;" in err, err
    assert png.read_bytes() == b"the launch's plot"


def test_help_describes_the_own_flags_and_the_planned_settings(run_script):
    """--sizes was listed as the config's list (it is the script's comma-separated flag),
    --dry-run, --resume and --benchmark not at all, and every planned run setting with a
    default that is never used."""
    for script in (LADDER, SWEEP):
        code, out, _ = run_script(script, "--help")
        assert code == 0
        assert re.search(r"--dry-run +plan and print every (size|trial)", out), script
        assert re.search(r"--sizes 1M,3M +only these sizes, comma-separated", out), script
        assert "--sizes list[str]" not in out
        assert re.search(r"--run\.optim\.lr float +set by the plan from lr, so not settable", out)
        assert re.search(r"--ray\.num_workers int\s+set by the plan from max_devices", out)
    assert "--benchmark SIZE " in run_script(LADDER, "--help")[1]


def test_decays_too_short_to_anneal_are_one_warning_in_the_ladder_and_its_sweep(
    run_script, ladder_yaml, tmp_path
):
    """The ladder and its LR sweep word the warning once (the sweep said it again its own way,
    on every trial's line): per size in the ladder, per size, run length and batch in the sweep,
    each with how that experiment lengthens its runs."""
    warned = re.compile(
        r"^warning: (\S+): the decays ending at steps [\d, ]+ have fewer than 3 updates, too few "
        r"to anneal: their evals are not fitted \((.*)\)$",
        re.M,
    )
    code, out, err = run_script(LADDER, "--config", str(ladder_yaml), "--dry-run")
    assert code == 0, err
    assert warned.findall(out) == [
        (size, "raise duration.chinchilla_multiple or drop early decay_points")
        for size in ("1M", "3M")
    ]
    sweep_dir = f"--sweep.dir={tmp_path / 's'}"
    code, out, err = run_script(SWEEP, "--config", str(ladder_yaml), "--dry-run", sweep_dir)
    assert code == 0, err
    runs = sorted(set(re.findall(r"^  (\S+)-lr\S+: lr ", out, re.M)))
    assert sorted(warned.findall(out)) == [
        (
            f"{run}-lr*",
            "raise sweep.duration_multiple or sweep.horizons, or drop early decay_points",
        )
        for run in runs
    ]
    assert "too short to anneal" not in out

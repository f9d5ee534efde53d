"""Analysis on synthetic experiment dirs written to disk from known scaling-law constants."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_experiments import (
    BATCH,
    FRACTIONS,
    LADDER_N,
    chinchilla_loss,
    make_ladder,
    write_checkpoint,
    write_jsonl,
    write_run,
)

from trainer_core.analysis import (
    AnalysisError,
    load,
)

# -- loading -------------------------------------------------------------------------------------


def test_load_builds_tidy_frames(ladder_dir: Path):
    res = load(ladder_dir)
    assert list(res.runs["size"]) == list(LADDER_N)
    s1 = res.runs.iloc[0]
    assert s1["num_params"] == 2_000_000 and s1["status"] == "finished"
    assert s1["tag_ladder"] == "syn" and s1["tag_multiple"] == 4
    assert not res.is_lr_sweep

    m = res.metrics[res.metrics["name"] == "s1"]
    # train and eval lines of the same step are merged into one row
    assert len(m) == len(FRACTIONS)
    assert m["train_loss"].notna().all() and m["eval_loss"].notna().all()
    last = m.iloc[-1]
    assert last["flops"] == pytest.approx(6 * 2_000_000 * last["tokens"])
    assert last["eval_loss"] == pytest.approx(chinchilla_loss(2e6, last["tokens"]), rel=2e-3)

    pts = res.points[res.points["name"] == "s1"]
    assert len(pts) == len(FRACTIONS) + 1
    assert pts["annealed"].sum() == len(FRACTIONS)
    fit_pts = res.fit_points()
    assert len(fit_pts) == len(LADDER_N) * len(FRACTIONS)
    assert set(fit_pts.columns) >= {"N", "tokens", "flops", "eval_loss", "size"}


def test_runs_without_checkpoints_give_only_their_annealed_evals(tmp_path: Path):
    """Runs read before any decay ended (evals at peak LR, no permanent checkpoint): their final
    evals were fitted as if annealed, 0.2 above the curve; now they give no points, and a run's
    eval at a decay end is the one kept (with its own step's tokens)."""
    for i, n in enumerate((1e6, 2e6, 4e6)):
        run = tmp_path / "runs" / f"s{i}"
        write_run(run, size=f"s{i}", n=int(n), lr=1e-3, total_steps=100, status="running")
        lines = [
            {"step": 40, "tokens": 40 * BATCH, "eval/loss": 3.0, "lr": 1e-3, "annealed": 0.0},
            {"step": 45, "tokens": 45 * BATCH, "train/loss": 3.1, "lr": 1e-3, "annealed": 0.0},
        ]
        write_jsonl(run / "metrics.jsonl", lines)
    assert load(tmp_path).fit_points().empty
    assert len(load(tmp_path).fit_points(annealed_only=False)) == 3
    ended = {"step": 50, "tokens": 50 * BATCH, "eval/loss": 2.5, "lr": 1e-5, "annealed": 1.0}
    write_jsonl(tmp_path / "runs" / "s0" / "metrics.jsonl", [*lines, ended])
    pts = load(tmp_path).fit_points()
    assert pts[["name", "step", "tokens", "eval_loss"]].values.tolist() == [
        ["s0", 50, 50 * BATCH, 2.5]
    ]


def test_checkpoint_listing_follows_marker_rule(tmp_path: Path):
    root = make_ladder(tmp_path, sizes={"s1": 2_000_000})
    run_dir = root / "runs" / "s1"
    write_checkpoint(run_dir, 7, [0], 2)  # a rank's marker missing
    write_checkpoint(run_dir, 9, [0, 1], 2, metadata=False)  # .metadata missing
    ck = load(root).checkpoints.set_index("step")
    assert not ck.loc[7, "complete"] and not ck.loc[9, "complete"]
    steps = sorted(round(f * round(80 * 2e6 / BATCH)) for f in FRACTIONS)
    assert ck.loc[steps, "complete"].all()
    assert ck.loc[steps[0], "tokens"] == steps[0] * BATCH
    assert ck.loc[steps[0], "metrics_path"] == run_dir / f"metrics_step{steps[0]}.json"
    assert ck.loc[7, "metrics_path"] is None
    assert ck.loc[7, "path"] == run_dir / "checkpoints" / "step-00000007"


def test_load_single_run_dir(ladder_dir: Path):
    res = load(ladder_dir / "runs" / "s2")
    assert list(res.runs["name"]) == ["s2"]
    assert len(res.points) == len(FRACTIONS) + 1


def test_load_errors_name_the_problem(tmp_path: Path):
    with pytest.raises(AnalysisError, match="no such directory"):
        load(tmp_path / "nope")
    (tmp_path / "runs").mkdir()
    with pytest.raises(AnalysisError, match="no run dirs"):
        load(tmp_path)
    (tmp_path / "runs" / "ghost").mkdir()
    with pytest.raises(AnalysisError, match=r"runs: no run has a run\.json yet \(ghost: starting"):
        load(tmp_path)


def test_bad_metrics_line_names_file_and_line(tmp_path: Path):
    write_run(tmp_path / "runs" / "r", size="s", n=1000, lr=1e-3, total_steps=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 3.0}\n{"step": 2, "train/lo\n{"step": 3}\n')
    with pytest.raises(AnalysisError, match=r"metrics\.jsonl:2: not valid JSON"):
        load(tmp_path)
    # A last line cut mid-write (no newline) is a crash artefact: skipped with a warning.
    path.write_text('{"step": 1, "train/loss": 3.0}\n{"step": 2, "train/lo')
    with pytest.warns(UserWarning, match="cut mid-write"):
        res = load(tmp_path)
    assert list(res.metrics["step"]) == [1]


def test_a_bad_byte_in_metrics_skips_only_its_line(tmp_path: Path):
    """A damaged copy of a mostly-good run: a UnicodeDecodeError traceback lost all of it."""
    write_run(tmp_path / "runs" / "r", size="s", n=1000, lr=1e-3, total_steps=10)
    path = tmp_path / "runs" / "r" / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2, "train/lo\xffss": 3.0}\n{"step": 3}\n')
    with pytest.warns(UserWarning) as caught:
        res = load(tmp_path)
    assert [str(w.message) for w in caught] == [f"{path}:2: ignoring a line that is not UTF-8 text"]
    assert list(res.metrics["step"]) == [1, 3]


FIX = "restore it from a copy, or use a new dir"


def test_a_damaged_run_json_is_one_line_naming_it(tmp_path: Path):
    write_run(tmp_path / "runs" / "r", size="s", n=1000, lr=1e-3, total_steps=10)
    path = tmp_path / "runs" / "r" / "run.json"
    for content, why in (
        (b'{"name": "r", "si', ":1: not valid JSON (Unterminated string starting at)"),
        (b'{"name": "r\xff"}', ": not UTF-8 text (byte 11)"),
        (b"[1]", ": holds a list, not a mapping"),
    ):
        path.write_bytes(content)
        with pytest.raises(AnalysisError) as err:
            load(tmp_path)
        assert str(err.value) == f"{path}{why}; {FIX}"


def test_analyze_stops_in_one_line_on_a_damaged_experiment_yaml(tmp_path: Path, run_script):
    """A ParserError traceback, from the experiment's kind."""
    write_run(tmp_path / "runs" / "r", size="s", n=1000, lr=1e-3, total_steps=10)
    path = tmp_path / "experiment.yaml"
    path.write_bytes(b"42\n")
    code, _, err = run_script("workflows/analyze.py", str(tmp_path), "--bootstrap=0")
    assert (code, err) == (2, f"error: {path}: holds a number, not a mapping; {FIX}\n")
    assert path.read_bytes() == b"42\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.yaml", "runs"]


def test_result_grid_needs_a_tune_dir(ladder_dir: Path):
    with pytest.raises(AnalysisError, match="no Tune experiment here \\(only Tune-run"):
        load(ladder_dir).result_grid()
    with pytest.raises(AnalysisError, match="this is a run dir: the Tune state is in its exp"):
        load(ladder_dir / "runs" / "s1").result_grid()
    # a run's trial is its run dir's name, the Tune trial's (config/trial/name): the join key
    res = load(ladder_dir)
    assert list(res.runs["trial"]) == [Path(d).name for d in res.runs["dir"]]


@pytest.mark.ray
@pytest.mark.slow
def test_result_grid_reads_tune_storage(ray_session, tmp_path: Path):
    from ray import tune

    def report_x(config):  # local, so Ray pickles it by value (tests aren't importable on workers)
        tune.report({"eval/loss": float(config["x"])})

    root = make_ladder(tmp_path, sizes={"s1": 2_000_000})
    tune.Tuner(
        report_x,
        param_space={"x": tune.grid_search([3, 2])},
        run_config=tune.RunConfig(name="tune", storage_path=str(root), verbose=0),
    ).fit()
    grid = load(root).result_grid()
    assert len(grid) == 2 and grid.get_best_result().metrics["eval/loss"] == 2.0

    # an LR sweep's widening round is a Tune experiment of its own: result_grids has them all
    tune.Tuner(
        report_x,
        param_space={"x": tune.grid_search([1])},
        run_config=tune.RunConfig(name="tune-widen1", storage_path=str(root), verbose=0),
    ).fit()
    grids = load(root).result_grids()
    assert list(grids) == ["tune", "tune-widen1"]
    assert [len(g) for g in grids.values()] == [2, 1]
    assert grids["tune-widen1"].get_best_result().metrics["eval/loss"] == 1.0
    (root / "tune-widen2").mkdir()  # a launch stopped before Tune saved its state
    (root / "tune-widen3.bak").write_text("not a round")
    with pytest.warns(UserWarning, match="skipped .*tune-widen2: no experiment_state file"):
        assert list(load(root).result_grids()) == ["tune", "tune-widen1"]


# -- fits ----------------------------------------------------------------------------------------

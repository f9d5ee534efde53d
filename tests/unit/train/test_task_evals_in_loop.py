"""Task evals in the training loop: a tiny run that names a task records it, and trains the same."""

from __future__ import annotations

import json
import math

import pytest
import torch

from trainer_core.train.build import build_trainer

TASK = "demo_next_line"
EXAMPLES = 40
KEYS = [f"task/{TASK}/{k}" for k in ("acc", "acc_norm", "bpb", "chance", "examples", "acc_pmi")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """On a shared 2-core box two intra-op threads wait on each other: one is 2-10x faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def with_task(tiny_config, run_dir, *overrides):
    return tiny_config(
        run_dir, f"--evals.tasks=[{TASK}]", f"--evals.max_examples={EXAMPLES}", *overrides
    )


@pytest.fixture(scope="module")
def tasked_run(tmp_path_factory, tiny_config):
    """The tiny run (20 steps, evals at 10 and 20) with the demo task: its dir."""
    run_dir = tmp_path_factory.mktemp("tasked") / "run"
    build_trainer(with_task(tiny_config, run_dir)).fit()
    return run_dir


def test_a_run_with_a_task_logs_it_at_every_eval(tasked_run):
    records = read_jsonl(tasked_run / "metrics.jsonl")
    evals = [r for r in records if "eval/loss" in r]
    assert [r["step"] for r in evals] == [10, 20]
    for record in evals:
        assert all(key in record for key in KEYS)
        assert 0 <= record[KEYS[0]] <= 1 and 0 <= record[KEYS[1]] <= 1
        assert math.isfinite(record[KEYS[2]]) and record[KEYS[2]] > 0
        assert record[KEYS[3]] == 0.25  # four choices each
        assert record[KEYS[4]] == EXAMPLES and 0 <= record[KEYS[5]] <= 1
    assert not any(k.startswith("task/") for r in records if "eval/loss" not in r for k in r)
    # its own time, not the loss eval's, and not in the step time
    assert all(r["time/task_eval_s"] >= 0 for r in records)
    assert all(r["time/task_eval_s"] > 0 for r in evals)
    # the permanent checkpoint's record (the analysis's points) holds the tasks too
    saved = json.loads((tasked_run / "metrics_step20.json").read_text())
    assert saved[KEYS[2]] == evals[-1][KEYS[2]]


@pytest.mark.slow
def test_task_evals_leave_training_unchanged(tasked_run, tmp_path, tiny_config):
    build_trainer(tiny_config(tmp_path / "plain")).fit()
    plain = read_jsonl(tmp_path / "plain" / "metrics.jsonl")
    tasked = read_jsonl(tasked_run / "metrics.jsonl")
    for key in ("train/loss", "eval/loss", "train/grad_norm"):
        assert [r.get(key) for r in tasked] == [r.get(key) for r in plain], key  # bit for bit
    assert not any(k.startswith("task/") for r in plain for k in r)


def test_an_untrained_model_scores_chance(tmp_path, tiny_config):
    """At init the logits are near uniform: every choice about as likely, each byte costing
    about log2(vocab) bits."""
    trainer = build_trainer(with_task(tiny_config, tmp_path / "run", "--evals.max_examples=100"))
    metrics = trainer.evaluate_tasks()
    # 100 examples: the accuracy's standard error at chance is 0.04
    assert metrics[KEYS[0]] == pytest.approx(0.25, abs=0.1)
    assert metrics[KEYS[1]] == pytest.approx(0.25, abs=0.1)
    vocab = trainer.module.model.cfg.vocab_size
    assert metrics[KEYS[2]] == pytest.approx(math.log2(vocab), rel=0.1)

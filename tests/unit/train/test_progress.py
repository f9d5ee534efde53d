from __future__ import annotations

import io

from trainer_core.train.callbacks import ConsoleProgress


def test_the_summary_line_names_the_losses_the_run_has():
    """A run without evals (trainer.eval_batches: 0) once ended with "eval loss nan"."""
    out = io.StringIO()
    progress = ConsoleProgress("r", stream=out)
    base = {"name": "r", "steps": 3, "elapsed_s": 1.0, "train/loss": 5.19453}
    progress.on_end(base)
    progress.on_end({**base, "eval/loss": 4.60037})
    assert out.getvalue().splitlines() == [
        "[r] done r: 3 steps in 0m01s, final train loss 5.1945",
        "[r] done r: 3 steps in 0m01s, final train loss 5.1945, eval loss 4.6004",
    ]


def test_a_resumed_run_ends_with_the_steps_this_attempt_trained():
    """After a resume the line set the run's whole step count against this attempt's time."""
    out = io.StringIO()
    progress = ConsoleProgress("r", stream=out)
    info = {"name": "r", "num_params": 10, "total_steps": 363, "global_batch_tokens": 64}
    progress.on_start({**info, "start_step": 140})
    progress.on_end({"name": "r", "steps": 363, "elapsed_s": 11.0})
    assert out.getvalue().splitlines() == [
        "[r] training r: 10 non-embedding params, 363 steps of 64 tokens, resumed at step 140",
        "[r] done r: steps 141-363 in 0m11s",
    ]
    progress.on_start({**info, "start_step": 363})  # interrupted after its last checkpoint
    progress.on_end({"name": "r", "steps": 363, "elapsed_s": 0.0})
    last = out.getvalue().splitlines()[-1]
    assert last == "[r] done r: no steps left (resumed at step 363) in 0m00s"


def test_a_checkpoint_only_line_prints_nothing():
    """A save on a step that neither logs nor evaluates logs its tokens and whether it is
    annealed; on the console that was a line of a step and an ETA alone."""
    out = io.StringIO()
    progress = ConsoleProgress("r", stream=out)
    progress.on_log(3, {"tokens": 192, "annealed": 0.0})
    progress.on_log(5, {"train/loss": 4.0, "tokens": 320, "annealed": 0.0})
    (line,) = out.getvalue().splitlines()
    assert line.startswith("[r] step      5/0 | loss 4.0000 | eta ")

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

"""Things that happen at step boundaries: console progress, the JSONL metrics file, W&B.

Callbacks never touch the model, so adding one can't change a run's numbers. The build gives
rank 0 the ones that write or print for the run (these, W&B); a launcher's extra callbacks (the
Ray layer's reporter and start-up clock) run on every rank.

At a step with something to say the trainer calls ``on_log`` (the step's metrics), then, if it
saves, ``flush`` (whatever a callback buffers goes out: the record is durable before the
checkpoint that would skip it on resume) and ``on_checkpoint``, then ``on_step_end``. ``flush``
comes again when the loop ends, however it ends.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Protocol

from trainer_core.io import storage
from trainer_core.io.run_dir import metrics_path, resumed_metric_lines, write_metrics
from trainer_core.io.storage import Location


class Callback(Protocol):
    def on_start(self, info: dict[str, Any]) -> None: ...
    def on_log(self, step: int, metrics: dict[str, float]) -> None: ...
    def on_checkpoint(self, step: int, path: Location, permanent: bool) -> None: ...
    def on_step_end(self, step: int) -> None: ...
    def flush(self) -> None: ...
    def on_end(self, summary: dict[str, Any]) -> None: ...


class BaseCallback:
    """No-op defaults so a callback only implements what it needs."""

    def on_start(self, info: dict[str, Any]) -> None:
        pass

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, step: int, path: Location, permanent: bool) -> None:
        pass

    def on_step_end(self, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def on_end(self, summary: dict[str, Any]) -> None:
        pass


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class ConsoleProgress(BaseCallback):
    """One line per log interval: step/total, losses, LR, throughput, MFU and an ETA."""

    FIELDS = (
        ("train/loss", lambda v: f"loss {v:.4f}"),
        ("eval/loss", lambda v: f"eval {v:.4f}"),
        ("train/grad_norm", lambda v: f"gnorm {v:.3f}"),
        ("lr", lambda v: f"lr {v:.2e}"),
        ("throughput/tokens_per_s", lambda v: f"{v:,.0f} tok/s"),
        ("throughput/mfu", lambda v: f"mfu {100 * v:.1f}%"),
    )

    def __init__(self, name: str = "", stream=None):
        self.name = name
        self.stream = stream or sys.stdout
        self.start_time = time.time()
        self.start_step = 0
        self.total = 0

    def on_start(self, info: dict[str, Any]) -> None:
        self.start_time = time.time()
        self.start_step = info["start_step"]
        self.total = info["total_steps"]
        resumed = f", resumed at step {self.start_step}" if self.start_step else ""
        self._print(
            f"training {info['name']}: {info['num_params']:,} non-embedding params, "
            f"{self.total} steps of {info['global_batch_tokens']:,} tokens{resumed}"
        )

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        shown = [show(metrics[key]) for key, show in self.FIELDS if key in metrics]
        if not shown:
            return  # a checkpoint's own line (tokens, annealed): nothing to read in it
        done = step - self.start_step
        elapsed = time.time() - self.start_time
        eta = elapsed / max(done, 1) * (self.total - step)
        parts = [f"step {step:>6}/{self.total}", *shown, f"eta {format_duration(eta)}"]
        self._print(" | ".join(parts))

    def on_end(self, summary: dict[str, Any]) -> None:
        losses = [
            f"{label} {summary[key]:.4f}"
            for key, label in (("train/loss", "final train loss"), ("eval/loss", "eval loss"))
            if key in summary
        ]
        steps = summary["steps"]
        trained = f"{steps} steps"
        if self.start_step:
            trained = f"steps {self.start_step + 1}-{steps}"
            if steps <= self.start_step:
                trained = f"no steps left (resumed at step {self.start_step})"
        self._print(
            f"done {summary['name']}: {trained} in {format_duration(summary['elapsed_s'])}"
            + "".join(f", {x}" for x in losses)
        )

    def _print(self, line: str) -> None:
        prefix = f"[{self.name}] " if self.name else ""
        print(prefix + line, file=self.stream, flush=True)


class JsonlMetrics(BaseCallback):
    """Appends every logged metrics dict to ``<run_dir>/metrics.jsonl`` (the record analysis reads).

    On resume, lines from steps after the resumed checkpoint are dropped first, so a replayed
    stretch of training is not recorded twice; a line it can't read is kept as it is (with a
    warning), and the file is replaced whole, so a kill during that rewrite loses nothing either.

    Object storage has no appends: for a run dir there, the lines are kept here and the file is
    replaced whole at :meth:`flush` (before every checkpoint, at the end) and at most every
    :attr:`UPLOAD_EVERY_S` seconds in between, so a watcher sees progress without one upload per
    log line.
    """

    UPLOAD_EVERY_S = 60.0

    def __init__(self, run_dir: Location):
        self.path = metrics_path(run_dir)
        self.remote = storage.is_url(self.path)
        self.lines: list[bytes] = []
        self.uploaded_at = time.monotonic()

    def on_start(self, info: dict[str, Any]) -> None:
        if not storage.is_file(self.path):
            return
        keep = resumed_metric_lines(self.path, info["start_step"])
        if self.remote:
            self.lines = keep
        write_metrics(self.path, keep)

    def on_log(self, step: int, metrics: dict[str, float]) -> None:
        line = (json.dumps({"step": step, "time": time.time(), **metrics}) + "\n").encode()
        if not self.remote:
            with open(self.path, "ab") as f:
                f.write(line)
            return
        self.lines.append(line)
        if time.monotonic() - self.uploaded_at >= self.UPLOAD_EVERY_S:
            self.flush()

    def flush(self) -> None:
        if self.remote:
            write_metrics(self.path, self.lines)
            self.uploaded_at = time.monotonic()

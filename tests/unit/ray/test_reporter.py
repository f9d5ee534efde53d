"""What a Ray Train worker reports, and when."""

from __future__ import annotations

from trainer_core.ray.worker import RayReporter


def test_a_report_after_a_permanent_save_waits_for_its_commit():
    """An async save returns before it commits; a scheduler stopping the trial at the report
    that follows (ASHA at its last rung) ended the process first and lost the decay point. The
    report after a permanent save now commits it first; a temporary save stays asynchronous."""
    events = []
    reporter = RayReporter(lambda metrics: events.append(("report", metrics["step"])), False)
    reporter.commit = lambda: events.append(("commit",))
    reporter.on_log(10, {"eval/loss": 1.0})
    reporter.on_checkpoint(10, "step-10", permanent=True)
    reporter.on_step_end(10)
    reporter.on_checkpoint(15, "step-15", permanent=False)
    reporter.on_step_end(15)
    assert events == [("commit",), ("report", 10), ("report", 15)]

"""How a rank's process ends (:func:`exit_rank`)."""

from __future__ import annotations

import sys

PROGRAM = """
import atexit, sys
from trainer_core.parallel.process_group import exit_rank
atexit.register(lambda: print("finalized"))
sys.stdout.write("done")
print("warned", file=sys.stderr, end="")
exit_rank(3)
"""


def test_exit_rank_flushes_output_and_skips_finalization(processes):
    done = processes.run(sys.executable, "-c", PROGRAM, env={"PYTHONUNBUFFERED": ""})
    assert (done.returncode, done.stdout, done.stderr) == (3, "done", "warned")

"""The line a Ray Train restart prints (``trainer_core.ray.failures.FailFastPolicy``), found
in a console's text."""

from __future__ import annotations

import re

RESTART = re.compile(
    r"\[(?P<run>[^\]\n]+)\] (?P<causes>ranks? [^\n]*?); Ray Train restarts the workers from the "
    r"latest checkpoint \((?P<count>[^)\n]*)\)"
)


def restart_lines(text: str) -> list[dict[str, str]]:
    """Each restart said in ``text``: its ``run``, ``causes`` and ``count`` ("restart 1,
    ray.max_failures 3"). Matched in the text, not line by line: a driver's Ray prints a
    worker's line and its own notices (a node's death) from two threads, each print as two
    writes (the text, then its newline), so a notice can land before a line's newline (a CI
    run of the two-node test). Fails where the restart's words appear outside a whole line."""
    found = [m.groupdict() for m in RESTART.finditer(text)]
    assert text.count("Ray Train restarts the") == len(found), text[-4000:]
    return found

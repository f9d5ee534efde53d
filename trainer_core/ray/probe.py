"""Whether anything answers at a cluster's address, before Ray is asked: Ray's own client
retries for minutes (the GCS) or prints a connection traceback (``ray job submit``). Imports no
Ray, so a script that only checks and submits starts at once."""

from __future__ import annotations

import socket

PROBE_TIMEOUT_S = 5.0


def probe(host: str, port: int) -> None:
    """Connect and close; the OSError of a refused, unreachable or silent address."""
    socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()

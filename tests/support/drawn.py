"""Comparing what a Figure draws with the numbers computed from the plot's inputs."""

from __future__ import annotations

import numpy as np


def close(a, b) -> bool:
    """Equal as drawn: the plot must show the very numbers computed from its inputs."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-9, atol=0)

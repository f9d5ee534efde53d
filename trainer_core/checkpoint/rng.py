"""Every rank's RNG states (Python, NumPy, torch, CUDA), saved with a checkpoint so a resumed
run draws the same numbers an uninterrupted one would."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def rng_state(rank: int, device: torch.device | None = None) -> dict[str, Any]:
    """This rank's RNG states, keyed ``rank<r>`` so DCP keeps every rank's copy; the CUDA
    generator's of ``device`` when the run computes there (a CPU run on a GPU machine touched
    CUDA for it: a context on GPU 0 for every rank).

    Python and NumPy states are plain tuples/lists of ints (``weights_only``-loadable); the torch
    states are byte tensors.
    """
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": (version, mt, gauss),
        "numpy": (str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return {f"rank{rank}": state}


def restore_rng(
    states: dict[str, Any], rank: int | None = None, device: torch.device | None = None
) -> bool:
    """Restore the RNG states of ``rank`` (or of the only rank in ``states``), the CUDA one
    into ``device``'s generator when the run computes there; False if absent.

    Absent means the checkpoint came from a smaller world: this rank keeps its current states.
    """
    if rank is None:
        if len(states) > 1:
            raise ValueError(f"restore_rng needs a rank when states hold {sorted(states)}")
        state = next(iter(states.values()), None)
    else:
        state = states.get(f"rank{rank}")
    if not state:
        return False
    if "python" in state:
        version, mt, gauss = state["python"]
        random.setstate((version, tuple(mt), gauss))
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    return True

"""Sweep dirs on disk with a planted LR*(N, D) and B*(D), as a WSD-S sweep writes them.

Each trial (size, peak LR, batch) is one run whose decays end at every horizon, so it leaves
an annealed eval (``metrics_step{N}.json`` with a small LR) per horizon, plus one eval at peak
LR before a decay that the analysis must leave out. The loss is L0(N, D) plus a parabola in
log LR and one in log batch about the planted optima, plus Gaussian noise.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from synthetic_experiments import write_run

from trainer_core.analysis.synthetic_sweep import STEP_LAW_BATCH, STEP_LAW_LR, PlantedLaw

RATIOS = (10.0, 40.0, 160.0)
"""Tokens per parameter of the horizons: the default ladder's 80 N lies between two."""


def make_hparam_sweep(
    root: Path,
    sizes: dict[str, int],
    lr_law: PlantedLaw = STEP_LAW_LR,
    batch_law: PlantedLaw = STEP_LAW_BATCH,
    ratios: tuple[float, ...] = RATIOS,
    batch_factors: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0),
    noise: float = 0.002,
    seed: int = 0,
) -> Path:
    """One trial per (size, LR, batch): 7 LRs a factor sqrt 2 apart about LR* at the middle
    horizon, times ``batch_factors`` of B* there. One batch factor: an LR-only sweep."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    (root / "experiment.yaml").write_text("name: hparams\nsweep: {search: grid}\n")
    for size, n in sizes.items():
        horizons = [r * n for r in ratios]
        mid = math.sqrt(horizons[0] * horizons[-1])
        for i in range(-3, 4):
            lr = lr_law(n, mid) * 2 ** (i / 2 + 0.1)
            for f in batch_factors:
                batch = round(batch_law(n, mid) * f)
                run_dir = root / "runs" / f"{size}-lr{i}-b{f:g}"
                write_run(
                    run_dir, size=size, n=n, lr=lr, total_steps=1000, batch=batch, seq_len=128
                )
                for d in horizons:
                    loss = 2 + 400 / n**0.3 + 400 / d**0.3
                    loss += 0.05 * math.log(lr / lr_law(n, d)) ** 2
                    loss += 0.03 * math.log(batch / batch_law(n, d)) ** 2
                    loss += noise * rng.standard_normal()
                    _write_point(run_dir, d, batch, loss, 0.01 * lr)
                pre = horizons[-1] * 0.4
                _write_point(run_dir, pre, batch, 99.0, lr)
    return root


def _write_point(run_dir: Path, tokens: float, batch: int, loss: float, lr: float) -> None:
    step = max(1, round(tokens / batch))
    point = {"step": step, "tokens": step * batch, "eval/loss": loss, "lr": lr}
    (run_dir / f"metrics_step{step}.json").write_text(json.dumps(point))

"""Reference runs that a Ray run's losses are compared with, computed the way a Ray worker does.

A Ray worker of less than a whole CPU runs torch on one intra-op thread; a matmul summed over
two threads rounds differently, and a few hundred updates at a demo LR turn that last-bit
difference into ~1e-4 in the loss. So an exact (1e-5) comparison needs its reference on one
thread too.
"""

from __future__ import annotations

import torch

from trainer_core.config.sections import TrainConfig
from trainer_core.train.build import build_trainer

SIXTEEN_STEPS = (
    "--trainer.max_steps=16",
    "--trainer.log_interval=2",
    "--trainer.eval_interval=8",
    "--checkpoint.save_interval_steps=4",
)
"""The tiny run that Ray's fault tests interrupt: 16 steps, evals at 8 and 16, a checkpoint
every 4 (so a kill mid-run has a checkpoint to resume from and steps to replay)."""


def fit_on_one_thread(cfg: TrainConfig) -> dict:
    """``build_trainer(cfg).fit()`` on one intra-op thread (this process's count restored)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_trainer(cfg).fit()
    finally:
        torch.set_num_threads(threads)

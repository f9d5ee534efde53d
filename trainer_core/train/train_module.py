"""The train module: how a batch becomes an optimizer update (OLMo-core's TrainModule contract).

It owns the (possibly sharded) model, the optimizer and the LR scheduler, and knows nothing about
loops, data files or Ray. The loss is the exact token-weighted mean over the *global* batch: each
micro-batch contributes ``sum(token CE) / global_tokens``, so 1 x 8 sequences and 4 x 2 sequences
give the same gradient, and data-parallel ranks with different numbers of valid tokens still
average correctly.

DCP's state-dict helpers load DTensor and FSDP (~1 s): only the state methods import them, so
code that never checkpoints a module does not pay for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from trainer_core.config.sections import TrainModuleConfig
from trainer_core.parallel.process_group import collective_device
from trainer_core.parallel.wrap import clip_grad_norm

AUTOCAST_DTYPES = {"bf16": torch.bfloat16}


@dataclass
class BatchStats:
    """Local (this rank) sums for one global batch; reduce across DP ranks to log them."""

    ce_sum: torch.Tensor
    z_sum: torch.Tensor
    num_tokens: torch.Tensor


class TrainModule:
    """How one global batch becomes one optimizer update, and how an eval batch is scored.

    Holds the (wrapped) model, optimizer and scheduler; splits a rank's batch into
    micro-batches, accumulates gradients (syncing them across data-parallel ranks only where
    the config says), clips and steps. The :class:`Trainer` never touches the model directly,
    so precision, parallelism and the loss's weighting live here and nowhere else (OLMo-core's
    contract); the per-token sums come from the model's LM head.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        cfg: TrainModuleConfig,
        *,
        seq_len: int,
        device: torch.device,
        dp_group: dist.ProcessGroup | None = None,
        dp_size: int = 1,
        after_load: Callable[[], None] | None = None,
    ):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.cfg, self.seq_len, self.device = cfg, seq_len, device
        self.dp_group, self.dp_size = dp_group, dp_size
        self.after_load = after_load
        """Run once a checkpoint is in the weights: state derived from them (float8 scales)."""
        self.autocast_dtype = AUTOCAST_DTYPES.get(cfg.autocast_precision or "")

    # -- the contract -------------------------------------------------------------------------

    def train_batch(self, batch: torch.Tensor) -> BatchStats:
        """Forward + backward over this rank's part of a global batch ``[B_rank, seq_len + 1]``."""
        self.model.train()
        batch = batch.to(self.device, non_blocking=True)
        inputs, labels = self._split(batch)
        local_tokens, global_tokens = self._token_counts(labels)
        micro = self.micro_batches(inputs.shape[0])
        ce_total = torch.zeros((), device=self.device)
        z_total = torch.zeros((), device=self.device)
        for i, (start, stop) in enumerate(micro):
            self._set_grad_sync(self.cfg.reduce_grads_every_micro_batch or i == len(micro) - 1)
            ce_sum, z_sum = self._loss_sums(inputs[start:stop], labels[start:stop])
            # FSDP averages gradients over DP ranks; scaling by dp_size undoes that so the
            # result is sum / global_tokens exactly.
            ((ce_sum + z_sum) * (self.dp_size / global_tokens)).backward()
            ce_total += ce_sum.detach()
            z_total += z_sum.detach()
        return BatchStats(ce_total, z_total, local_tokens)

    @torch.no_grad()
    def eval_batch(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed token CE and token count for ``[B, seq_len + 1]`` (reduce across ranks to
        average), in forwards of at most one micro-batch: an eval batch is a whole rank batch
        (micro x accumulation sequences), which would not fit in one forward at scale."""
        self.model.eval()
        inputs, labels = self._split(batch.to(self.device))
        ce_total = torch.zeros((), device=self.device)
        for start, stop in self.micro_batches(inputs.shape[0]):
            ce_sum, _ = self._loss_sums(inputs[start:stop], labels[start:stop], with_z=False)
            ce_total += ce_sum
        return ce_total, (labels != self.cfg.label_ignore_index).sum()

    @torch.no_grad()
    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """The model's logits ``[B, L, V]`` for token ids ``[B, L]`` (eval mode, the training
        precision): task evals score choices by their per-token log-probabilities."""
        self.model.eval()
        with self._autocast():
            return self.model(inputs.to(self.device, non_blocking=True))

    def optim_step(self) -> torch.Tensor:
        """Clip, step optimizer and schedule; returns the global pre-clip gradient norm.

        Nothing waits for the device: the norm is not read here. A fused optimizer (CUDA) is
        told on the device that a non-finite norm skips its update, as AMP's scaler does; any
        other updates anyway. Either way the trainer stops the run at its next check, before
        any checkpoint (:class:`trainer_core.train.trainer.Trainer`).
        """
        norm = clip_grad_norm(self.model, self.cfg.max_grad_norm)
        if self.optimizer.defaults.get("fused"):
            self.optimizer.found_inf = (~torch.isfinite(norm)).float()
        self.optimizer.step()
        self.scheduler.step()
        return norm

    def zero_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self, *, optim: bool = True) -> dict:
        """Model, optimizer and schedule state (each rank's shard under FSDP2), a DCP Stateful."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer if optim else [])
        state = {"model": model_sd}
        if optim:
            state["optim"] = optim_sd
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        has_optim = "optim" in state
        own = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        set_state_dict(
            self.model,
            self.optimizer if has_optim else [],
            model_state_dict=state["model"],
            optim_state_dict=state.get("optim", {}),
        )
        if has_optim:
            self.scheduler.load_state_dict(state["scheduler"])
            self._keep_own_hyperparameters(own)
        if self.after_load is not None:
            self.after_load()

    def _keep_own_hyperparameters(self, own: list[dict]) -> None:
        """A checkpoint brings the optimizer's moments and the schedule's position; its param
        groups' LR, weight decay, betas and eps, and the schedule's base LRs, are the saving
        run's. A branch (``checkpoint.resume_from`` with another LR, decay or schedule) would
        train on those while its config and run.json said otherwise, so this run's own are put
        back and the LR recomputed from its schedule at the restored step (a resume of the same
        run gets the values it had)."""
        sched = self.scheduler
        for group, values in zip(self.optimizer.param_groups, own, strict=True):
            group.update(values)
        sched.base_lrs = [values["initial_lr"] for values in own]
        lambdas = zip(sched.lr_lambdas, sched.base_lrs, strict=True)
        lrs = [base * f(sched.last_epoch) for f, base in lambdas]
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        sched._last_lr = lrs

    # -- helpers ------------------------------------------------------------------------------

    def micro_batches(self, rank_batch: int) -> list[tuple[int, int]]:
        """Row ranges of at most ``rank_microbatch_seqs`` (the last may be shorter: an eval
        batch need not divide evenly; a training batch does, checked at config time)."""
        per_micro = self.cfg.rank_microbatch_seqs or rank_batch
        return [(s, min(s + per_micro, rank_batch)) for s in range(0, rank_batch, per_micro)]

    def _split(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token labels; ignored label positions are fed to the model as id 0."""
        inputs, labels = batch[:, :-1], batch[:, 1:]
        return inputs.clamp(min=0), labels

    def _token_counts(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's scored tokens and the global batch's (at least 1: the loss divides)."""
        local = (labels != self.cfg.label_ignore_index).sum()
        count = local.to(torch.float32)
        if self.dp_size > 1:
            where = collective_device(self.dp_group, self.device)
            count = count.to(where)
            dist.all_reduce(count, group=self.dp_group)
            count = count.to(self.device)
        return local, count.clamp(min=1.0)

    def _loss_sums(
        self, inputs: torch.Tensor, labels: torch.Tensor, with_z: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch's summed CE and z-loss, from the model's LM head: under
        ``parallel.compile`` the head's matmul and the loss run as one compiled graph."""
        z = self.cfg.z_loss_multiplier if with_z else 0.0
        with self._autocast():
            return self.model(
                inputs, labels, ignore_index=self.cfg.label_ignore_index, z_multiplier=z
            )

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.autocast_dtype:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _set_grad_sync(self, sync: bool) -> None:
        """Off: FSDP skips the reduce-scatter and accumulates full gradients locally (all
        micro-batches but the last, unless ``reduce_grads_every_micro_batch``)."""
        if hasattr(self.model, "set_requires_gradient_sync"):
            self.model.set_requires_gradient_sync(sync)

"""Ray Data's per-rank training reader: each data-parallel rank's batches as a Ray dataset.

A rank's dataset is built from the addressable order in :mod:`trainer_core.data`, not by skipping
rows: row ``i`` of rank ``r``'s dataset for steps ``[start_step, start_step + num_steps)`` is slot
``step * B + r * B/dp + i % (B/dp)`` with ``step = start_step + i // (B/dp)``, read straight from
parquet in a ``map_batches`` task. So the rows equal the local reader's batches, and a restarted
worker group gets a dataset that starts exactly at its checkpoint's step (:func:`resume_step`).
Ray Data reorders blocks unless told not to: consume with ``preserve_order=True`` (in Ray Train:
``ray.train.DataConfig(datasets_to_split=[],
execution_options=ray.data.ExecutionOptions(preserve_order=True))``); every row carries its step
and slot, and :func:`batches_from_shard` refuses rows out of order instead of training on them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import ray.data

from trainer_core.checkpoint.listing import branch_step, complete_checkpoints
from trainer_core.config.sections import TrainConfig
from trainer_core.data.shards import DataError, token_dtype
from trainer_core.data.token_data import (
    TokenData,
    TokenDataSpec,
    open_token_data,
    rank_batch_size,
)

if TYPE_CHECKING:
    import torch

    from trainer_core.ray.run_config import RayTrainConfig

BLOCK_TOKENS = 1 << 23
"""Tokens per block of a training dataset (rounded to whole steps). A block's task and transfer
cost ~20 ms however small it is (measured against a direct pyarrow read: 1M-token blocks 5x
slower, 8M-token ones 1.6x). Each in-flight or prefetched block holds 16-32 MB."""
READ_TASK_CPUS = 0.1
"""A window-reading task is light; a small CPU share keeps it schedulable beside Train workers
that hold most CPUs (with a whole CPU each, reads can starve and training hangs)."""
READ_TASKS_IN_FLIGHT = 2
"""Per dataset: enough to read ahead of one consumer. Uncapped, fractional-CPU tasks run many at
once, each in a fresh worker process that first imports numpy/pyarrow/torch (a start-up storm)."""
ORDER_HINT = (
    "consume it in order: ray.train.DataConfig(datasets_to_split=[], "
    "execution_options=ray.data.ExecutionOptions(preserve_order=True))"
)

_opened: OrderedDict[TokenDataSpec, TokenData] = OrderedDict()


def dataset_name(dp_rank: int) -> str:
    """The name under which Ray Train hands data-parallel rank ``dp_rank`` its dataset."""
    return f"train_dp{dp_rank}"


def resume_step(cfg: TrainConfig) -> int:
    """The step the next worker group will start from, by the trainer's rule
    (:meth:`trainer_core.train.trainer.Trainer.restore`): the run's latest complete checkpoint; with
    none yet, ``checkpoint.resume_from``'s step when set; else 0 (always 0 with checkpoints off:
    the trainer then restores nothing, whatever the run dir holds)."""
    if not cfg.checkpoint.enabled:
        return 0
    complete = complete_checkpoints(cfg.trainer.run_dir, warn=False)
    if complete:
        return complete[-1].step
    return branch_step(cfg.checkpoint.resume_from) if cfg.checkpoint.resume_from else 0


def _token_data(spec: TokenDataSpec) -> TokenData:
    """One TokenData per spec per worker process, so its row-group cache outlives a task."""
    data = _opened.get(spec)
    if data is None:
        data = _opened[spec] = TokenData.open(spec)
        if len(_opened) > 2:
            _opened.popitem(last=False)
    _opened.move_to_end(spec)
    return data


def _read_windows(
    batch: dict[str, np.ndarray],
    spec: TokenDataSpec,
    seq_len: int,
    global_batch_seqs: int,
    seed: int,
    start_step: int,
    dp_rank: int,
    dp_size: int,
) -> dict[str, np.ndarray]:
    data = _token_data(spec)
    per_rank = rank_batch_size(global_batch_seqs, dp_rank, dp_size)
    ids = np.concatenate(
        [np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(batch["lo"], batch["hi"], strict=True)]
    )
    steps, slot_in_step = np.divmod(ids, per_rank)
    steps += start_step
    slots = steps * global_batch_seqs + dp_rank * per_rank + slot_in_step
    tokens = data.read_slots(slots, seq_len, seed).astype(token_dtype(data.vocab_size))
    return {"step": steps, "slot": slot_in_step, "tokens": tokens}


def ray_train_dataset(
    token_data_spec: TokenDataSpec,
    seq_len: int,
    global_batch_seqs: int,
    seed: int,
    start_step: int,
    num_steps: int,
    dp_rank: int,
    dp_size: int,
):
    """Rank ``dp_rank``'s windows for steps ``[start_step, start_step + num_steps)``, in order.

    Rows: ``step`` (int64), ``slot`` (position in the rank's batch) and ``tokens`` (seq_len+1 ids,
    the shards' dtype). Iterated with ``preserve_order`` they equal
    ``TokenData.train_batches(seq_len, global_batch_seqs, seed, start_step, dp_rank, dp_size)``.
    """
    per_rank = rank_batch_size(global_batch_seqs, dp_rank, dp_size)
    if start_step < 0 or num_steps < 0:
        raise DataError(f"start_step={start_step} and num_steps={num_steps} must be >= 0")
    steps_per_block = max(1, BLOCK_TOKENS // (per_rank * (seq_len + 1)))
    blocks = max(1, math.ceil(num_steps / steps_per_block))
    # The dataset starts as one small item per block, the range of row ids it expands to:
    # ray.data.range / from_numpy / from_arrow would run set-up tasks that want a whole CPU,
    # which a machine full of Train workers may never free (the run hangs, nothing errors).
    bounds = np.linspace(0, num_steps, blocks + 1).astype(np.int64) * per_rank
    ranges = [
        {"lo": int(lo), "hi": int(hi)} for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    ds = ray.data.from_items(ranges, override_num_blocks=len(ranges)).map_batches(
        _read_windows,
        batch_size=None,
        batch_format="numpy",
        num_cpus=READ_TASK_CPUS,
        compute=ray.data.TaskPoolStrategy(size=min(READ_TASKS_IN_FLIGHT, len(ranges))),
        fn_kwargs=dict(
            spec=token_data_spec,
            seq_len=seq_len,
            global_batch_seqs=global_batch_seqs,
            seed=seed,
            start_step=start_step,
            dp_rank=dp_rank,
            dp_size=dp_size,
        ),
    )
    ds.context.execution_options.preserve_order = True
    ds.context.print_on_execution_start = False
    ds.context.raise_original_map_exception = True  # keeps a ShardError's type for the consumer
    return ds


def rank_dataset(cfg: RayTrainConfig, dp_rank: int, dp_size: int) -> ray.data.Dataset:
    """Rank ``dp_rank``'s dataset, built by Ray Train's controller on every worker-group (re)start
    from the step the workers will resume at (so this module stays free of torch's import)."""
    start = resume_step(cfg)
    data = open_token_data(cfg.data, cfg.model.vocab_size)
    return ray_train_dataset(
        data.spec,
        seq_len=cfg.data.seq_len,
        global_batch_seqs=cfg.batch_seqs,
        seed=cfg.trainer.seed,
        start_step=start,
        num_steps=max(cfg.total_steps - start, 0),
        dp_rank=dp_rank,
        dp_size=dp_size,
    )


def batches_from_shard(
    data_iterator, rows_per_batch: int, expected_start_step: int | None = None
) -> Iterator[torch.Tensor]:
    """int64 batches [rows_per_batch, seq_len+1] from a :func:`ray_train_dataset` shard.

    ``data_iterator`` is what ``ray.train.get_dataset_shard`` returns (or a Dataset). Each batch
    must be one whole step, in order, starting at ``expected_start_step`` when given; anything
    else is a DataError rather than silently different training data. Whole blocks are fetched
    and cut into steps here: Ray's per-batch slicing costs more than the read on small batches.
    """
    import torch  # here: the read tasks and the Train controller import this module, not torch

    expected, first = expected_start_step, True
    slot_pattern = np.arange(rows_per_batch)
    blocks = data_iterator.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=2)
    for rows in _whole_steps(_unwrapped_errors(blocks), rows_per_batch):
        for start in range(0, len(rows["step"]), rows_per_batch):
            steps = rows["step"][start : start + rows_per_batch]
            slots = rows["slot"][start : start + rows_per_batch]
            if first and expected is None:
                expected = int(steps[0])
            elif first and (steps == steps[0]).all() and steps[0] != expected:
                raise DataError(
                    f"the Ray dataset starts at step {int(steps[0])} but training resumes at step "
                    f"{expected}; build it with ray_train_dataset(start_step={expected})"
                )
            first = False
            if (steps != expected).any() or (slots != slot_pattern).any():
                raise DataError(
                    f"Ray Data delivered rows of steps {sorted(set(steps.tolist()))} (slots "
                    f"{slots[:4].tolist()}...) where step {expected} (slots 0..{rows_per_batch - 1}) "
                    f"was expected; {ORDER_HINT}"
                )
            window = rows["tokens"][start : start + rows_per_batch]
            yield torch.from_numpy(window.astype(np.int64))
            expected += 1


def _unwrapped_errors(blocks: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """A read task's DataError (a corrupt shard, ...) raised as itself, one line: Ray hands it
    over wrapped, with the remote traceback and retry advice appended to its message."""
    try:
        yield from blocks
    except DataError as e:
        cause = getattr(e, "cause", e)
        raise type(cause)(str(cause).splitlines()[0]) from None


def _whole_steps(
    blocks: Iterator[dict[str, np.ndarray]], rows_per_batch: int
) -> Iterator[dict[str, np.ndarray]]:
    """Regroup blocks into runs of whole steps (a block may end mid-step)."""
    carry: dict[str, np.ndarray] | None = None
    for block in blocks:
        if carry is not None:
            block = {k: np.concatenate([carry[k], v]) for k, v in block.items()}
        whole = len(block["step"]) // rows_per_batch * rows_per_batch
        carry = {k: v[whole:] for k, v in block.items()} if whole < len(block["step"]) else None
        if whole:
            yield {k: v[:whole] for k, v in block.items()}
    if carry is not None:
        raise DataError(
            f"the Ray dataset ended {len(carry['step'])} rows into a step of {rows_per_batch} "
            "rows; build it with ray_train_dataset, which holds whole steps"
        )

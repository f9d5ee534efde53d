"""Multiple-choice task evals in the training loop: ranked classification and gold bits per byte.

Each (example, choice) pair is one row: EOS + prompt + choice, cut from the left to ``seq_len + 1``
tokens, the choice's tokens scored by the model. An example is right (``acc``) when its gold
choice has the highest log-likelihood, (``acc_norm``) the highest per byte of the choice (as OLMo
normalises), and ``bpb`` is the gold choice's negative log-likelihood in bits per byte of its
text, the "task loss" that a ladder's two-step prediction fits. A task whose examples carry an
uncond context also scores each choice after it alone (EOS + uncond context + choice, one more
row per choice) for ``acc_pmi``, the highest log-likelihood gain from the context: the
domain-conditional PMI of Holtzman et al. (2021), which takes out how typical a choice is on its
own, where small models' raw scores mostly rank typicality. All tokenizing and packing happens
once per run; each eval is a fixed list of padded ``[B, L]`` micro-batches per rank.

Data-parallel ranks score disjoint examples (rank r gets r::dp_size) but run the same number of
forwards (short ranks add empty rows), since a sharded model's forward is a collective. Each
rank's per-task sums are reduced as one device tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainer_core.config.sections import TrainConfig
from trainer_core.data.shards import DataError, Manifest
from trainer_core.data.tasks import Task, load_tasks
from trainer_core.data.tokenizer import ByteTokenizer, Continuation, Tokenizer, load_tokenizer
from trainer_core.io import storage

SUMS = ("acc", "acc_norm", "bpb", "acc_pmi", "count", "calibrated")
"""Per-task sums reduced across ranks: the first three metrics are divided by ``count``,
``acc_pmi`` by ``calibrated`` (the examples with an uncond context: all of a task's, or none)."""


@dataclass(frozen=True)
class MicroBatch:
    """Host tensors of one forward: inputs and targets ``[B, L]``, the mask of the choice's
    target positions, and each row's index into this rank's rows (-1 = padding row)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor


def _row_tokens(prefix: np.ndarray, choice: np.ndarray, seq_len: int) -> tuple[np.ndarray, int]:
    """The row's ``seq_len + 1`` tokens at most (left-truncated) and how many end it as choice."""
    seq = np.concatenate([prefix, choice])[-(seq_len + 1) :]
    return seq, min(len(choice), len(seq) - 1)


def _check_fits(choices: list[Continuation], seq_len: int, where: str) -> None:
    """A choice scored in part would be divided by all its bytes (bits per byte too low, the
    cut choice favoured): refuse one with no room for a token of context."""
    longest = max(len(c.ids) for c in choices)
    if longest > seq_len:
        raise DataError(
            f"{where}: a choice of {longest} tokens leaves no room for its context in "
            f"data.seq_len {seq_len}: shorten the task's choices or raise data.seq_len"
        )


def _add_rows(
    part: dict, start: np.ndarray, choices: list[Continuation], seq_len: int, width: int
) -> np.ndarray:
    """One row per choice after its context, appended to a rank's rows; their indices, padded
    to ``width`` with -1."""
    rows = np.full(width, -1)
    for c, choice in enumerate(choices):
        seq, n = _row_tokens(np.concatenate([start, choice.context]), choice.ids, seq_len)
        rows[c] = len(part["seqs"])
        part["seqs"].append(seq)
        part["n_choice"].append(n)
    return rows


class TaskEvaluator:
    """Built once per run; :meth:`evaluate` scores every task with the current model."""

    def __init__(
        self,
        tasks: list[Task],
        tokenizer: Tokenizer,
        seq_len: int,
        micro_batch_seqs: int,
        dp_rank: int = 0,
        dp_size: int = 1,
    ):
        if micro_batch_seqs < 1 or not 0 <= dp_rank < dp_size:
            raise ValueError(f"bad micro_batch_seqs={micro_batch_seqs} or rank {dp_rank}/{dp_size}")
        self.names = [t.name for t in tasks]
        self.chance = [float(np.mean([1 / len(e.choices) for e in t.examples])) for t in tasks]
        self.micro_batch_seqs = micro_batch_seqs
        start = np.array([tokenizer.eos_id])
        # Per rank: rows (token arrays, choice lengths), and per example its task id, gold, and
        # choices' (row index, uncond row index, byte count) as padded [E, C] arrays.
        per_rank: list[dict] = [
            {"seqs": [], "n_choice": [], "task": [], "gold": [], "row": [], "urow": [], "bytes": []}
            for _ in range(dp_size)
        ]
        width = max(len(e.choices) for t in tasks for e in t.examples) if tasks else 1
        index = 0
        for task_id, task in enumerate(tasks):
            for number, ex in enumerate(task.examples, start=1):
                part = per_rank[index % dp_size]
                index += 1
                choices = tokenizer.encode_continuations(ex.prompt, list(ex.choices))
                _check_fits(choices, seq_len, f"task {task.name!r}, example {number}")
                nbytes = np.ones(width)
                nbytes[: len(choices)] = [c.nbytes for c in choices]
                part["row"].append(_add_rows(part, start, choices, seq_len, width))
                urows = np.full(width, -1)
                if ex.uncond_prompt is not None:
                    uncond = tokenizer.encode_continuations(ex.uncond_prompt, list(ex.choices))
                    urows = _add_rows(part, start, uncond, seq_len, width)
                part["urow"].append(urows)
                part["task"].append(task_id)
                part["gold"].append(ex.gold)
                part["bytes"].append(nbytes)
        n_batches = max(-(-len(p["seqs"]) // micro_batch_seqs) for p in per_rank)
        mine = per_rank[dp_rank]
        self.n_rows = len(mine["seqs"])
        self.batches = self._pack(mine["seqs"], mine["n_choice"], n_batches)
        self.task_id = torch.tensor(mine["task"], dtype=torch.long)
        self.gold = torch.tensor(mine["gold"], dtype=torch.long)
        self.choice_row = torch.tensor(np.array(mine["row"]).reshape(-1, width), dtype=torch.long)
        self.uncond_row = torch.tensor(np.array(mine["urow"]).reshape(-1, width), dtype=torch.long)
        self.choice_bytes = torch.tensor(
            np.array(mine["bytes"]).reshape(-1, width), dtype=torch.float64
        )

    def _pack(self, seqs: list[np.ndarray], n_choice: list[int], n_batches: int) -> list:
        """Rows sorted by length (little padding), cut into ``n_batches`` micro-batches."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        size = self.micro_batch_seqs
        batches = []
        for b in range(n_batches):
            chunk = order[b * size : (b + 1) * size]
            width = max((len(seqs[i]) - 1 for i in chunk), default=1)
            inputs = np.zeros((max(len(chunk), 1), width), dtype=np.int64)
            targets = np.zeros_like(inputs)
            mask = np.zeros(inputs.shape, dtype=bool)
            rows = np.full(inputs.shape[0], -1, dtype=np.int64)
            for j, i in enumerate(chunk):
                seq, n = seqs[i], n_choice[i]
                inputs[j, : len(seq) - 1] = seq[:-1]
                targets[j, : len(seq) - 1] = seq[1:]
                mask[j, len(seq) - 1 - n : len(seq) - 1] = True
                rows[j] = i
            batches.append(
                MicroBatch(*(torch.from_numpy(a) for a in (inputs, targets, mask, rows)))
            )
        return batches

    def _row_logprobs(self, forward: Callable, device: torch.device) -> torch.Tensor:
        """Each of this rank's rows' summed log-probability of its choice tokens."""
        out = torch.zeros(self.n_rows + 1, dtype=torch.float64, device=device)
        for mb in self.batches:
            logits = forward(mb.inputs.to(device, non_blocking=True))
            targets = mb.targets.to(device, non_blocking=True)
            # log_softmax at the targets only: no second [B, L, V] tensor at a large vocab
            picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()
            token_lp = picked - torch.logsumexp(logits.float(), dim=-1)
            sums = (token_lp * mb.mask.to(device)).sum(dim=1).double()
            rows = mb.rows.to(device)
            out.index_add_(0, torch.where(rows < 0, self.n_rows, rows), sums)
        return out[:-1]

    @torch.no_grad()
    def evaluate(
        self,
        forward: Callable[[torch.Tensor], torch.Tensor],
        device: torch.device | str,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    ) -> dict[str, float]:
        """``task/<name>/{acc,acc_norm,bpb}`` over all ranks' examples (and ``acc_pmi`` for a
        task with uncond contexts), ``chance`` (the accuracy of a random guess, for the
        analysis's near-chance flag) and ``examples`` (how many were scored: an accuracy's
        sampling noise). ``forward`` maps inputs ``[B, L]`` to logits ``[B, L, V]``;
        ``all_reduce`` sums a tensor over the DP ranks (in place or returned)."""
        device = torch.device(device)
        row_lp = self._row_logprobs(forward, device)
        rows = self.choice_row.to(device)
        nbytes = self.choice_bytes.to(device)
        urows = self.uncond_row.to(device)
        ll = torch.where(rows >= 0, row_lp[rows.clamp(min=0)], -math.inf)
        gold = self.gold.to(device).unsqueeze(1)

        def right(scores: torch.Tensor) -> torch.Tensor:
            return (scores.argmax(dim=1, keepdim=True) == gold).double().squeeze(1)

        calibrated = (urows[:, 0] >= 0).double()
        gain = ll - torch.where(urows >= 0, row_lp[urows.clamp(min=0)], 0.0)
        bpb = -(ll.gather(1, gold) / nbytes.gather(1, gold)).squeeze(1) / math.log(2)
        per_example = torch.stack(
            [
                right(ll),
                right(ll / nbytes),
                bpb,
                right(gain) * calibrated,
                torch.ones_like(bpb),
                calibrated,
            ],
            dim=1,
        )
        sums = torch.zeros(len(self.names), len(SUMS), dtype=torch.float64, device=device)
        sums.index_add_(0, self.task_id.to(device), per_example)
        reduced = all_reduce(sums)  # torch.distributed.all_reduce sums in place, returns None
        totals = (sums if reduced is None else reduced).tolist()
        metrics = {}
        for name, row, chance in zip(self.names, totals, self.chance, strict=True):
            sums = dict(zip(SUMS, row, strict=True))
            for key in ("acc", "acc_norm", "bpb"):
                metrics[f"task/{name}/{key}"] = sums[key] / max(sums["count"], 1.0)
            if sums["calibrated"]:
                metrics[f"task/{name}/acc_pmi"] = sums["acc_pmi"] / sums["calibrated"]
            metrics[f"task/{name}/chance"] = chance
            metrics[f"task/{name}/examples"] = sums["count"]
        return metrics


def shards_tokenizer(cfg: TrainConfig, manifest: Manifest) -> Tokenizer:
    """The tokenizer the shards were made with: tasks must be tokenized as the model was trained."""
    info = manifest.tokenizer
    if info.kind == ByteTokenizer.kind:
        tok: Tokenizer = ByteTokenizer()
    elif cfg.data.tokenizer != "byte":
        tok = load_tokenizer(cfg.data.tokenizer)
    elif not storage.is_url(manifest.dir) and Path(manifest.dir).is_dir():
        tok = load_tokenizer(manifest.dir)
    else:
        raise DataError(
            f"{manifest.dir}: evals.tasks needs the shards' tokenizer; set data.tokenizer to it"
        )
    if tok.content_hash != info.content_hash:
        raise DataError(
            f"{manifest.dir}: evals.tasks found another tokenizer than the shards'; "
            "set data.tokenizer to the one they were made with"
        )
    return tok


def build_task_evaluator(
    cfg: TrainConfig, manifest: Manifest, dp_rank: int, dp_size: int
) -> TaskEvaluator | None:
    """The run's task evals (None when ``evals.tasks`` is empty). Built-in tasks go beside the
    demo shards when the run trains on them."""
    if not cfg.evals.tasks:
        return None
    demo = not (cfg.data.shards or cfg.data.mix)
    tasks = load_tasks(cfg.evals.tasks, manifest.dir if demo else None, cfg.evals.max_examples)
    micro = cfg.train_module.rank_microbatch_seqs or cfg.batch_seqs // dp_size
    return TaskEvaluator(
        tasks, shards_tokenizer(cfg, manifest), cfg.data.seq_len, micro, dp_rank, dp_size
    )

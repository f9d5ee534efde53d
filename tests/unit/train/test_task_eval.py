"""Task scoring against hand-computed log-likelihoods of a bigram ``forward``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer_core.data.shards import DataError
from trainer_core.data.tasks import Task, TaskExample
from trainer_core.data.tokenizer import ByteTokenizer, train_bpe
from trainer_core.train.task_eval import TaskEvaluator

TOK = ByteTokenizer()
V = TOK.vocab_size
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
LOGP = torch.log_softmax(TABLE, dim=-1).numpy()


class Bigram:
    """Logits depend only on the input token at each position; records the batch sizes."""

    def __init__(self):
        self.batch_sizes: list[int] = []

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(inputs.shape[0])
        return TABLE[inputs].float()


def choice_logprob(prompt: str, choice: str, seq_len: int) -> float:
    ids = [TOK.eos_id, *prompt.encode(), *choice.encode()][-(seq_len + 1) :]
    n = min(len(choice.encode()), len(ids) - 1)
    return sum(LOGP[ids[i - 1], ids[i]] for i in range(len(ids) - n, len(ids)))


def by_hand(task: Task, seq_len: int) -> dict[str, float]:
    acc, acc_norm, bpb, acc_pmi = [], [], [], []
    for ex in task.examples:
        ll = np.array([choice_logprob(ex.prompt, c, seq_len) for c in ex.choices])
        nbytes = np.array([len(c.encode()) for c in ex.choices])
        acc.append(ll.argmax() == ex.gold)
        acc_norm.append((ll / nbytes).argmax() == ex.gold)
        bpb.append(-ll[ex.gold] / nbytes[ex.gold] / math.log(2))
        if ex.uncond_prompt is not None:
            alone = np.array([choice_logprob(ex.uncond_prompt, c, seq_len) for c in ex.choices])
            acc_pmi.append((ll - alone).argmax() == ex.gold)
    name = task.name
    metrics = {
        f"task/{name}/acc": float(np.mean(acc)),
        f"task/{name}/acc_norm": float(np.mean(acc_norm)),
        f"task/{name}/bpb": float(np.mean(bpb)),
        f"task/{name}/chance": float(np.mean([1 / len(ex.choices) for ex in task.examples])),
        f"task/{name}/examples": float(len(task.examples)),
    }
    if acc_pmi:
        metrics[f"task/{name}/acc_pmi"] = float(np.mean(acc_pmi))
    return metrics


def make_task(name: str, n: int, seed: int, uncond: bool = False) -> Task:
    """Random examples of 2-4 choices; with ``uncond``, each has an uncond prompt (some empty)."""
    rng = np.random.default_rng(seed)
    words = ["a", "bb", "ccc", "x = 1", "def f():", "return y", "é"]
    examples = []
    for _ in range(n):
        prompt = " ".join(rng.choice(words, size=int(rng.integers(1, 8))))
        k = int(rng.integers(2, 5))
        choices = tuple(str(w) for w in rng.choice(words, size=k, replace=False))
        alone = str(rng.choice(["", "\n", "x = 1 ", "é"])) if uncond else None
        examples.append(TaskExample(prompt, choices, int(rng.integers(0, k)), alone))
    return Task(name, tuple(examples))


TASKS = [make_task("one", 13, 1), make_task("two", 8, 2), make_task("pmi", 11, 4, uncond=True)]


@pytest.mark.parametrize("seq_len", [64, 9])
def test_metrics_match_hand_computation(seq_len):
    forward = Bigram()
    got = TaskEvaluator(TASKS, TOK, seq_len, micro_batch_seqs=5).evaluate(forward, "cpu")
    want = {k: v for task in TASKS for k, v in by_hand(task, seq_len).items()}
    assert got.keys() == want.keys()
    assert "task/pmi/acc_pmi" in got and "task/one/acc_pmi" not in got
    assert got["task/pmi/acc_pmi"] != got["task/pmi/acc"]  # a different ranking, not a copy
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-5), key
    assert max(forward.batch_sizes) <= 5
    rows = sum(
        len(e.choices) * (1 + (e.uncond_prompt is not None)) for t in TASKS for e in t.examples
    )
    assert sum(forward.batch_sizes) >= rows


def test_two_ranks_sum_to_one_rank():
    one = TaskEvaluator(TASKS, TOK, 64, micro_batch_seqs=4).evaluate(Bigram(), "cpu")
    ranks = [TaskEvaluator(TASKS, TOK, 64, 4, dp_rank=r, dp_size=2) for r in range(2)]
    forwards = [Bigram(), Bigram()]
    partial: list[torch.Tensor] = []
    ranks[1].evaluate(forwards[1], "cpu", lambda t: partial.append(t.clone()))
    two = ranks[0].evaluate(forwards[0], "cpu", lambda t: t + partial[0])
    assert len(forwards[0].batch_sizes) == len(forwards[1].batch_sizes)
    assert max(forwards[0].batch_sizes + forwards[1].batch_sizes) <= 4
    for key, value in one.items():
        assert two[key] == pytest.approx(value, rel=1e-5), key


def test_in_place_all_reduce_is_accepted():
    def in_place(t: torch.Tensor) -> None:
        t.mul_(1.0)

    got = TaskEvaluator(TASKS[:1], TOK, 64, 8).evaluate(Bigram(), "cpu", in_place)
    assert got == pytest.approx(by_hand(TASKS[0], 64), rel=1e-5)


def test_a_rank_with_no_examples_still_runs_the_same_forwards():
    task = [make_task("tiny", 1, 3)]
    empty = Bigram()
    metrics = TaskEvaluator(task, TOK, 64, 8, dp_rank=1, dp_size=2).evaluate(empty, "cpu")
    assert len(empty.batch_sizes) == 1
    assert metrics["task/tiny/acc"] == 0.0


def test_bpe_rows_score_the_tokens_of_the_whole_text():
    """A BPE task's rows are the tokens of context + choice encoded as one text (the choice's
    leading space in its first token, as in training text), the choice's tokens masked for
    scoring and the bytes they cover counted for bits per byte."""
    tok = train_bpe(["abc de abc de fg abc"] * 30, 300)
    example = TaskExample("de fg ", ("abc", "abc de"), 0, None)
    evaluator = TaskEvaluator([Task("t", (example,))], tok, 64, micro_batch_seqs=4)
    (mb,) = evaluator.batches
    scored = set()
    for j in range(2):
        end = int(mb.mask[j].nonzero().max()) + 1
        row = [int(mb.inputs[j, 0]), *mb.targets[j, :end].tolist()]
        text = tok.tok.decode(row[1:])
        assert row == [tok.eos_id, *tok.encode_arrays([text])[0]]
        scored.add((text, tok.tok.decode(mb.targets[j][mb.mask[j]].tolist())))
    assert scored == {("de fg abc", " abc"), ("de fg abc de", " abc de")}
    assert evaluator.choice_bytes[0, :2].tolist() == [4.0, 7.0]


def test_a_choice_longer_than_the_sequence_is_refused_by_task_and_example():
    """Cut to seq_len, a choice was scored in part but divided by all its bytes."""
    task = Task(
        "long", (TaskExample("q", ("a", "b"), 0, None), TaskExample("q", ("a", "b" * 9), 0, None))
    )
    with pytest.raises(DataError, match=r"task 'long', example 2: a choice of 9 tokens .* 8"):
        TaskEvaluator([task], TOK, 8, micro_batch_seqs=4)
    TaskEvaluator([task], TOK, 9, micro_batch_seqs=4)  # one token of context: EOS

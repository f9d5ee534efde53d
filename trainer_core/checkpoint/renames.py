"""Parameters renamed since checkpoints were first written, so a run saved before a rename
resumes after it instead of stopping with "missing from checkpoint".

A checkpoint holds each parameter under its name in the model (``lm_head.w_out.weight``), as a
model state key, an optimizer state key and an entry of the param groups' ``params`` lists.
Loading asks the checkpoint for the names it was saved with and hands the values back under
today's names.
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint._nested_dict import flatten_state_dict

RENAMED = {"norm.weight": "lm_head.norm.weight", "head.weight": "lm_head.w_out.weight"}
"""Old name -> current name. The final norm and output projection became one module, the LM
head, so that compile fuses the head's matmul with the loss (issue 25)."""


def rename_parameters(value: Any, names: dict[str, str]) -> Any:
    """The nested state ``value`` with parameter names replaced per ``names``, as dict keys and
    in ``params`` lists. Copied only where a name changes: every other dict (the trainer's step,
    say) and every tensor stays the same object, so a load fills them in place."""
    if isinstance(value, dict):
        out = {names.get(key, key): _renamed_item(key, item, names) for key, item in value.items()}
        unchanged = list(out) == list(value) and all(
            a is b for a, b in zip(out.values(), value.values(), strict=True)
        )
        return value if unchanged else out
    if isinstance(value, list):
        out = [rename_parameters(item, names) for item in value]
        return value if all(a is b for a, b in zip(out, value, strict=True)) else out
    return value


def _renamed_item(key: Any, item: Any, names: dict[str, str]) -> Any:
    if key == "params" and isinstance(item, list):
        renamed = [names.get(n, n) for n in item]
        return item if renamed == item else renamed
    return rename_parameters(item, names)


def as_saved(state: dict[str, Any], saved_keys: set[str]) -> tuple[dict[str, Any], bool]:
    """``state`` under the parameter names the checkpoint uses: itself, or (when only the old
    names are all in the checkpoint) renamed to them, with True to say so; then
    ``rename_parameters(loaded, RENAMED)`` brings the loaded values back to today's names."""
    old = rename_parameters(state, {new: old for old, new in RENAMED.items()})

    def all_saved(candidate: dict[str, Any]) -> bool:
        asked = {k: v for k, v in candidate.items() if k != "rng"}
        return set(flatten_state_dict(asked)[0]) <= saved_keys

    if not all_saved(state) and all_saved(old):
        return old, True
    return state, False

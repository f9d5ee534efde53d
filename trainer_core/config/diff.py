"""Which settings differ between a recorded config and the one at hand (as plain dicts)."""

from __future__ import annotations

from typing import Any


def changed_keys(
    recorded: dict[str, Any], current: dict[str, Any], prefix: str = "", one_side: bool = True
) -> list[str]:
    """Dotted keys whose values differ between two config dicts, in the order they first
    appear. A key on one side only counts unless ``one_side`` is False (a setting added to the
    schema since the record was written is not a change of the record's run)."""
    keys = []
    for key in dict.fromkeys([*recorded, *current]):
        if not one_side and not (key in recorded and key in current):
            continue
        name, old, new = f"{prefix}{key}", recorded.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            keys += changed_keys(old, new, f"{name}.", one_side)
        elif old != new:
            keys.append(name)
    return keys

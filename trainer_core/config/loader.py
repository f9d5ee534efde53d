"""Typed dataclass configs from a YAML file plus dotted CLI overrides, and back to YAML.

Levanter-style: a config is a tree of dataclasses; a YAML file fills it (read and decoded by
draccus in :mod:`trainer_core.config.decode`), and ``--a.b=value`` overrides a leaf. The
overrides are ours, not draccus's command line, which opens any value starting with ``include``
as a file. Every mistake becomes one :class:`ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

import yaml

from trainer_core.config.decode import (
    ConfigError,
    field_type,
    from_dict,
    load_yaml,
    without_ignored,
)

T = TypeVar("T")


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain YAML-safe data (the inverse of :func:`from_dict`)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def to_yaml(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj), sort_keys=False)


def parse_override_value(text: str) -> Any:
    """``--x=[1,2]`` -> [1, 2], ``--x=null`` -> None, else what YAML reads (the text itself where
    YAML can't): ``3e-4``, a string to YAML 1.1, becomes a number where the field's type says so
    (:mod:`trainer_core.config.decode`), as it does in a config file."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(cls: type, data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--a.b=value`` (or ``a.b=value``) overrides of ``cls``'s fields to a nested
    mapping, in order. A string field takes the value as typed, so ``--tracking.name=007`` names
    a run "007", not 7; every other field reads it as YAML."""
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        if "=" not in text:
            raise ConfigError(f"override {item!r} must look like --section.key=value")
        dotted, raw = text.split("=", 1)
        keys = dotted.split(".")
        if not all(keys):
            raise ConfigError(f"override {item!r} has an empty key name: write --section.key=value")
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {k!r} is not a section")
            node = child
        node[keys[-1]] = raw if field_type(cls, keys) is str else parse_override_value(raw)
    return data


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None
) -> T:
    """Load ``cls`` from an optional YAML file plus dotted overrides; defaults fill the rest.
    A config with a ``check_given(data)`` method also checks which keys the user gave: the
    typed config alone cannot tell a value given from its default."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = load_yaml(path)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        data = without_ignored(cls, loaded or {})
    apply_overrides(cls, data, overrides or [])
    config = from_dict(cls, data)
    if check_given := getattr(config, "check_given", None):
        check_given(data)
    return config

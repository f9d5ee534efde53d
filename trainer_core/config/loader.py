"""Typed dataclass configs from YAML files and dotted CLI overrides.

Levanter-style: a config is a tree of dataclasses; a YAML file fills it, ``!include other.yaml``
splices in another file (relative to the including one), and ``--a.b=value`` overrides a leaf.
Every mistake (unknown key, wrong type, bad value) becomes one :class:`ConfigError` that names
the dotted path, the value and what is allowed, so a user never has to read a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from trainer_core.errors import UserError

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    """A config value, key or file is invalid; the message says where and what is allowed."""


def _include_loader(chain: tuple[Path, ...]) -> type[yaml.SafeLoader]:
    """A loader whose ``!include`` reads a file relative to ``chain[-1]``, the one being loaded."""

    class IncludeLoader(yaml.SafeLoader):
        pass

    def include(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        target = (chain[-1].parent / loader.construct_scalar(node)).resolve()
        if target in chain:
            cycle = " -> ".join(str(p) for p in (*chain, target))
            raise ConfigError(f"!include cycle: {cycle}; remove one of these includes")
        return load_yaml(target, chain)

    IncludeLoader.add_constructor("!include", include)
    return IncludeLoader


def load_yaml(path: str | Path, included_from: tuple[Path, ...] = ()) -> Any:
    """Read a YAML file, resolving ``!include`` relative to that file.

    ``included_from`` are the files whose includes led here, so a cycle is reported with its
    chain instead of recursing until Python gives up."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    loader = _include_loader((*included_from, path.resolve()))
    try:
        with path.open() as f:
            return yaml.load(f, Loader=loader)  # noqa: S506 (SafeLoader subclass)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None


@dataclasses.dataclass(frozen=True)
class CliValue:
    """An override as typed and as YAML reads it: a string field takes ``text``, so
    ``--name=007`` names a run "007", not 7; every other field takes ``value``."""

    text: str
    value: Any


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is list:
        return f"list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return f"mapping of {_type_name(get_args(tp)[1])}"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return _FRIENDLY.get(tp, getattr(tp, "__name__", str(tp)))


_FRIENDLY = {int: "integer", float: "number", str: "string", bool: "true/false"}


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert it (int -> float, dict -> dataclass)."""
    origin = get_origin(tp)
    if isinstance(value, CliValue) and origin not in (Union, types.UnionType):
        return value.text if tp is str else _coerce(value.value, tp, path)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        plain = value.value if isinstance(value, CliValue) else value
        if plain is None and type(None) in args:
            return None
        # Try the most specific options first so "3" (an int) stays an int in ``int | float``.
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError:
                continue
        raise ConfigError(f"{path}: {plain!r} is not a valid {_type_name(tp)}")
    if origin is typing.Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{path}: {value!r} is not allowed; use {_type_name(tp)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a {_type_name(tp)}, got {value!r}")
        (item_tp,) = get_args(tp)
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a {_type_name(tp)}, got {value!r}")
        _, val_tp = get_args(tp)
        return {str(k): _coerce(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping for {tp.__name__}, got {value!r}")
        return from_dict(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if tp is float:
        number = _as_float(value)
        if number is None:
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(number):
            raise ConfigError(f"{path}: {number} is not a finite number")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        hint = "; quote it" if isinstance(value, (int, float)) else ""
        raise ConfigError(f"{path}: expected a string, got {value!r}{hint}")
    if isinstance(value, tp):
        return value
    raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}")


def _as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def suggest(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def from_dict(cls: type[T], data: dict[str, Any], path: str = "") -> T:
    """Build dataclass ``cls`` from a plain mapping, checking keys and types on the way."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        moved = getattr(cls, "MOVED_KEYS", {}).get(key)
        if key not in fields and moved:
            raise ConfigError(f"{where}: this key moved; set {moved} instead")
        if key not in fields:
            raise ConfigError(
                f"{where}: unknown key{suggest(str(key), list(fields))}; "
                f"allowed keys: {', '.join(fields)}"
            )
        kwargs[key] = _coerce(value, hints[key], where)
    try:
        obj = cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(
            f"{path}.{e}" if path and not str(e).startswith(path) else str(e)
        ) from None
    return obj


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
    """``--x=3e-4`` -> 0.0003, ``--x=[1,2]`` -> [1, 2], ``--x=null`` -> None, else the string."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value) if any(c in value for c in ".eE") else value
        except ValueError:
            return value
    return value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--a.b=value`` (or ``a.b=value``) overrides to a nested mapping, in order."""
    for item in overrides:
        text = item[2:] if item.startswith("--") else item
        if "=" not in text:
            raise ConfigError(f"override {item!r} must look like --section.key=value")
        dotted, raw = text.split("=", 1)
        keys = dotted.split(".")
        node = data
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {k!r} is not a section")
            node = child
        node[keys[-1]] = CliValue(raw, parse_override_value(raw))
    return data


def load_config(
    cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None
) -> T:
    """Load ``cls`` from an optional YAML file plus dotted overrides; defaults fill the rest."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = load_yaml(path)
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        data = loaded or {}
    apply_overrides(data, overrides or [])
    return from_dict(cls, data)


def field_help(cls: type, prefix: str = "") -> list[str]:
    """One line per leaf field (``--model.d_model=int (default 128)``) for ``--help`` output."""
    lines = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            lines.extend(field_help(tp, dotted + "."))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "required"
        lines.append(f"  --{dotted}={_type_name(tp)}  (default: {to_dict(default)!r})")
    return lines

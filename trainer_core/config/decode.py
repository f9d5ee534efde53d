"""YAML files and plain data -> typed dataclass configs, through draccus, with our errors.

draccus reads the YAML (its ``<<: !include base.yaml`` merge; our ``!include`` on top, which knows
the chain of files and so names a cycle) and decodes a mapping into the dataclasses. Every
failure becomes one :class:`ConfigError` naming the dotted key. Checked by
``tests/unit/config/test_decode.py``, we rely on ``SafeLoaderWithInclusion``, on the wording of
draccus's unknown- and missing-field errors, on a section's own error being the cause of
draccus's ``ParsingError``, and on PyYAML's ``compose_mapping_node`` and ``Reader.name``.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

import draccus
import yaml
from draccus.parsers.yaml_loader import SafeLoaderWithInclusion
from draccus.utils import DecodingError, ParsingError

from trainer_core.errors import UserError

T = TypeVar("T")


class ConfigError(UserError, ValueError):
    """A config value, key or file is invalid; the message says where and what is allowed.

    Defined here, at the bottom of the config package, as both this module and ``loader`` raise
    it; everyone else imports it from ``loader``."""


def suggest(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def repeated(names: list[str]) -> list[str]:
    """The items listed more than once, each once, in the order they first appear: sizes or
    trial names that would share a run dir, a task example's duplicated choices."""
    return [n for i, n in enumerate(names) if names.count(n) > 1 and names.index(n) == i]


class _IncludeLoader(SafeLoaderWithInclusion):
    """draccus's loader, whose ``<<: !include`` merge we keep, with an ``!include`` that reads
    relative to the including file and stops at a cycle instead of recursing until Python does,
    and mappings that refuse a key written twice (PyYAML keeps the last one without a word)."""

    chain: tuple[Path, ...] = ()
    """The files whose includes led here, the one being read last."""

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        """Checked as written, before ``<<`` merges are flattened in: a key may override a merged
        one, but not another key of its own mapping."""
        node = super().compose_mapping_node(anchor)
        lines: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
                continue
            line = key.start_mark.line + 1
            if (first := lines.get((key.tag, key.value))) is not None:
                raise ConfigError(
                    f"{self.name}:{line}: key {key.value!r} appears twice in one mapping (first "
                    f"on line {first}); keep one"
                )
            lines[key.tag, key.value] = line
        return node


def _include(loader: _IncludeLoader, node: yaml.Node) -> Any:
    target = (loader.chain[-1].parent / loader.construct_scalar(node)).resolve()
    if target in loader.chain:
        cycle = " -> ".join(str(p) for p in (*loader.chain, target))
        raise ConfigError(f"!include cycle: {cycle}; remove one of these includes")
    return load_yaml(target, loader.chain)


_IncludeLoader.add_constructor("!include", _include)


def load_yaml(path: str | Path, included_from: tuple[Path, ...] = ()) -> Any:
    """Read a YAML file, resolving ``!include`` relative to that file."""
    path = Path(path)
    loader = _IncludeLoader(io.StringIO(_read_text(path)))  # a stream: marks without snippets
    loader.name = str(path)  # named in YAML's errors and ours
    loader.chain = (*included_from, path.resolve())
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None
    finally:
        loader.dispose()


def _read_text(path: Path) -> str:
    """The file as UTF-8 text, which YAML files are: a file saved in another encoding, a
    directory or an unreadable file is one line, not Python's traceback."""
    if path.is_dir():
        raise ConfigError(f"config file {str(path)!r} is a directory: give a YAML file")
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 (byte {e.start}): save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {e.strerror}") from None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None
    except OverflowError:  # an integer beyond float's range
        return math.inf


class _Explained(DecodingError):
    """Raised by our decoders: the message is already ours."""


def _whole_number(raw: Any) -> int | None:
    """``20.0``, and ``2e6`` or ``65e3``, which YAML 1.1 reads as strings (its floats need a dot
    and a signed exponent), as integers, as the command line reads them: a string counts only
    when written as a decimal or an exponent, so ``'12'``, quoted, stays a string."""
    if isinstance(raw, str) and any(c in raw for c in ".eE"):
        raw = _as_float(raw)
    if isinstance(raw, float) and math.isfinite(raw) and raw.is_integer():
        return int(raw)
    return None


def _decode_scalar(tp: type, raw: Any, path: tuple[str, ...]) -> Any:
    """Ours, not draccus's, for bool/int/float/str: ``2e6`` and ``20.0`` are integers, ``inf``
    is not a number, ``123`` is not a string, and ``null`` is none of them."""
    if tp is int and (whole := _whole_number(raw)) is not None:
        return whole
    if tp is float:
        number = _as_float(raw)
        if number is None:
            raise _Explained(path, f"expected a number, got {raw!r}")
        if not math.isfinite(number):
            raise _Explained(path, f"{number} is not a finite number")
        return number
    if isinstance(raw, tp) and not (tp is int and isinstance(raw, bool)):
        return raw
    expected = {bool: "true or false", int: "an integer", str: "a string"}[tp]
    hint = "; quote it" if tp is str and isinstance(raw, (int, float)) else ""
    raise _Explained(path, f"expected {expected}, got {raw!r}{hint}")


for _tp in (bool, int, float, str):
    # include_subclasses: draccus then calls it for null too (a plain registration gets no null)
    draccus.decode.register(_tp, _decode_scalar, include_subclasses=True)


def field_type(cls: type, keys: list[str] | tuple[str, ...]) -> Any:
    """The annotation at ``keys`` (field names, list indices, mapping keys) below ``cls``."""
    tp: Any = cls
    for key in keys:
        if dataclasses.is_dataclass(tp):
            tp = get_type_hints(tp).get(key)
        elif get_origin(tp) in (list, dict):
            tp = get_args(tp)[-1]
        else:
            return None
    return tp


def from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build dataclass ``cls`` from a plain mapping; any mistake is one ConfigError."""
    try:
        return draccus.decode(cls, data)
    except DecodingError as e:
        raise ConfigError(_explain(cls, data, e)) from None
    except ParsingError as e:  # a section's own check failed; draccus names only its class
        if not isinstance(e.__cause__, ConfigError):
            raise
        message = str(e.__cause__)
        where = _dotted(_failing_section(cls, data, message))
        located = f"{where}.{message}" if where and not message.startswith(where) else message
        raise ConfigError(located) from None


def without_ignored(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """A config file's ``data`` less the top-level keys ``cls`` names in ``IGNORED_KEYS`` and has
    no field for: another entry point's section in a file both read (a sweep's ``sweep:`` given
    to its ladder). Only a file's, only at the top: the key stays unknown in any section below
    and on the command line (``--sweep.x`` to a ladder does nothing, so it is refused)."""
    ignored = getattr(cls, "IGNORED_KEYS", frozenset())
    if not ignored or not isinstance(data, dict):
        return data
    fields = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in fields or k not in ignored}


_UNKNOWN = re.compile(r"The fields `([^`]+)`.* are not valid for ")
_MISSING = re.compile(r"Missing required field\(s\) `(.+?)`")


def _explain(cls: type, data: dict[str, Any], error: DecodingError) -> str:
    """Our line for a draccus error: its key path, and the type and value found there."""
    keys = tuple(str(k) for k in error.key_path)
    where = _dotted(keys)
    unknown = _UNKNOWN.match(error.message)
    if no_value := _no_space_after_colon(data, (*keys, unknown[1]) if unknown else keys):
        return no_value
    if isinstance(error, _Explained):
        return f"{where}: {error.message}"
    if unknown:
        if not keys and (other := _other_kind(cls, data)):
            return f"{unknown[1]}: unknown key; {other}"
        return _unknown_key(cls, keys, unknown[1], _value_at(data, (*keys, unknown[1])))
    if missing := _MISSING.match(error.message):
        return f"{_dotted((*keys, missing[1]))}: required (there is no default)"
    tp = field_type(cls, keys)
    raw = _value_at(data, keys)
    if get_origin(tp) is list and isinstance(raw, list):  # draccus names the list, not the item
        i = next(i for i, item in enumerate(raw) if not isinstance(item, dict))
        where, tp, raw = f"{where}[{i}]", get_args(tp)[0], raw[i]
    if get_origin(tp) in (Union, types.UnionType):
        return f"{where}: {raw!r} is not a valid {_type_name(tp)}"
    if get_origin(tp) is typing.Literal:
        return f"{where}: {raw!r} is not allowed; use {_type_name(tp)}"
    if dataclasses.is_dataclass(tp):
        return f"{where}: expected a mapping for {tp.__name__}, got {raw!r}"
    return f"{where}: expected a {_type_name(tp)}, got {raw!r}"


def _value_at(data: Any, keys: tuple[str, ...]) -> Any:
    """The raw value at draccus's key path ``keys``, which names list indices and every mapping
    key (``5``, ``true``) as text."""
    for key in keys:
        if isinstance(data, list):
            data = data[int(key)]
        else:
            data = next(v for k, v in data.items() if str(k) == key)
    return data


def _no_space_after_colon(data: Any, keys: tuple[str, ...]) -> str | None:
    """YAML reads ``{15K:2}`` as the key ``15K:2`` with no value (a flow mapping's colon needs a
    space after it): say so, rather than "expected a number, got None" under that key."""
    if not keys or ":" not in keys[-1] or _value_at(data, keys) is not None:
        return None
    key, value = keys[-1].split(":", 1)
    return (
        f"{_dotted(keys[:-1]) or 'config'}: {keys[-1]!r} has no value; write {{{key}: {value}}} "
        "(a space after the colon, quoted in the shell)"
    )


def _unknown_key(cls: type, keys: tuple[str, ...], key: str, value: Any) -> str:
    """The line for ``key``, unknown in the section at ``keys``: where it moved, where it
    belongs elsewhere in ``cls`` (a key written at the wrong level), or the closest sibling."""
    section = field_type(cls, keys)
    dotted = _dotted((*keys, key))
    moved = getattr(section, "MOVED_KEYS", {}).get(key)
    if moved:
        return f"{dotted}: this key moved; set {moved} instead"
    foreign = getattr(section, "FOREIGN_KEYS", {}).get(key)
    if foreign:
        return f"{dotted}: {foreign}"
    if elsewhere := _elsewhere(cls, key, value):
        return f"{dotted}: unknown key here; {elsewhere}"
    fields = _settable(section)
    return f"{dotted}: unknown key{suggest(key, fields)}; allowed keys: {', '.join(fields)}"


def _paths_of(cls: type, key: str, at: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every (key path, annotation) in ``cls``'s tree of sections whose last key is ``key``."""
    found = []
    settable = _settable(cls)
    for name, tp in get_type_hints(cls).items():
        if name not in settable:
            continue
        if name == key:
            found.append(((*at, name), tp))
        if dataclasses.is_dataclass(tp):
            found += _paths_of(tp, key, (*at, name))
    return found


def _elsewhere(cls: type, key: str, value: Any) -> str | None:
    """Where ``key`` is a section or field of ``cls``'s tree, as the full path to write: the
    places whose kind fits ``value`` best (a mapping: a section holding its keys; anything else:
    a field), all of them when several fit as well."""

    def misfit(tp: Any) -> tuple[bool, bool]:
        if not dataclasses.is_dataclass(tp):
            return isinstance(value, dict), isinstance(value, dict)
        return not isinstance(value, dict), not _holds(tp, value)

    places = _paths_of(cls, key)
    if not places:
        return None
    best = min(misfit(tp) for _, tp in places)
    places = [(path, tp) for path, tp in places if misfit(tp) == best]
    kind = "section" if dataclasses.is_dataclass(places[0][1]) else "field"
    owners = " and ".join(
        f"of {_dotted(path[:-1])}" if path[:-1] else "at the top level" for path, _ in places
    )
    writes = " or ".join(_dotted(path + _keys_below(tp, value)) for path, tp in places)
    return f"{key} is a {kind} {owners}: write {writes}"


def _settable(cls: type) -> list[str]:
    """The fields a config file may set (``init``: not those a section derives), in order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def _holds(section: type, value: Any) -> bool:
    """Whether mapping ``value``'s keys are all fields of ``section``."""
    return isinstance(value, dict) and value.keys() <= set(_settable(section))


def _keys_below(tp: Any, value: Any) -> tuple[str, ...]:
    """The fields down a mapping of section ``tp`` that holds one key at each level
    (``{log_interval: 5}``), which the path to write can then name in full."""
    keys: tuple[str, ...] = ()
    while dataclasses.is_dataclass(tp) and isinstance(value, dict) and len(value) == 1:
        ((key, value),) = value.items()
        if not _holds(tp, {key: value}):
            break
        keys, tp = (*keys, key), field_type(tp, [key])
    return keys


def _other_kind(cls: type, data: dict[str, Any]) -> str | None:
    """What to do with a whole file of another entry point's config, recognised by its
    top-level keys: the sections of one of ``cls``'s sections (a run's config given to a
    ladder), or ``cls``'s own sections under a key ``cls`` lacks (a ladder's given to a run).
    Keys that ``cls`` names as moved or foreign don't count: they have their own advice."""
    fields = {f.name for f in dataclasses.fields(cls)}
    known = fields | getattr(cls, "MOVED_KEYS", {}).keys() | getattr(cls, "FOREIGN_KEYS", {}).keys()
    strange = [k for k in data if k not in known]
    if len(strange) < 2:
        return None
    for name, tp in get_type_hints(cls).items():
        if name in fields and dataclasses.is_dataclass(tp):
            sections = {f.name for f in dataclasses.fields(tp)}
            if set(strange) <= sections:
                listed = ", ".join(k for k in data if k not in fields and k in sections)
                return (
                    f"{listed} are sections of `{name}:` (a {tp.__name__}): this looks like "
                    f"another entry point's config; run it with that one, or put these sections "
                    f"under `{name}:`"
                )
    for key in strange:
        if isinstance(data[key], dict) and data[key] and data[key].keys() <= fields:
            return (
                f"this file has this entry point's sections under `{key}:`: it looks like the "
                f"config of another entry point, which runs `{key}:`; run it with that one, or "
                f"give this one only what is under `{key}:`"
            )
    return None


def _failing_section(tp: Any, raw: Any, message: str, keys: tuple[str, ...] = ()) -> tuple:
    """The key path of the section whose own check failed with ``message`` (draccus names only
    its class): the first, deepest first, that fails alone with it."""
    if dataclasses.is_dataclass(tp) and isinstance(raw, dict):
        children = [(f.name, raw[f.name]) for f in dataclasses.fields(tp) if f.name in raw]
    else:
        children = list(enumerate(raw)) if isinstance(raw, list) else []
    for key, child in children:
        child_tp = field_type(tp, [str(key)])
        if found := _failing_section(child_tp, child, message, (*keys, str(key))):
            return found
    try:
        if dataclasses.is_dataclass(tp):
            draccus.decode(tp, raw)
    except ParsingError as e:
        return keys if str(e.__cause__) == message else ()
    return ()


def _dotted(keys: tuple[str, ...]) -> str:
    """draccus's key path as we print it: ``checkpoint.keep[0].every``."""
    return "".join(f"[{k}]" if k.isdigit() else f".{k}" for k in keys).lstrip(".")


_FRIENDLY = {int: "integer", float: "number", str: "string", bool: "true/false"}


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

"""Reading the records rayladder writes (``run.json``, ``config.yaml``, ``experiment.yaml``,
``plan.json``, ``metrics_step{N}.json``) back, through :mod:`trainer_core.io.storage`.

They are written whole and atomically, but a hand edit or a bad copy can still damage one: each
reader here turns that into a :class:`RecordError` naming the file and what is wrong, so every
command refuses it in one line, before writing anything, instead of with a traceback.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from trainer_core.errors import UserError
from trainer_core.io import storage
from trainer_core.io.storage import Location

FIX = "restore it from a copy, or use a new dir"
"""What to do about a damaged record: it is the program's, not a file to repair by hand."""

SHAPES = {dict: "a mapping", list: "a list", str: "a string", int: "a number", float: "a number"}
"""What a record holds, in words (a bool reads as a number: ``True`` is an ``int``); any other
type by its Python name."""


class RecordError(UserError, ValueError):
    """A record file that can't be read back: damaged, cut short, or not the program's."""


def read_yaml_record(path: Location) -> dict[str, Any]:
    """The mapping a YAML record holds."""
    try:
        value = yaml.safe_load(_read_utf8(path))
    except yaml.YAMLError as e:
        raise RecordError(
            f"{_where(path, e)}: not valid YAML ({_yaml_problem(e)}); {FIX}"
        ) from None
    return _checked(path, value, dict)


def read_json_record(path: Location, shape: type[dict] | type[list] = dict) -> Any:
    """The object (or, with ``shape=list``, the list) a JSON record holds."""
    try:
        value = json.loads(_read_utf8(path))
    except json.JSONDecodeError as e:
        raise RecordError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); {FIX}") from None
    return _checked(path, value, shape)


def _read_utf8(path: Location) -> str:
    try:
        return storage.read_bytes(path).decode()
    except UnicodeDecodeError as e:
        raise RecordError(f"{path}: not UTF-8 text (byte {e.start}); {FIX}") from None


def _checked(path: Location, value: Any, shape: type) -> Any:
    """``value`` if it has the record's shape: a list or a number where settings belong would
    otherwise pass as "no settings recorded"."""
    if value is None:
        raise RecordError(f"{path}: is empty; {FIX}")
    if not isinstance(value, shape):
        held = next(
            (words for kind, words in SHAPES.items() if isinstance(value, kind)),
            f"a {type(value).__name__}",
        )
        raise RecordError(f"{path}: holds {held}, not {SHAPES[shape]}; {FIX}")
    return value


def _where(path: Location, e: yaml.YAMLError) -> str:
    """``path:line`` where the parser marked the problem, else ``path``."""
    mark = getattr(e, "problem_mark", None)
    return f"{path}:{mark.line + 1}" if mark is not None else str(path)


def _yaml_problem(e: yaml.YAMLError) -> str:
    return getattr(e, "problem", None) or str(e).splitlines()[0]

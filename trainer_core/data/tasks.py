"""Multiple-choice tasks read from local JSONL files, and the demo's built-in next-line task.

One example per line: ``{"context": str, "choices": [str, ...], "gold": int}`` with an optional
``"fewshot"``: a list of solved examples (objects of the same three fields, shown with their gold
choice) or of plain strings (shown as they are), and an optional ``"uncond_context"``: the text
the choices are also scored after, without the question, for the calibrated accuracy
(``acc_pmi``; every example of a file has it or none does); any other field is refused, as a
typo (``uncond_contxt``) would otherwise drop ``acc_pmi`` without a word. The format is
documented in docs/tasks.md.
Every error names the file and the line, so a broken task file is fixed without a traceback.
Nothing is downloaded: a task is a path, or a built-in name (:data:`BUILTIN_TASKS`).
"""

from __future__ import annotations

import codecs
import json
import math
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainer_core.config.decode import repeated, suggest
from trainer_core.data.demo_corpus import cache_root, corpus_fingerprint, demo_files, stdlib_root
from trainer_core.data.shards import DEFAULT_VAL_FRACTION, DataError, split_key
from trainer_core.io import storage

DEMO_NEXT_LINE = "demo_next_line"
BUILTIN_TASKS = (DEMO_NEXT_LINE,)
NEXT_LINE_FILE = "task-demo_next_line-v2.jsonl"
"""Versioned: a cached file of an older build (v1 had no ``uncond_context``) is not reused."""
FEWSHOT_SEPARATOR = "\n\n"
"""Between few-shot examples, and between the last one and the example's own context."""
UNCOND = "uncond_context"
SHOT_FIELDS = ("context", "choices", "gold")
"""A solved few-shot example's fields."""
EXAMPLE_FIELDS = (*SHOT_FIELDS, "fewshot", UNCOND)


class TaskFormatError(DataError):
    """A task file's line is not a valid example; the message names the file and the line."""


@dataclass(frozen=True)
class TaskExample:
    """One question: the prompt (few-shot prefix + context) and its choices, ``gold`` correct;
    ``uncond_prompt``: what the choices are scored after for calibration (None: not scored)."""

    prompt: str
    choices: tuple[str, ...]
    gold: int
    uncond_prompt: str | None = None


@dataclass(frozen=True)
class Task:
    name: str
    examples: tuple[TaskExample, ...]


def _field(obj: dict, key: str, kind: type, where: str) -> object:
    if key not in obj:
        raise TaskFormatError(f"{where}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TaskFormatError(
            f"{where}: field {key!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def _solved(obj: object, where: str, known: tuple[str, ...]) -> tuple[str, list[str], int]:
    """``(context, choices, gold)`` of one object, every field checked and none but ``known``."""
    if not isinstance(obj, dict):
        raise TaskFormatError(f"{where}: must be a JSON object, got {type(obj).__name__}")
    for key in obj:
        if key not in known:
            hint = "" if key in EXAMPLE_FIELDS else suggest(key, list(known))
            raise TaskFormatError(
                f"{where}: unknown field {key!r}{hint}; the fields are {', '.join(known)}"
            )
    context = _field(obj, "context", str, where)
    choices = _field(obj, "choices", list, where)
    if len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise TaskFormatError(f"{where}: 'choices' must list at least 2 non-empty strings")
    twice = repeated(choices)
    if twice:
        raise TaskFormatError(
            f"{where}: 'choices' lists {twice[0]!r} more than once; an example whose gold "
            "choice has a twin can't be scored (ties go to the first): keep one of each"
        )
    gold = _field(obj, "gold", int, where)
    if not 0 <= gold < len(choices):
        raise TaskFormatError(
            f"{where}: 'gold' is {gold}, outside 0..{len(choices) - 1} (the choices' indices)"
        )
    return context, choices, gold


def _fewshot_text(shots: object, where: str) -> str:
    """The prefix the few-shot examples make: each solved one as its context + gold choice."""
    if not isinstance(shots, list):
        raise TaskFormatError(f"{where}: 'fewshot' must be a list, got {type(shots).__name__}")
    parts = []
    for i, shot in enumerate(shots):
        if isinstance(shot, str):
            parts.append(shot)
        else:
            context, choices, gold = _solved(shot, f"{where}: fewshot[{i}]", SHOT_FIELDS)
            parts.append(context + choices[gold])
    return "".join(p + FEWSHOT_SEPARATOR for p in parts)


def parse_example(line: str, where: str) -> TaskExample:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskFormatError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    context, choices, gold = _solved(obj, where, EXAMPLE_FIELDS)
    prefix = _fewshot_text(obj["fewshot"], where) if "fewshot" in obj else ""
    uncond = _field(obj, UNCOND, str, where) if UNCOND in obj else None
    return TaskExample(prefix + context, tuple(choices), gold, uncond)


def read_task(path: str | Path, name: str | None = None, max_examples: int = 0) -> Task:
    """The task in a JSONL file (blank lines skipped); ``max_examples`` > 0 keeps the first ones."""
    path = Path(path)
    numbered: list[tuple[int, TaskExample]] = []
    for number, line in enumerate(_lines(path), start=1):
        if line.strip():
            numbered.append((number, parse_example(line, f"{path}:{number}")))
        if max_examples and len(numbered) == max_examples:
            break
    if not numbered:
        raise TaskFormatError(f"{path}: no examples (one JSON object per line)")
    _check_uncond_everywhere_or_nowhere(numbered, path)
    return Task(name or path.stem, tuple(example for _, example in numbered))


def _lines(path: Path) -> list[str]:
    """The file's lines, split at newlines alone (a trailing carriage return dropped):
    str.splitlines also splits at U+2028, U+0085 and others, which JSON strings may hold raw. A
    leading UTF-8 BOM (some Windows editors write one) is skipped; a byte that is not UTF-8 is
    named by its line and its place in it."""
    try:
        data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    except OSError as e:
        raise TaskFormatError(f"{path}: can't read the task file ({e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        number = data.count(b"\n", 0, e.start) + 1
        column = e.start - data.rfind(b"\n", 0, e.start)
        raise TaskFormatError(
            f"{path}:{number}: not UTF-8: byte {column} of the line is 0x{data[e.start]:02x} "
            f"({e.reason}); save the file as UTF-8"
        ) from None
    return [line.removesuffix("\r") for line in text.split("\n")]


def _check_uncond_everywhere_or_nowhere(numbered: list[tuple[int, TaskExample]], path: Path):
    """One accuracy per task: ``acc_pmi`` over every example or over none."""
    first_number, first = numbered[0]
    for number, example in numbered[1:]:
        if (example.uncond_prompt is None) != (first.uncond_prompt is None):
            with_it, without = (
                (first_number, number)
                if first.uncond_prompt is not None
                else (number, first_number)
            )
            raise TaskFormatError(
                f"{path}:{number}: {UNCOND!r} is on line {with_it} but not on line {without}; "
                "give it to every example or to none (one accuracy per task)"
            )


def write_task(path: str | Path, examples: list[dict]) -> Path:
    """Write examples (dicts of the documented fields) as JSONL, atomically: ranks that build
    the same task at once each rename a whole file into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in examples)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return path


def resolve_task(spec: str, builtin_dir: str | Path | None = None) -> Path:
    """The file of a task spec: a path, or a built-in name, built once under ``builtin_dir``
    (the demo passes its shard dir; default: the rayladder cache)."""
    if spec == DEMO_NEXT_LINE:
        path = Path(builtin_dir or default_builtin_dir()) / NEXT_LINE_FILE
        if not path.is_file():
            build_next_line_task(path)
        return path
    if storage.is_url(spec):
        raise TaskFormatError(
            f"task {spec!r}: task files are read from local paths, not fetched: copy it to a "
            "path every node sees"
        )
    path = Path(spec).expanduser()
    if not path.is_file():
        raise DataError(
            f"task {spec!r}: no such file; name a JSONL file or one of {', '.join(BUILTIN_TASKS)}"
        )
    return path


def default_builtin_dir() -> Path:
    """Per corpus (the held-out files change with the Python version), in the rayladder cache."""
    return cache_root() / f"tasks-{corpus_fingerprint(demo_files(), stdlib_root())[:8]}"


def load_tasks(
    specs: list[str], builtin_dir: str | Path | None = None, max_examples: int = 0
) -> list[Task]:
    """The tasks a config names (``evals.tasks``), each cut to ``max_examples`` if > 0."""
    names = _task_names(specs)
    return [
        read_task(resolve_task(spec, builtin_dir), name, max_examples)
        for spec, name in zip(specs, names, strict=True)
    ]


def check_task_files(specs: list[str], max_examples: int = 0) -> None:
    """Read the task files a config names as its runs will, so that a bad one stops a launch
    before any run starts rather than in every run; built-in tasks are made by the runs (the
    demo's beside its shards), not here."""
    names = _task_names(specs)
    for spec, name in zip(specs, names, strict=True):
        if spec not in BUILTIN_TASKS:
            read_task(resolve_task(spec), name, max_examples)


def _task_names(specs: list[str]) -> list[str]:
    """Each spec's task name (a built-in's, or its file's stem), refusing two of one name."""
    names: dict[str, str] = {}
    for spec in specs:
        where = spec if spec in BUILTIN_TASKS else str(Path(spec).expanduser())
        name = spec if spec in BUILTIN_TASKS else Path(where).stem
        if name in names:
            raise TaskFormatError(
                f"evals.tasks: {names[name]} and {where} are both task {name!r} (a task "
                "is named by its file's stem, and its metrics by the task): list each file once, "
                "and give files of different tasks different names"
            )
        names[name] = where
    return list(names)


# The demo's next-line task.

NEXT_LINE_CONTEXT_LINES = 4
NEXT_LINE_CHOICES = 4
NEXT_LINE_EXAMPLES = 400
NEXT_LINE_MIN_CHARS = 12
NEXT_LINE_MAX_CHARS = 60
"""Choice lines are stripped code lines of this length: long enough to carry signal, short
enough that 15K..200K-parameter models see their context."""
LENGTH_BIN_RATIO = 1.25
"""Distractors come from the true line's length bin (bins grow by this ratio), not from a window
centred on its length, which would make the true line the middle one and length a clue."""


def heldout_files(files: list[Path]) -> list[tuple[Path, str]]:
    """The demo corpus files the shard writer routes to validation (same hash, same fraction):
    text the models never train on, though it is the same kind of code."""
    held = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        if split_key(text) < DEFAULT_VAL_FRACTION:
            held.append((path, text))
    return held


def _usable(line: str) -> bool:
    s = line.strip()
    return NEXT_LINE_MIN_CHARS <= len(s) <= NEXT_LINE_MAX_CHARS and not s.startswith("#")


def _length_bin(line: str) -> int:
    return int(math.log(len(line)) / math.log(LENGTH_BIN_RATIO))


def next_line_examples(texts: list[str], seed: int = 0, n: int = NEXT_LINE_EXAMPLES) -> list[dict]:
    """Examples "which line comes next": context = the previous lines (indent kept), choices =
    the true next line and distractor lines of about its length from the same held-out text.

    The uncond context is a bare line start at the same indent: scored against it, a choice's
    log-likelihood says how typical a line it is, which the calibrated accuracy subtracts, so
    that what is left is how much the context made it likelier."""
    rng = random.Random(seed)
    lines = [line for text in texts for line in text.splitlines()]
    bins: dict[int, list[str]] = {}
    for line in sorted({line.strip() for line in lines if _usable(line)}):
        bins.setdefault(_length_bin(line), []).append(line)
    spots = [
        i
        for i in range(NEXT_LINE_CONTEXT_LINES, len(lines))
        if _usable(lines[i]) and all(lines[i - k].strip() for k in range(1, 3))
    ]
    rng.shuffle(spots)
    examples = []
    for i in spots[:n]:
        true = lines[i].strip()
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        similar = [p for p in bins[_length_bin(true)] if p != true]
        if len(similar) < NEXT_LINE_CHOICES - 1:
            continue
        choices = [true, *rng.sample(similar, NEXT_LINE_CHOICES - 1)]
        rng.shuffle(choices)
        context = "\n".join(lines[i - NEXT_LINE_CONTEXT_LINES : i]) + "\n" + indent
        examples.append(
            {
                "context": context,
                "choices": [c + "\n" for c in choices],
                "gold": choices.index(true),
                UNCOND: "\n" + indent,
            }
        )
    return examples


def build_next_line_task(path: str | Path, seed: int = 0) -> Path:
    """Write the demo's next-line task from the demo corpus's validation files."""
    texts = [text for _, text in heldout_files(demo_files())]
    if not texts:
        raise DataError("the demo corpus has no validation files to build the next-line task from")
    return write_task(path, next_line_examples(texts, seed))

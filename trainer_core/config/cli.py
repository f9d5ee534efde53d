"""Shared command-line handling: ``--config FILE`` plus dotted overrides, errors as one line.

Every entry point (``python -m trainer_core.train``, ``workflows/*.py``) parses the same way, so an
override that works for one works for all. ``--help`` is draccus's, adjusted (a test in
``tests/unit/config/test_cli.py`` checks the parser internals this relies on).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

from draccus.argparsing import ArgumentParser
from draccus.utils import CONFIG_ARG

from trainer_core.config.decode import field_type
from trainer_core.config.loader import ConfigError, load_config
from trainer_core.errors import UserError, print_run_warnings_as_lines

T = TypeVar("T")

DEMO_LADDER = Path(__file__).resolve().parents[2] / "workflows" / "configs" / "ladder-demo.yaml"
"""What ``workflows/ladder.py`` and ``workflows/lr_sweep.py`` run without ``--config``."""


def split_args(
    argv: list[str], flags: dict[str, bool], fields: Collection[str] = ()
) -> tuple[dict[str, str | bool], list[str]]:
    """Separate the entry point's own flags (``flags``: name -> takes a value) from overrides.
    An own flag given twice is refused; an override given twice takes its last value, so a
    script can add to a base command line. ``fields``: the config's top-level keys, so that
    ``--dir`` alone is known as an override missing its value, not an unknown argument."""
    own: dict[str, str | bool] = {}
    overrides: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, equals, inline = arg.partition("=")
        if name in flags:
            if name in own:
                raise ConfigError(f"{name} is given twice: give it once")
            own[name] = _flag_value(name, flags[name], equals, inline, args)
        elif arg.startswith("--") and "=" in arg:
            overrides.append(arg)
        elif arg.startswith("--") and args and not args[0].startswith("--"):
            overrides.append(f"{arg}={args.pop(0)}")
        elif arg.startswith("--") and ("." in arg or arg[2:] in fields):
            raise ConfigError(f"{arg} needs a value: write {arg}=VALUE")
        else:
            raise ConfigError(
                f"unknown argument {arg!r}: use --config FILE and overrides like --optim.lr=3e-4 "
                "(see --help)"
            )
    return own, overrides


def _flag_value(
    name: str, takes_value: bool, equals: str, inline: str, args: list[str]
) -> str | bool:
    """The value of own flag ``name`` (``--name=value`` or ``--name value``, taking the latter
    from ``args``), or True for a switch. A switch refuses ``=false``, which would mean true, and
    an empty or missing value is refused rather than the next flag taken as the value."""
    if not takes_value:
        if equals:
            raise ConfigError(f"{name} takes no value: write {name} alone, not {name}={inline}")
        return True
    if not equals and args and not args[0].startswith("--"):
        inline = args.pop(0)
    if not inline:
        raise ConfigError(f"{name} needs a value: write {name} VALUE or {name}=VALUE")
    return inline


CONFIG_HELP = "a YAML file of settings; overrides (--section.key=value) win over it"


def help_text(
    usage: str,
    cls: type,
    flags: Mapping[str, bool] | None = None,
    flag_help: Mapping[str, str] | None = None,
    planned: Mapping[str, str] | None = None,
) -> str:
    """draccus's help for ``cls``: the fields by section with types and docstrings. Adjusted: every
    field shows its default (draccus shows it only beside a docstring) and its docstring (read
    from the source where draccus misses it, :func:`field_doc`), and draccus's own
    ``--config_path`` and "Config file for <section>" rows are hidden, as our command line takes
    neither. ``--config`` and the script's own ``flags`` are listed with their ``flag_help``,
    replacing a field of the same name (``--sizes``), which the command line can't set; a field
    in ``planned`` (dotted key or section -> the key it is planned from) says so instead of
    showing a default that is never used."""
    parser = ArgumentParser(cls, usage=usage).parser
    own = {"--config": True, **(flags or {})}
    for group in parser._action_groups:
        if group.title == cls.__qualname__ and not group.description:
            group.description = _class_doc(cls)
        if group.description:
            group.description = plain_text(inspect.cleandoc(group.description))
        for action in group._group_actions:
            doc = (action.help or "").strip() or field_doc(cls, action.dest)
            text = action.help = plain_text(doc).replace("%", "%%")  # argparse %-formats help
            owner = planned_from(action.dest, planned or {})
            if (
                action.dest == CONFIG_ARG
                or text.startswith("Config file for ")
                or set(action.option_strings) & own.keys()
            ):
                action.help = argparse.SUPPRESS
            elif owner:
                action.help = f"set by the plan from {owner}, so not settable"
                action.default = argparse.SUPPRESS  # no "(default: ...)": it is never used
            elif not text.strip():
                action.help = "(default: %(default)s)"
    _add_own_flags(parser, own, flag_help or {}, usage)
    return parser.format_help()


_ROLE = re.compile(r":(?:[\w-]+:)+`([^`]+)`")
"""A Sphinx role: ``:attr:`name```, ``:func:`~pkg.mod.name```, ``:py:meth:`title <target>```."""
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def plain_text(text: str) -> str:
    """A docstring's reST markup as a terminal shows it: a role's name as Sphinx renders it
    (``~a.b.c``: ``c``; a titled one: its title) and a literal without its backticks."""
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_name, text))


def _role_name(match: re.Match[str]) -> str:
    target = match[1]
    titled = re.fullmatch(r"(.+?)\s*<[^<>]+>", target, re.DOTALL)
    if titled:
        return titled[1]
    return target[1:].rsplit(".", 1)[-1] if target.startswith("~") else target


def _class_doc(cls: type) -> str:
    """``cls``'s docstring, or its nearest base's where it has none of its own: a dataclass
    without one gets its signature as ``__doc__``, which draccus drops, leaving a bare heading
    (``RayTrainConfig:``, a :class:`TrainConfig` with a ``ray`` section)."""
    for c in cls.__mro__[:-1]:  # not object's
        doc = c.__dict__.get("__doc__") or ""
        if doc and not doc.startswith(f"{c.__name__}("):
            return doc
    return ""


def field_doc(cls: type, dest: str) -> str:
    """The docstring of field ``dest`` (dotted, below ``cls``), for a field draccus shows none
    for: it finds them with a regex that misses an annotation holding quotes
    (``Literal["auto", "flash"]``), which left every choice field with only its default."""
    *section, name = dest.split(".")
    owner = field_type(cls, section)
    return attribute_docs(owner).get(name, "") if dataclasses.is_dataclass(owner) else ""


@functools.cache
def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string right after it in the class body) by field name,
    read from the source of ``cls`` and its bases, a subclass's winning."""
    docs: dict[str, str] = {}
    for c in reversed(cls.__mro__[:-1]):  # not object's
        docs.update(_own_attribute_docs(c))
    return docs


def _own_attribute_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # no source: a class made at run time
        return {}
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)).body
    return {
        field.target.id: inspect.cleandoc(doc.value.value)
        for field, doc in zip(body, body[1:], strict=False)
        if isinstance(field, ast.AnnAssign)
        and isinstance(field.target, ast.Name)
        and isinstance(doc, ast.Expr)
        and isinstance(doc.value, ast.Constant)
        and isinstance(doc.value.value, str)
    }


def planned_from(dest: str, planned: Mapping[str, str]) -> str | None:
    """The key field ``dest`` is planned from, when it or its section is in ``planned``."""
    return next((v for k, v in planned.items() if dest == k or dest.startswith(f"{k}.")), None)


def _add_own_flags(
    parser: argparse.ArgumentParser,
    flags: Mapping[str, bool],
    flag_help: Mapping[str, str],
    usage: str,
) -> None:
    """List the script's own flags under "options:", beside ``--help``, each value named as the
    usage line names it (``--benchmark SIZE``). "resolve": a field of the same name, its row
    hidden, gives the name up to the flag, as the command line does."""
    options = parser._optionals
    options.conflict_handler = "resolve"
    for name, takes_value in flags.items():
        text = (CONFIG_HELP if name == "--config" else flag_help.get(name, "")).replace("%", "%%")
        if takes_value:
            named = re.search(rf"\[{re.escape(name)} ([^\]\s]+)\]", usage)
            metavar = named[1] if named else name.lstrip("-").upper()
            options.add_argument(name, metavar=metavar, help=text, default=argparse.SUPPRESS)
        else:
            options.add_argument(name, action="store_true", help=text, default=argparse.SUPPRESS)


INTERRUPTED = 130
"""The exit code of a Ctrl+C'd command (128 + SIGINT), as a shell reports one."""


def exit_on_error(
    main: Callable[[], int | None], exit_with: Callable[[int], NoReturn] = sys.exit
) -> NoReturn:
    """Run ``main``; a user error (bad config, data, dir, checkpoint, a failed run) prints one
    line and exits 2, and a Ctrl+C that ``main`` leaves unhandled prints "interrupted" and exits
    130, not a traceback from wherever it landed. Every entry point ends with this, so they all
    fail the same way. ``exit_with``: how the process ends (a distributed rank's entry point
    passes ``exit_rank``). A :class:`~trainer_core.errors.RunWarning` on the way prints as one
    line too."""
    print_run_warnings_as_lines()
    try:
        code = main() or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code = INTERRUPTED
    exit_with(code)


def parse_command(
    doc: str,
    cls: type[T],
    argv: list[str],
    flags: dict[str, bool] | None = None,
    default_config: Path | None = None,
    flag_help: Mapping[str, str] | None = None,
    planned: Mapping[str, str] | None = None,
) -> tuple[dict[str, str | bool], T] | None:
    """An entry point's own flags and its typed config from ``argv``; None after ``--help``.

    ``doc``: the script's docstring, whose first line is its usage. ``flags``: the script's own
    flags besides ``--config`` (name -> takes a value). ``default_config``: used without
    ``--config``. ``flag_help`` (flag -> one line) and ``planned`` (field -> the key it is
    planned from): for ``--help``, see :func:`help_text`.
    """
    if "--help" in argv or "-h" in argv:
        usage = doc.strip().splitlines()[0].strip("`")
        print(help_text(usage, cls, flags, flag_help, planned), end="")
        if default_config is not None:
            print(
                f"\nThe defaults above are the built-in ones. Without --config this command "
                f"loads {default_config}, whose values win over them."
            )
        return None
    fields = [f.name for f in dataclasses.fields(cls)]
    own, overrides = split_args(argv, {"--config": True, **(flags or {})}, fields)
    if default_config is not None:
        own.setdefault("--config", str(default_config))
    return own, load_config(cls, own.get("--config"), overrides)

"""Shared command-line handling: ``--config FILE`` plus dotted overrides, errors as one line.

Every entry point (``python -m trainer_core.train``, ``workflows/*.py``) parses the same way, so an
override that works for one works for all. ``--help`` is draccus's, adjusted (a test in
``tests/unit/config/test_cli.py`` checks the parser internals this relies on).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

from draccus.argparsing import ArgumentParser
from draccus.utils import CONFIG_ARG

from trainer_core.config.loader import ConfigError, load_config
from trainer_core.errors import UserError

T = TypeVar("T")

DEMO_LADDER = Path(__file__).resolve().parents[2] / "workflows" / "configs" / "ladder-demo.yaml"
"""What ``workflows/ladder.py`` and ``workflows/lr_sweep.py`` run without ``--config``."""


def split_args(argv: list[str], flags: dict[str, bool]) -> tuple[dict[str, str | bool], list[str]]:
    """Separate the entry point's own flags (``flags``: name -> takes a value) from overrides."""
    own: dict[str, str | bool] = {}
    overrides: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, _, inline = arg.partition("=")
        if name in flags:
            if flags[name]:
                if not inline:
                    if not args:
                        raise ConfigError(f"{name} needs a value")
                    inline = args.pop(0)
                own[name] = inline
            else:
                own[name] = True
        elif arg.startswith("--") and "=" in arg:
            overrides.append(arg)
        elif arg.startswith("--") and args and not args[0].startswith("--"):
            overrides.append(f"{arg}={args.pop(0)}")
        else:
            raise ConfigError(
                f"unknown argument {arg!r}: use --config FILE and overrides like --optim.lr=3e-4 "
                "(see --help)"
            )
    return own, overrides


def help_text(usage: str, cls: type) -> str:
    """draccus's help for ``cls``: the fields by section with types and docstrings. Adjusted: every
    field shows its default (draccus shows it only beside a docstring), and draccus's own
    ``--config_path`` and "Config file for <section>" rows are hidden, as our command line takes
    neither."""
    parser = ArgumentParser(cls, usage=usage).parser
    for group in parser._action_groups:
        for action in group._group_actions:
            text = action.help or ""
            if action.dest == CONFIG_ARG or text.startswith("Config file for "):
                action.help = argparse.SUPPRESS
            elif not text.strip():
                action.help = "(default: %(default)s)"
    return parser.format_help()


def exit_on_error(
    main: Callable[[], int | None], exit_with: Callable[[int], NoReturn] = sys.exit
) -> NoReturn:
    """Run ``main``; a user error (bad config, data, dir, checkpoint, a failed run) prints one
    line and exits 2. Every entry point ends with this, so they all fail the same way.
    ``exit_with``: how the process ends (a distributed rank's entry point passes ``exit_rank``)."""
    try:
        code = main() or 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    exit_with(code)


def parse_command(
    doc: str,
    cls: type[T],
    argv: list[str],
    flags: dict[str, bool] | None = None,
    default_config: Path | None = None,
) -> tuple[dict[str, str | bool], T] | None:
    """An entry point's own flags and its typed config from ``argv``; None after ``--help``.

    ``doc``: the script's docstring, whose first line is its usage. ``flags``: the script's own
    flags besides ``--config`` (name -> takes a value). ``default_config``: used without
    ``--config``.
    """
    if "--help" in argv or "-h" in argv:
        print(help_text(doc.strip().splitlines()[0].strip("`"), cls), end="")
        if default_config is not None:
            print(
                f"\nThe defaults above are the built-in ones. Without --config this command "
                f"loads {default_config}, whose values win over them."
            )
        return None
    own, overrides = split_args(argv, {"--config": True, **(flags or {})})
    if default_config is not None:
        own.setdefault("--config", str(default_config))
    return own, load_config(cls, own.get("--config"), overrides)

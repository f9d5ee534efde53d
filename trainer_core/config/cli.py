"""Shared command-line handling: ``--config FILE`` plus dotted overrides, errors as one line.

Every entry point (``python -m trainer_core.train``, ``workflows/*.py``) parses the same way, so an
override that works for one works for all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from trainer_core.config.loader import ConfigError, field_help, load_config
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


def print_help(usage: str, cls: type) -> None:
    print(usage)
    print("\nconfig fields (override any with --section.field=value):")
    print("\n".join(field_help(cls)))


def exit_on_error(main: Callable[[], int | None]) -> None:
    """Run ``main``; a user error (bad config, data, dir, checkpoint, a failed run) prints one
    line and exits 2. Every entry point ends with this, so they all fail the same way."""
    try:
        sys.exit(main() or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


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
        print_help(doc.strip().splitlines()[0], cls)
        return None
    own, overrides = split_args(argv, {"--config": True, **(flags or {})})
    if default_config is not None:
        own.setdefault("--config", str(default_config))
    return own, load_config(cls, own.get("--config"), overrides)

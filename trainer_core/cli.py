"""Shared command-line handling: ``--config FILE`` plus dotted overrides, errors as one line.

Every entry point (``python -m trainer_core.train``, ``workflows/*.py``) parses the same way, so an
override that works for one works for all.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TypeVar

from trainer_core.configio import ConfigError, field_help, load_config

T = TypeVar("T")


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
    except Exception as e:
        # Imported here: trainer_core.errors loads torch, which a tokenizer or analysis run
        # that succeeds never needs.
        from trainer_core.errors import is_user_error

        if not is_user_error(e):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def load_from_args(cls: type[T], own: dict, overrides: list[str]) -> T:
    return load_config(cls, own.get("--config"), overrides)

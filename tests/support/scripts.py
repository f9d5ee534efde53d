"""Entry scripts and benchmarks as modules: they are files, not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(script: str) -> ModuleType:
    """The script at ``script`` (relative to the repository root), imported as a module."""
    path = ROOT / script
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

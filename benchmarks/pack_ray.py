"""Ray's wheel, trimmed to what a ladder runs, packed small enough to travel to a GPU machine.

python benchmarks/pack_ray.py WHEEL [--out DIR]

A bare GPU machine with no network is sent at most 64 MiB, and Ray's wheel alone is ~79 MB, so
``gpu_check.py --parts ladder`` could not run there. Dropping what a ladder never imports (Java
jars, RLlib, Serve, the LLM library, the dashboard's JavaScript source maps) and recompressing
with xz leaves ~22 MB (Ray 2.60). ``make gpu-wheels`` calls this; ``gpu_check.py`` unpacks the
archive into the carried wheels' site folder where Ray is missing.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import zipfile
from pathlib import Path

UNUSED = ("ray/jars/", "ray/rllib/", "ray/serve/", "ray/llm/")
"""Folders of Ray's wheel that Ray Core, Data, Train and Tune never import."""
UNUSED_SUFFIXES = (".map",)
"""The dashboard's source maps: debugging aids for its JavaScript, a tenth of the wheel."""
LIMIT = 64 * 2**20
"""What a GPU machine is sent in all (the tree, the wheels and this archive)."""


def kept(name: str) -> bool:
    """Whether a wheel member goes into the archive."""
    return not name.startswith(UNUSED) and not name.endswith(UNUSED_SUFFIXES)


def archive_name(wheel: Path) -> str:
    """``ray-2.60.0-cp312-...whl`` -> ``ray-2.60.0-cp312.tar.xz``: version and Python kept, so
    a wrong Python's archive is visible at a glance."""
    name, version, python = wheel.name.split("-")[:3]
    return f"{name}-{version}-{python}.tar.xz"


def pack(wheel: Path, out: Path) -> Path:
    """The kept members of ``wheel`` as an xz tarball in ``out``, modes kept (Ray's binaries
    must stay executable)."""
    target = out / archive_name(wheel)
    with zipfile.ZipFile(wheel) as whl, tarfile.open(target, "w:xz", preset=9) as tar:
        for info in whl.infolist():
            if info.is_dir() or not kept(info.filename):
                continue
            member = tarfile.TarInfo(info.filename)
            member.size = info.file_size
            member.mode = (info.external_attr >> 16) & 0o777 or 0o644
            with whl.open(info) as data:
                tar.addfile(member, data)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("wheel", type=Path, help="Ray's wheel for the GPU machine's Python")
    ap.add_argument("--out", type=Path, help="where the archive goes (default: beside the wheel)")
    ap.add_argument(
        "--limit-bytes", type=int, default=LIMIT, help="fail above this size (what travels)"
    )
    args = ap.parse_args(argv)
    if not args.wheel.is_file():
        ap.error(f"{args.wheel}: no such wheel; make gpu-wheels downloads it first")
    if not zipfile.is_zipfile(args.wheel) or args.wheel.name.count("-") < 4:
        ap.error(f"{args.wheel}: not a wheel (a zip named NAME-VERSION-PYTHON-ABI-PLATFORM.whl)")
    target = pack(args.wheel, args.out or args.wheel.parent)
    size = target.stat().st_size
    print(f"{target}: {size / 2**20:.1f} MiB (from {args.wheel.stat().st_size / 2**20:.1f} MiB)")
    if size > args.limit_bytes:
        print(
            f"pack_ray: {target} is over the {args.limit_bytes:,} bytes a GPU machine is sent",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

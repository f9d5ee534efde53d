"""``python workflows/submit.py [--address URL] [--no-wait] -- workflows/ladder.py [args...]``

``ray job submit --working-dir .`` with checks first, each a one-line error: the upload must fit
Ray's 100 MiB cap (what .rayignore excludes does not count; the biggest entries are named), and
the Jobs API must answer at ``--address`` (else RAY_ADDRESS, else this machine's dashboard).
The command after ``--`` is a script and its arguments; a leading ``python``, as ``ray job
submit`` takes it, is dropped (the job runs the script with ``python`` itself). Other options
(``--submission-id``, ``--runtime-env``, ...) go to ``ray job submit`` as they are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from trainer_core.config.cli import exit_on_error
from trainer_core.config.loader import ConfigError
from trainer_core.ray.probe import probe
from trainer_core.ray.upload import UploadTooLargeError, check_upload

ROOT = Path(__file__).resolve().parents[1]
LOCAL_DASHBOARD = "http://127.0.0.1:8265"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str], list[str]]:
    """This script's options (``--help`` prints them), other options for ``ray job submit``
    (``--submission-id``, ``--runtime-env``, ...) and the command after ``--``."""
    own, script = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(
        prog="python workflows/submit.py",
        usage=__doc__.strip().splitlines()[0].strip("`"),
        description=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument(
        "--address",
        default=_env_address() or LOCAL_DASHBOARD,
        help="the dashboard's Jobs API, http://HOST:8265 (default: RAY_ADDRESS, else this machine)",
    )
    parser.add_argument("--no-wait", action="store_true", help="return once the job is submitted")
    args, passed_on = parser.parse_known_args(own)
    if script[:1] in (["python"], ["python3"]):
        script = script[1:]
    if not script:
        raise ConfigError(
            "no script to run: give it after --, e.g. -- workflows/ladder.py --dry-run"
        )
    return args, passed_on, script


def _env_address() -> str:
    """RAY_ADDRESS, but "auto" (Ray's own lookup of this machine's cluster): none."""
    address = os.environ.get("RAY_ADDRESS", "")
    return "" if address == "auto" else address


def job_env(address: str) -> dict[str, str]:
    """The environment ``ray job submit`` runs in: its job client lets RAY_API_SERVER_ADDRESS,
    then RAY_ADDRESS, win over ``--address``, so the job goes where it was checked and announced
    only with those set to it."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_API_SERVER_ADDRESS"}
    return {**env, "RAY_ADDRESS": address}


def check_jobs_api(address: str) -> None:
    """Something answers where the job goes: ``ray job submit`` prints a connection traceback."""
    url = urlsplit(address if "://" in address else f"http://{address}")
    if not url.hostname:
        raise ConfigError(f"--address: {address!r} names no host; give http://HOST:8265")
    # a URL's own default port (a dashboard behind a proxy), Ray's 8265 for a bare host
    port = url.port or (
        {"http": 80, "https": 443}.get(url.scheme, 8265) if "://" in address else 8265
    )
    try:
        probe(url.hostname, port)
    except OSError as e:
        raise ConfigError(
            f"--address: nothing answers at {url.hostname}:{port} ({e.strerror or e}); "
            "start the cluster (ray start --head, ray up cluster.yaml) or give its dashboard, "
            "http://HOST:8265"
        ) from None


def ray_command() -> str:
    """The ``ray`` beside this Python (its venv's, whether or not the venv is active), else the
    one on PATH."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if not found:
        raise ConfigError("no `ray` command beside this python or on PATH: run `make setup`")
    return found


def main() -> int:
    args, passed_on, script = parse(sys.argv[1:])
    try:
        size = check_upload(ROOT)
    except UploadTooLargeError as e:
        raise ConfigError(str(e)) from None
    check_jobs_api(args.address)
    print(f"uploading {size / 2**20:.1f} MiB working dir to {args.address}")
    cmd = [ray_command(), "job", "submit", "--address", args.address, "--working-dir", str(ROOT)]
    cmd += ["--no-wait"] if args.no_wait else []
    cmd += passed_on
    return subprocess.call([*cmd, "--", "python", *script], env=job_env(args.address))


if __name__ == "__main__":
    exit_on_error(main)

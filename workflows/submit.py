"""``python workflows/submit.py [--address URL] [--no-wait] -- workflows/ladder.py [args...]``

``ray job submit --working-dir .`` with checks first, each a one-line error: the script and its
``--config`` must be files the upload holds (passed on relative to the repository, where the job
runs), the upload must fit Ray's 100 MiB cap (what .rayignore excludes does not count; the
biggest entries are named), and the Jobs API must answer at ``--address`` (else RAY_ADDRESS,
else this machine's dashboard). The command after ``--`` is a script (or ``-m MODULE``) and its
arguments; a leading ``python``, as ``ray job submit`` takes it, is dropped (the job runs the
script with ``python`` itself). Other options (``--submission-id``, ``--runtime-env``, ...) go to
``ray job submit`` as they are.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from http.client import HTTPException
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import urlsplit
from urllib.request import urlopen

from trainer_core.config.cli import exit_on_error
from trainer_core.config.loader import ConfigError
from trainer_core.ray.probe import PROBE_TIMEOUT_S, probe
from trainer_core.ray.upload import UploadTooLargeError, check_upload, ignore_patterns, is_ignored

ROOT = Path(__file__).resolve().parents[1]
LOCAL_DASHBOARD = "http://127.0.0.1:8265"
DASHBOARD_PORT = 8265


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
        help=(
            "the dashboard's Jobs API, http://HOST:8265 (default: RAY_ADDRESS, else this "
            "machine). Also taken: HOST (its dashboard, on port 8265), HOST:PORT (the dashboard "
            "where HTTP answers there, else the GCS, e.g. HOST:6379) and ray://HOST:10001; Ray "
            "looks the dashboard up from the last two"
        ),
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


def jobs_api_address(address: str) -> str:
    """The address to give ``ray job submit``, once something answers there (else it prints a
    connection traceback). A URL (http, https, ray) as it is; a bare HOST as its dashboard, on
    Ray's port; a HOST:PORT as a dashboard's URL where HTTP answers there, else as it is: a GCS,
    from which Ray looks the dashboard up. Ray takes an address without a scheme for a GCS's:
    given a dashboard's, it timed out after 43 s."""
    has_scheme = "://" in address
    try:
        url = urlsplit(address if has_scheme else f"http://{address}")
        given_port = url.port
    except ValueError as e:  # a port not a number 0-65535, a broken [IPv6] host
        raise ConfigError(
            f"--address: {address!r} is not a URL ({e}); give the dashboard, http://HOST:8265"
        ) from None
    if not url.hostname:
        raise ConfigError(f"--address: {address!r} names no host; give http://HOST:8265")
    # a URL's own default port (a dashboard behind a proxy), Ray's 8265 for a bare host
    default_port = (
        {"http": 80, "https": 443}.get(url.scheme, DASHBOARD_PORT) if has_scheme else DASHBOARD_PORT
    )
    port = given_port or default_port
    try:
        probe(url.hostname, port)
    except OSError as e:
        raise ConfigError(
            f"--address: nothing answers at {url.hostname}:{port} ({e.strerror or e}); "
            "start the cluster (ray start --head, ray up cluster.yaml) or give its dashboard, "
            "http://HOST:8265"
        ) from None
    if has_scheme:
        return address
    if given_port is None:
        return f"http://{address}:{DASHBOARD_PORT}"
    return f"http://{address}" if speaks_http(address) else address


def speaks_http(host_port: str) -> bool:
    """Whether an HTTP server, a dashboard, answers at ``host_port``, in any status (with token
    auth on, a dashboard's every API answers 401); a GCS answers in gRPC's HTTP/2 frames."""
    try:
        urlopen(f"http://{host_port}/api/version", timeout=PROBE_TIMEOUT_S).close()
    except HTTPError:
        return True
    except (OSError, HTTPException):
        return False
    return True


def job_command(script: list[str]) -> list[str]:
    """The command after ``--`` as the job runs it, in the uploaded working dir: the script and
    each ``--config FILE`` (``--config=FILE``) relative to the repository. Checked here, before
    the upload, rather than failing on the cluster after it."""
    command = list(script)
    if command[0] != "-m":
        command[0] = uploaded_file(command[0], "the script after --")
    for i, arg in enumerate(command):
        if arg == "--config" and i + 1 < len(command):
            command[i + 1] = uploaded_file(command[i + 1], "--config")
        elif arg.startswith("--config="):
            command[i] = "--config=" + uploaded_file(arg.partition("=")[2], "--config")
    return command


def uploaded_file(path: str, what: str) -> str:
    """``path`` (from this shell's directory) relative to :data:`ROOT`, as the job finds it in the
    upload; refused in one line naming ``what`` where the upload would not hold it."""
    full = Path(path).resolve()
    if not full.is_file():
        raise ConfigError(f"{what}: {path} is not a file; give a path to one in {ROOT}")
    if not full.is_relative_to(ROOT):
        raise ConfigError(
            f"{what}: {path} lies outside {ROOT}, the working dir uploaded, so the job would not "
            "find it on the cluster; copy it into the repository (e.g. workflows/configs/)"
        )
    relative = full.relative_to(ROOT).as_posix()
    if is_ignored(relative, ignore_patterns(ROOT)):
        raise ConfigError(
            f"{what}: {path} is not uploaded (.rayignore or .gitignore leaves it out), so the job "
            "would not find it on the cluster; copy it out of there (e.g. to workflows/configs/)"
        )
    return relative


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
    command = job_command(script)
    try:
        size = check_upload(ROOT)
    except UploadTooLargeError as e:
        raise ConfigError(str(e)) from None
    address = jobs_api_address(args.address)
    print(f"uploading {size / 2**20:.1f} MiB working dir to {address}")
    cmd = [ray_command(), "job", "submit", "--address", address, "--working-dir", str(ROOT)]
    cmd += ["--no-wait"] if args.no_wait else []
    cmd += passed_on
    return subprocess.call([*cmd, "--", "python", *command], env=job_env(address))


if __name__ == "__main__":
    exit_on_error(main)

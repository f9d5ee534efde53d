"""The same small ladder with its experiment dir on local disk and on S3: wall time of each.

``python benchmarks/object_storage.py [--sizes 1M,3M]``. The S3 side is moto's S3 server on
127.0.0.1, started here (no cloud, no credentials), so the figure is the cost of the object-store
code path (staging, uploads, listings, Tune's state through pyarrow), not of a network.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

LADDER = {
    "name": "storage-bench",
    "seq_len": 64,
    "batch": {"coef": 20480.0},
    "duration": {"chinchilla_multiple": 0.00390625},
    "run": {
        "trainer": {"log_interval": 5, "eval_interval": 1000000, "eval_batches": 2},
        "checkpoint": {"save_interval_minutes": None, "save_interval_steps": 10},
    },
    "ray": {"cpus_per_worker": 0.8, "address": "local"},
}


def serve_s3() -> dict[str, str]:
    """Start moto's S3 server in this process; the env that points clients at it."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def run_ladder(config: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "workflows/ladder.py", "--config", str(config)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"ladder failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,3M")
    args = parser.parse_args()
    s3_env = serve_s3()
    os.environ.update(s3_env)
    import s3fs

    s3fs.S3FileSystem().mkdir("rayladder-bench")
    with tempfile.TemporaryDirectory(prefix="rayladder-storage-bench-") as tmp:
        rows = []
        for where, exp_dir in (
            ("local disk", f"{tmp}/exp"),
            ("S3 (moto)", "s3://rayladder-bench/exp"),
        ):
            config = Path(tmp) / f"{len(rows)}.yaml"
            ladder = {**LADDER, "dir": exp_dir, "sizes": args.sizes.split(",")}
            config.write_text(yaml.safe_dump(ladder, sort_keys=False))
            env = {**s3_env, "RAYLADDER_STAGE_DIR": f"{tmp}/stage"}
            rows.append((where, run_ladder(config, env)))
            print(f"{where:>10}: {rows[-1][1]:6.1f} s", flush=True)
    local, remote = rows[0][1], rows[1][1]
    print(f"ladder {args.sizes}: S3 / local = {remote / local:.2f}x ({remote - local:+.1f} s)")


if __name__ == "__main__":
    main()

"""An S3-compatible server (moto's server mode) on 127.0.0.1 for object-storage tests.

The endpoint and dummy credentials reach s3fs/botocore and pyarrow through the standard
``AWS_*`` environment variables, the same chain users rely on, so the code under test gets no
test-only hook; a Ray started after the fixture inherits them in its workers.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SECRET = "rayladder-test-secret-0123456789"
"""The dummy secret key: tests grep run dirs and logs for it."""


@dataclass
class S3Server:
    endpoint: str
    bucket: str

    def upload(self, local: Path, prefix: str) -> str:
        """Copy the dir ``local`` to ``s3://bucket/prefix`` and return that URL."""
        import s3fs

        url = f"s3://{self.bucket}/{prefix}"
        s3fs.S3FileSystem().put(str(local), url, recursive=True)
        return url


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    import s3fs
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "rayladder-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("rayladder-test")
    try:
        yield S3Server(env["AWS_ENDPOINT_URL"], "rayladder-test")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()

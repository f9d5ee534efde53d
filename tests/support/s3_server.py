"""An S3-compatible server (moto's, in a thread) on 127.0.0.1 for object-storage tests.

The endpoint and dummy credentials reach s3fs/botocore and pyarrow through the standard
``AWS_*`` environment variables, the same chain users rely on, so the code under test gets no
test-only hook; a Ray or a subprocess started after the fixture inherits them.

The server can hold one upload (:meth:`S3Server.hold_upload`): the request that would store a
matching key waits, unanswered, until the test has killed the uploader, and is then refused.
That is a kill in the middle of an upload at an exact point, with nothing in the code under test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import s3fs

SECRET = "rayladder-test-secret-0123456789"
"""The dummy secret key: tests grep run dirs and logs for it."""


@dataclass
class _Hold:
    pattern: re.Pattern
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)


class _HoldingApp:
    """WSGI middleware in front of moto: a PUT whose path matches the armed hold waits until
    released, then gets a 500 and stores nothing; everything else passes through."""

    def __init__(self, app):
        self.app = app
        self.hold: _Hold | None = None

    def __call__(self, environ, start_response):
        hold = self.hold
        path = environ.get("PATH_INFO", "")
        if hold and environ["REQUEST_METHOD"] == "PUT" and hold.pattern.search(path):
            self.hold = None  # once: a retry after the release goes through
            hold.reached.set()
            hold.released.wait(timeout=600)
            start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
            return [b"held by the test"]
        return self.app(environ, start_response)


@dataclass
class S3Server:
    endpoint: str
    bucket: str
    app: _HoldingApp

    def upload(self, local: Path, prefix: str) -> str:
        """Copy the dir ``local`` to ``s3://bucket/prefix`` and return that URL."""
        import s3fs

        url = f"s3://{self.bucket}/{prefix}"
        s3fs.S3FileSystem().put(str(local), url, recursive=True)
        return url

    @contextlib.contextmanager
    def hold_upload(self, key_pattern: str) -> Iterator[threading.Event]:
        """Hold the first upload whose path matches ``key_pattern``; yields the event set when
        it arrives. On leaving, the held request is answered with an error."""
        hold = _Hold(re.compile(key_pattern))
        self.app.hold = hold
        try:
            yield hold.reached
        finally:
            self.app.hold = None
            hold.released.set()


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    import s3fs
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = _HoldingApp(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, True, request_handler=MotoRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
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
        yield S3Server(env["AWS_ENDPOINT_URL"], "rayladder-test", app)
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.shutdown()
        thread.join()


def s3_objects(url: str) -> dict[str, bytes]:
    """Every object under ``url``, by key relative to it (pyarrow's empty "dir/" markers left out)."""
    fs = s3fs.S3FileSystem()
    root = url.removeprefix("s3://").rstrip("/") + "/"
    return {key[len(root) :]: fs.cat(key) for key in fs.find(url) if not key.endswith("/")}

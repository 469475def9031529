"""A real S3-compatible server for tests: moto's standalone server on loopback, with the
standard AWS environment pointing at it (keys made per run) for as long as it runs."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow.fs as pafs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_s3() -> Iterator[tuple[Any, dict[str, str]]]:
    """Start the server; yield a pyarrow S3FileSystem on it and the environment set."""
    from moto import server as moto_server

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "test-" + secrets.token_hex(8),
           "AWS_SECRET_ACCESS_KEY": secrets.token_hex(20), "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in [*env, "AWS_ENDPOINT_URL"]}
    os.environ.pop("AWS_ENDPOINT_URL", None)  # it would win over the S3 one
    os.environ.update(env)
    fs = pafs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"],
                           secret_key=env["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                           endpoint_override=f"127.0.0.1:{port}", scheme="http",
                           allow_bucket_creation=True)
    try:
        yield fs, env
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

"""A real S3-compatible server for tests: moto's standalone server on loopback, with the
standard AWS environment pointing at it (keys made per run) for as long as it runs."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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


@contextmanager
def deep_tier(tmp_path: Path, name: str) -> Iterator[dict[str, Any]]:
    """A deep storage tier for daemons: :func:`moto_s3` (the daemons inherit the AWS
    environment it sets) with a fresh bucket ``name-<random>`` and a key file made for this
    run. Yields ``fs``, ``base`` (the tier's prefix), ``key_file`` and ``args`` (the
    ``shuffled serve`` options that use it)."""
    with moto_s3() as (fs, _):
        bucket = f"{name}-" + secrets.token_hex(6)
        fs.create_dir(bucket)
        key_file = tmp_path / "deep.key"
        key_file.write_bytes(secrets.token_bytes(48))
        yield {"fs": fs, "base": f"{bucket}/tier", "key_file": key_file,
               "args": ["--deep-storage", f"s3://{bucket}/tier",
                        "--deep-storage-key-file", str(key_file)]}

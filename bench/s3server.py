"""A moto S3 server on loopback for the deep-storage benches, the standard AWS environment
pointing at it (keys made per run) while it runs, one bucket and a per-run tier key."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class MotoTier:
    fs: Any  # pyarrow S3FileSystem on the server
    bucket: str
    uri: str  # s3://bucket/tier: what --deep-storage takes
    key_file: Path  # what --deep-storage-key-file takes


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_tier(base: Path, bucket: str = "bench-deep") -> Iterator[MotoTier]:
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    port = _port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": secrets.token_hex(20),
           "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in [*env, "AWS_ENDPOINT_URL"]}
    os.environ.pop("AWS_ENDPOINT_URL", None)  # it would win over the S3 one
    os.environ.update(env)
    try:
        fs = pafs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"],
                               secret_key=env["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                               endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               allow_bucket_creation=True)
        fs.create_dir(bucket)
        base.mkdir(parents=True, exist_ok=True)
        key_file = base / "deep.key"
        key_file.write_bytes(secrets.token_bytes(48))
        yield MotoTier(fs, bucket, f"s3://{bucket}/tier", key_file)
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

"""A moto S3 server on loopback for the deep-storage benches, the standard AWS environment
pointing at it (keys made per run) while it runs, one bucket and a per-run tier key.

The server runs in a process of its own: in the bench's process its Python threads would
take the GIL from the code measured (an object store is never in the daemon's process)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
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


def parse_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_tier(base: Path, bucket: str = "bench-deep") -> Iterator[MotoTier]:
    import pyarrow.fs as pafs

    port = parse_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                               "-p", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:  # bounded: until it accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("the moto S3 server did not start") from None
            time.sleep(0.05)
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
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

"""The one client used identically against both sides: curl (C, libcurl, keep-alive).

Many transfers go in ONE curl process (``--parallel --parallel-max N`` over a config file
listing them), so both servers see the same connection pattern and the client's own cost
is the same; bodies are discarded to /dev/null. Every transfer's status and size is
checked: a side that answers an error or short body fails the run instead of "winning".
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ARROW = "application/vnd.apache.arrow.stream"


@dataclass(frozen=True)
class Transfer:
    """What one curl run did: wall seconds (spawn to exit) and bytes moved."""

    seconds: float
    nbytes: int
    requests: int


def curl_binary() -> str:
    """Path of curl; RuntimeError when missing."""
    path = shutil.which("curl")
    if path is None:
        raise RuntimeError("curl is not installed")
    return path


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _run(entries: list[str], parallel: int, extra: Sequence[str], expect_bytes: int | None,
         count: int, upload: bool, timeout: float) -> Transfer:
    with tempfile.NamedTemporaryFile("w", suffix=".curl", delete=False) as cfg:
        cfg.write("\n".join(entries) + "\n")
    try:
        cmd = [curl_binary(), "--silent", "--show-error", "--no-progress-meter",
               "--http1.1", "-H", "Expect:", "-w", "%{http_code} %{size_download} %{size_upload}\\n",
               *extra]
        if parallel > 1:
            cmd += ["--parallel", "--parallel-immediate", "--parallel-max", str(parallel)]
        cmd += ["-K", cfg.name]
        began = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        seconds = time.perf_counter() - began
    finally:
        Path(cfg.name).unlink()
    lines = done.stdout.decode().split()
    codes, down, up = lines[0::3], lines[1::3], lines[2::3]
    bad = [c for c in codes if not c.startswith("2")]
    if done.returncode != 0 or bad or len(codes) != count:
        raise RuntimeError(f"curl: exit {done.returncode}, {len(codes)}/{count} transfers, "
                           f"statuses {sorted(set(bad))[:5]}: {done.stderr.decode()[-500:]}")
    nbytes = sum(int(float(x)) for x in (up if upload else down))
    if expect_bytes is not None and nbytes != expect_bytes:
        raise RuntimeError(f"curl moved {nbytes} bytes, expected {expect_bytes}")
    return Transfer(seconds, nbytes, count)


def get(urls: Sequence[str], *, parallel: int = 1, expect_bytes: int | None = None,
        timeout: float = 300.0) -> Transfer:
    """GET every URL once (``parallel`` connections), discarding the bodies."""
    entries = [f"url = {_quote(u)}\noutput = \"/dev/null\"" for u in urls]
    return _run(entries, parallel, [], expect_bytes, len(urls), False, timeout)


def put(pairs: Sequence[tuple[str, Path]], *, parallel: int = 1,
        expect_bytes: int | None = None, timeout: float = 300.0) -> Transfer:
    """PUT each file to its URL (streamed from disk by curl), ``parallel`` at a time."""
    entries = [f"url = {_quote(u)}\nupload-file = {_quote(str(p))}\noutput = \"/dev/null\""
               for u, p in pairs]
    return _run(entries, parallel, ["-H", f"Content-Type: {ARROW}"], expect_bytes,
                len(pairs), True, timeout)

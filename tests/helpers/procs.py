"""A daemon run as a real subprocess (``python -m shuffled serve``), for fault and load tests.

Started with a bounded wait for its "listening" line, stopped by the pid this helper started
(SIGTERM, then SIGKILL after a bounded wait). Optionally wrapped (``unshare``) so a test can
give it a private mount namespace with a read-only or full file system.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def first_line(proc: subprocess.Popen[bytes], timeout: float = START_TIMEOUT) -> str | None:
    """The first line ``proc`` prints on stdout (None if it exits or stays silent for
    ``timeout`` s); the rest of its stdout keeps being drained so the pipe never fills."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode("utf-8", "replace"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return None


class DaemonProcess:
    """``python -m shuffled serve`` on 127.0.0.1 with the given locations."""

    def __init__(self, locations: Sequence[Path | str], *extra: str,
                 wrapper: Sequence[str] = (), log_path: Path | None = None) -> None:
        self.locations = [Path(str(p).rsplit(":", 1)[0]) if re.search(r":\d+$", str(p))
                          else Path(p) for p in locations]
        args = [sys.executable, "-m", "shuffled", "serve", "--host", "127.0.0.1", "--port", "0",
                "--free-space-reserve", "0", "--access-log", "false"]
        for loc in locations:
            args += ["--location", str(loc)]
        self.args = [*wrapper, *args, *extra]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> str:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.args, cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                                     stdin=subprocess.DEVNULL)
        if log is not subprocess.DEVNULL:
            log.close()
        first = first_line(self.proc)
        match = re.match(r"shuffled listening on (https?://\S+)", (first or "").strip())
        if match is None:
            self.kill()
            raise AssertionError(f"daemon did not start: {first!r} {self.log_tail()}")
        self.url = match.group(1)
        return self.url

    def log_tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def kill(self) -> None:
        """SIGKILL the process this helper started and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, bounded wait, then SIGKILL; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.wait(timeout=30)

    def __enter__(self) -> DaemonProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 20.0,
             interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # poll interval of a bounded wait, not synchronisation


def host_port(url: str) -> tuple[str, int]:
    """The (host, port) of a daemon's ``http://host:port`` URL, for a raw socket."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def http_get(url: str, headers: dict[str, str] | None = None,
             timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """One GET with urllib: (status, headers, body), error statuses included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def metric_value(metrics_text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, or None if absent."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in metrics_text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head == (f"{name}{{{want}}}" if want else name):
            return float(value)
    return None

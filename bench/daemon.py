"""The shuffled daemon under test: ``shuffled serve`` as a child process on loopback."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from bench.procs import LOOPBACK, Tree, stop

PREFIX = "/druid/worker/v1/shuffle"
READY = "shuffled listening on "


class Daemon:
    """``with Daemon(location, fsync=True) as d:`` runs ``shuffled serve`` until the block ends.

    ``started_seconds`` is the time from spawn to the ready line (imports, store open and
    index rebuild included); ``spawned`` the ``time.monotonic()`` of the spawn.
    """

    def __init__(self, location: Path, *, fsync: bool = True, log: Path | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.location = location
        self.extra = extra  # more `shuffled serve` arguments
        self.fsync = fsync
        self.log = log or location.parent / f"{location.name}.log"
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_seconds = 0.0
        self.spawned = 0.0  # time.monotonic() at spawn
        self.steps: dict[str, float] = {}  # step -> its peak RSS, MiB (:meth:`mark`)

    def mark(self, step: str) -> None:
        """Record the daemon's peak RSS since the previous mark as ``step``'s."""
        self.steps[step] = round(self.tree.step_peak_mib(), 1)

    @property
    def tree(self) -> Tree:
        assert self.proc is not None
        return Tree(self.proc.pid)

    def start(self, timeout: float = 120.0) -> None:
        """Spawn the daemon and wait (bounded) for the line announcing its URL."""
        self.location.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "shuffled", "serve", "--host", LOOPBACK, "--port", "0",
               "--location", str(self.location), "--fsync", str(self.fsync).lower(),
               "--free-space-reserve", "0", "--access-log", "false", "--log-level", "WARNING",
               "--expiry-timeout", "PT2H", *self.extra]
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHUFFLED_")}
        began = self.spawned = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "wb"), env=env)
        assert self.proc.stdout is not None
        line = _read_line(self.proc.stdout, began + timeout)
        if not line.startswith(READY):
            stop(self.proc)
            raise RuntimeError(f"shuffled did not start ({line!r}): "
                               + self.log.read_text(errors="replace")[-2000:])
        self.started_seconds = time.monotonic() - began
        self.url = line[len(READY):].strip()

    def stop(self) -> None:
        """SIGTERM by pid (the daemon drains, then exits)."""
        if self.proc is not None:
            stop(self.proc)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def partial_url(self, sup: str, sub: str, start: str, end: str, partition: int) -> str:
        """URL of one partial segment (PUT and per-partial GET)."""
        return (f"{self.url}{PREFIX}/tasks/{sup}/{sub}/partition"
                f"?start={start}&end={end}&partitionId={partition}")

    def partition_url(self, sup: str, start: str, end: str, partition: int) -> str:
        """URL of the aggregate GET: a whole partition as one Arrow stream."""
        return (f"{self.url}{PREFIX}/tasks/{sup}/partition"
                f"?start={start}&end={end}&partitionId={partition}")

    def task_url(self, sup: str) -> str:
        return f"{self.url}{PREFIX}/tasks/{sup}"

    def __enter__(self) -> Daemon:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _read_line(stream: object, deadline: float) -> str:
    """One line from a pipe, or '' at EOF or past ``deadline`` (never blocks beyond it)."""
    fd = stream.fileno()  # type: ignore[attr-defined]
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")

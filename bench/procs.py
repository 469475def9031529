"""Child processes: free loopback ports, bounded waits, CPU and memory read from /proc.

Every process the bench starts is stopped by its own pid (never by name).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on loopback right now (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def poll_until(check: Callable[[], bool], timeout: float, what: str,
               interval: float = 0.02) -> None:
    """Call ``check`` until it is true; TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(interval)


def port_open(port: int, host: str = LOOPBACK) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                out.extend(int(x) for x in fh.read().split())
    except OSError:
        pass
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid``'s live threads in seconds, to the nanosecond (schedstat), or
    utime + stime in clock ticks (10 ms) where schedstat is missing; 0 if it is gone."""
    total, found = 0, False
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
                total += int(fh.read().split()[0])
                found = True
    except (OSError, ValueError, IndexError):
        found = False
    if found:
        return total / 1e9
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command name: state is field 3, utime field 14, stime field 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kib(pid: int, key: str) -> int:
    """A ``kB`` figure from /proc/<pid>/status (e.g. VmHWM, VmRSS); 0 if unavailable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Tree:
    """A server process and (for nginx) its workers: CPU and peak memory of them all."""

    pid: int

    def pids(self) -> list[int]:
        return [self.pid, *children(self.pid)]

    def cpu(self) -> float:
        """CPU seconds used so far by the process and its live children."""
        return sum(cpu_seconds(p) for p in self.pids())

    def peak_rss_mib(self) -> float:
        """Largest VmHWM (peak resident set) among the process and its children, MiB."""
        return max(status_kib(p, "VmHWM") for p in self.pids()) / 1024

    def step_peak_mib(self) -> float:
        """The peak since the last call (or the start), then reset (``clear_refs`` 5, our
        own processes): the peak of one step of a comparison, which a poller can miss."""
        peak = self.peak_rss_mib()
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as fh:
                    fh.write("5")
            except OSError:
                pass  # not ours to reset, or gone: the next step's peak includes this one
        return peak


def stop(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """SIGTERM our child by pid, wait up to ``timeout``, then SIGKILL it."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        pass


class RssPoller:
    """Samples a process's RssAnon and RssFile every ``interval`` s on a thread, keeping
    the maxima: VmHWM gives the peak, this says whether it was heap or mapped files."""

    def __init__(self, pid: int, interval: float = 0.005) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kib = {"RssAnon": 0, "RssFile": 0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            for key in self.peak_kib:
                self.peak_kib[key] = max(self.peak_kib[key], status_kib(self.pid, key))

    def start(self) -> RssPoller:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stop sampling; the peaks in MiB."""
        self._done.set()
        self._thread.join(5)
        return {k: v / 1024 for k, v in self.peak_kib.items()}

"""No client can hold the daemon by going quiet, and a failure once the answer has begun
cuts the connection (issue 34). A real daemon process on loopback, raw sockets.

- A connection that sends no request head, or trickles one (slowloris), is closed after
  ``request_head_timeout``.
- A reader that stops reading is cut off after ``send_idle_timeout`` and its download slot
  freed: four of them no longer starve every other read of ``--max-concurrent-downloads 4``.
- An error after the 200 headers went out aborts the connection: the client sees a cut
  stream, never a 500 response written inside the body.
- A JSON body (seal, heartbeat, lost verdicts, bulk reads) that stops arriving is a 408
  after ``upload_idle_timeout``, like an upload's.
"""

from __future__ import annotations

import select
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import PREFIX, arrow_bytes
from tests.helpers.procs import DaemonProcess, host_port, http_get, metric_value, wait_for

QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"


def _put(url: str, sup: str, sub: str, body: bytes) -> int:
    request = urllib.request.Request(
        f"{url}{PREFIX}/tasks/{sup}/{sub}/partition?{QUERY}", data=body, method="PUT",
        headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return resp.status


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the daemon closes ``sock`` within ``within`` s (anything it sends first is
    read and dropped)."""
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            return False
        try:
            if not sock.recv(1 << 16):
                return True
        except ConnectionError:
            return True
    return False


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("timeouts")
    with DaemonProcess([base / "a"], "--request-head-timeout", "1",
                       "--send-idle-timeout", "1", "--max-concurrent-downloads", "4",
                       "--upload-idle-timeout", "1",
                       log_path=base / "daemon.log") as proc:
        yield proc


def test_idle_and_slowloris_connections_are_closed(daemon: DaemonProcess) -> None:
    host, port = host_port(daemon.url)
    idle = [socket.create_connection((host, port), timeout=5) for _ in range(20)]
    slow = [socket.create_connection((host, port), timeout=5) for _ in range(20)]
    try:
        for sock in slow:
            sock.sendall(f"GET {PREFIX}/tasks HTTP/1.1\r\nHost: {host}\r\n".encode())
        # trickle one header line byte by byte for up to 3 s: the head never completes
        until = time.monotonic() + 3
        closed: set[int] = set()
        while time.monotonic() < until and len(closed) < len(slow):
            for i, sock in enumerate(slow):
                if i in closed:
                    continue
                try:
                    sock.sendall(b"X")
                except OSError:
                    closed.add(i)
            time.sleep(0.1)  # the trickle's pace, not a synchronisation
        assert all(_closed_by_peer(s, 5) for s in idle), "an idle connection stayed open"
        assert all(i in closed or _closed_by_peer(s, 5) for i, s in enumerate(slow)), \
            "a slowloris connection stayed open"
        # the daemon still answers
        assert http_get(f"{daemon.url}/status/health")[0] == 200
    finally:
        for sock in idle + slow:
            sock.close()


def test_readers_that_stop_reading_do_not_starve_the_others(daemon: DaemonProcess) -> None:
    rows = 6_500_000  # ~52 MB: more than loopback's socket buffers hold
    table = pa.table({"__time": pa.array(range(rows), pa.int64())})
    assert _put(daemon.url, "stall", "s0", arrow_bytes(table)) == 201
    host, port = host_port(daemon.url)
    stalled = []
    try:
        for _ in range(4):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, port))
            sock.sendall(f"GET {PREFIX}/tasks/stall/partition?{QUERY} HTTP/1.1\r\n"
                         f"Host: {host}\r\n\r\n".encode())
            stalled.append(sock)
        started = time.monotonic()
        # every slot is taken for a moment; within a few seconds the stalled ones are cut
        # and another reader is served (without the send timeout: 503 for minutes)
        status = wait_for(lambda: (s := http_get(
            f"{daemon.url}{PREFIX}/tasks/stall/partition?{QUERY}", timeout=60)[0]) == 200 and s,
            "a read served while four readers stall", timeout=20, interval=0.2)
        assert status == 200
        assert time.monotonic() - started < 20
        for sock in stalled:
            assert _closed_by_peer(sock, 60), "a stalled reader was not cut off"
        metrics = http_get(f"{daemon.url}/metrics")[2].decode()
        assert (metric_value(metrics, "shuffled_connections_cut_total",
                             reason="send_timeout") or 0) >= 4
    finally:
        for sock in stalled:
            sock.close()


def test_an_error_after_the_headers_cuts_the_connection(daemon: DaemonProcess) -> None:
    """Two partials whose column x is int64 and float64 unify to float64, and 2^60 + 1 does
    not convert exactly: the re-encoding fails after the 200 headers went out."""
    assert _put(daemon.url, "cut", "a",
                arrow_bytes(pa.table({"x": pa.array([(1 << 60) + 1], pa.int64())}))) == 201
    assert _put(daemon.url, "cut", "b", arrow_bytes(pa.table({"x": pa.array([1.5])}))) == 201
    host, port = host_port(daemon.url)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"GET {PREFIX}/tasks/cut/partition?{QUERY} HTTP/1.1\r\n"
                     f"Host: {host}\r\n\r\n".encode())
        received = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionError:
                break
            if not chunk:
                break
            received += chunk
        else:
            raise AssertionError(f"the connection stayed open: {received[:300]!r}")
    assert received.startswith(b"HTTP/1.1 200"), received[:200]
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    assert b"HTTP/1.1" not in body, f"a second response in the body: {received!r}"
    assert not body.endswith(b"0\r\n\r\n"), "the chunked body was ended as if whole"
    metrics = http_get(f"{daemon.url}/metrics")[2].decode()
    assert metric_value(metrics, "shuffled_connections_cut_total",
                        reason="error_after_headers") == 1


@pytest.mark.parametrize("method, path", [
    ("PUT", "/tasks/j/seal"), ("POST", "/tasks/j/heartbeat"), ("PUT", "/tasks/j/lost"),
    ("POST", "/tasks/j/partitions")])
def test_a_json_body_that_stops_arriving_is_a_408(daemon: DaemonProcess, method: str,
                                                  path: str) -> None:
    host, port = host_port(daemon.url)
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(f"{method} {PREFIX}{path} HTTP/1.1\r\nHost: {host}\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     '{"subTask'.encode())
        started = time.monotonic()
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < 8

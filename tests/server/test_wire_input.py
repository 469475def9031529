"""Bad input on the wire, sent byte for byte over a raw socket to a real daemon: lying
Content-Length, conflicting framing, raw NUL/non-UTF-8/absolute-form targets. Each is
refused (or the connection dropped) and nothing is left on disk."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import PREFIX, arrow_bytes, files_under, sample_table
from tests.helpers.procs import host_port, http_get, wait_for

GOOD = arrow_bytes(sample_table(2000))
QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"
TARGET = f"{PREFIX}/tasks/sup/s1/partition?{QUERY}"


def put_head(target: str = TARGET, *headers: str) -> bytes:
    lines = [f"PUT {target} HTTP/1.1", "Host: 127.0.0.1",
             "Content-Type: application/vnd.apache.arrow.stream", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# name -> (bytes to send, then: "half-close" | "close" | "read", acceptable statuses;
#          None = the daemon may just drop the connection)
CASES: dict[str, tuple[bytes, str, set[int | None]]] = {
    "content-length larger than the body, then EOF": (
        put_head(TARGET, f"Content-Length: {len(GOOD) + 4096}") + GOOD, "half-close",
        {400, None}),
    "content-length larger than the body, then reset": (
        put_head(TARGET, f"Content-Length: {len(GOOD) + 4096}") + GOOD, "close", {None}),
    "content-length smaller than the body": (
        put_head(TARGET, f"Content-Length: {len(GOOD) - 100}") + GOOD, "read", {400}),
    "content-length of half the body": (
        put_head(TARGET, f"Content-Length: {len(GOOD) // 2}") + GOOD, "read", {400}),
    "content-length zero with a body": (
        put_head(TARGET, "Content-Length: 0") + GOOD, "read", {400}),
    "two different content-lengths": (
        put_head(TARGET, f"Content-Length: {len(GOOD)}", "Content-Length: 10") + GOOD, "read",
        {400}),
    "content-length and chunked": (
        put_head(TARGET, f"Content-Length: {len(GOOD)}", "Transfer-Encoding: chunked")
        + f"{len(GOOD):x}\r\n".encode() + GOOD + b"\r\n0\r\n\r\n", "read", {400}),
    "negative content-length": (
        put_head(TARGET, "Content-Length: -5") + GOOD, "read", {400}),
    "non-numeric content-length": (
        put_head(TARGET, "Content-Length: 12abc") + GOOD, "read", {400}),
    "chunked body cut mid-chunk": (
        put_head(TARGET, "Transfer-Encoding: chunked") + f"{len(GOOD):x}\r\n".encode()
        + GOOD[:500], "half-close", {400, None}),
    "raw NUL in the path": (
        put_head(f"{PREFIX}/tasks/su\x00p/s1/partition?{QUERY}", f"Content-Length: {len(GOOD)}")
        + GOOD, "read", {400, 404}),
    "raw non-UTF-8 in the path": (
        put_head(TARGET, f"Content-Length: {len(GOOD)}").replace(b"/sup/", b"/s\xff\xfe/")
        + GOOD, "read", {400, 404}),
    "absolute-form target escaping": (
        put_head(f"http://127.0.0.1{PREFIX}/tasks/../../../etc/s1/partition?{QUERY}",
                 f"Content-Length: {len(GOOD)}") + GOOD, "read", {400, 404}),
    "absolute file path as target": (
        put_head(f"/etc/passwd?{QUERY}", f"Content-Length: {len(GOOD)}") + GOOD, "read",
        {404, 405}),
}


@pytest.fixture(scope="module")
def wire_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    tmp = tmp_path_factory.mktemp("wire")
    locs = [tmp / "a", tmp / "b"]
    with EmbeddedDaemon(locs, free_space_reserve=0) as url:
        yield url, locs


def status_of(reply: bytes) -> int | None:
    if not reply.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")):
        return None
    return int(reply[9:12])


@pytest.mark.parametrize("name", list(CASES))
def test_lying_framing_and_odd_targets_leave_nothing(wire_daemon: tuple[str, list[Path]],
                                                     name: str) -> None:
    url, locs = wire_daemon
    payload, then, acceptable = CASES[name]
    host, port = host_port(url)
    sock = socket.create_connection((host, port), timeout=10)
    reply = b""
    try:
        sock.sendall(payload)
        if then == "close":
            wait_for(lambda: json.loads(http_get(f"{url}/status")[2])["inFlight"]["uploads"],
                     "the upload to be in flight")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        else:
            if then == "half-close":
                sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + 10
            while b"\r\n\r\n" not in reply and time.monotonic() < deadline:
                try:
                    chunk = sock.recv(65536)
                except (ConnectionResetError, TimeoutError):
                    break
                if not chunk:
                    break
                reply += chunk
    finally:
        sock.close()
    assert status_of(reply) in acceptable, (name, reply[:300])
    if reply.startswith(b"HTTP/1.1 4"):  # a handler's answer: JSON naming the problem
        assert b"application/json" in reply.partition(b"\r\n\r\n")[0], reply[:300]
    # (HTTP/1.0 400s come from aiohttp's HTTP parser, before any handler: plain text.)
    wait_for(lambda: json.loads(http_get(f"{url}/status")[2])["inFlight"]["uploads"] == 0,
             "no upload in flight")
    for loc in locs:
        assert files_under(loc) == [], (name, files_under(loc))
    listing = json.loads(http_get(f"{url}{PREFIX}/tasks")[2])
    assert listing["files"] == 0 and listing["tasks"] == []

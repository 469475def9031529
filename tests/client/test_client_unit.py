"""Unit tests of shuffled.client against small fake servers on 127.0.0.1 (no real daemon).

The fake is a ``ThreadingHTTPServer`` speaking HTTP/1.1 keep-alive that stores partial
segments and serves them with ETag, Range/If-Range, Content-Digest and Repr-Digest. Each test
queues "actions" that replace the default handling of the next requests, to inject faults
(drop mid-body, wrong digest, 503 + Retry-After, JSON errors, stalls).
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import crc32c
import pytest

from shuffled.client import RetryPolicy, ShuffleClient, ShuffleUnavailable, crc32c_of
from shuffled.client.digest import CHUNK
from shuffled.errors import (
    BadTierCopy,
    Conflict,
    DigestMismatch,
    InsufficientStorage,
    InvalidId,
    LocationFailed,
    NotFound,
    Overloaded,
    ShuffleError,
    Unauthorized,
)
from shuffled.protocol import (
    API_PREFIX,
    ARROW_STREAM,
    CONTENT_DIGEST,
    REPR_DIGEST,
    Interval,
    PartialKey,
    PartitionKey,
    format_crc32c,
    parse_crc32c,
)

FAST = RetryPolicy(attempts=4, backoff=0.001, max_backoff=0.01, deadline=10.0)
INTERVAL = Interval.parse("2018-01-01", "2018-01-02")
KEY = PartialKey("sup_1", "sub-a", INTERVAL, 3)
KEY_B = PartialKey("sup_1", "sub-b", INTERVAL, 3)
WAIT = 10.0  # upper bound of any wait in these tests


# --- the fake server ------------------------------------------------------------------


@dataclass
class Req:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    client_port: int


Action = Callable[["Handler", Req], None]


@dataclass
class Stored:
    data: bytes
    generation: int

    @property
    def crc(self) -> int:
        return crc32c_of(self.data)

    @property
    def etag(self) -> str:
        return f'"g{self.generation}-{self.crc:08x}"'


@dataclass
class Fake:
    objects: dict[tuple[str, str, str, str, str], Stored] = field(default_factory=dict)
    requests: list[Req] = field(default_factory=list)
    actions: list[Action | None] = field(default_factory=list)
    generation: int = 0
    deleted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def store(self, key: PartialKey, data: bytes) -> Stored:
        with self.lock:
            self.generation += 1
            stored = Stored(data, self.generation)
            self.objects[_okey(key.supervisor_task_id, key.sub_task_id, key.query())] = stored
            return stored

    def next_action(self) -> Action | None:
        with self.lock:
            return self.actions.pop(0) if self.actions else None

    def of(self, method: str) -> list[Req]:
        return [r for r in self.requests if r.method == method]


def _okey(sup: str, sub: str, query: dict[str, Any]) -> tuple[str, str, str, str, str]:
    def one(name: str) -> str:
        value = query.get(name, "")
        return value[0] if isinstance(value, list) else value

    return (sup, sub, one("start"), one("end"), one("partitionId"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = WAIT
    server: FakeServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        url = urllib.parse.urlsplit(self.path)
        req = Req(
            self.command,
            url.path,
            urllib.parse.parse_qs(url.query),
            {k: v for k, v in self.headers.items()},
            body,
            self.client_address[1],
        )
        fake = self.server.fake
        with fake.lock:
            fake.requests.append(req)
        action = fake.next_action()
        if action is not None:
            action(self, req)
        else:
            default_route(self, req)

    # helpers used by routes and actions
    def send_json(self, status: int, value: Any, headers: dict[str, str] | None = None) -> None:
        raw = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def send_bytes(
        self,
        status: int,
        data: bytes,
        headers: dict[str, str],
        *,
        truncate_at: int | None = None,
        stall: threading.Event | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if truncate_at is None:
            self.wfile.write(data)
            return
        self.wfile.write(data[:truncate_at])
        self.wfile.flush()
        if stall is not None:
            stall.wait(WAIT)  # the client times out meanwhile; bounded
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.fake = Fake()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients dropping connections on purpose is expected here

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def _parts(path: str) -> list[str]:
    assert path.startswith(API_PREFIX), path
    return path[len(API_PREFIX):].strip("/").split("/")


def serve_partial(
    h: Handler,
    req: Req,
    *,
    truncate_at: int | None = None,
    digest: int | None = None,
    stall: threading.Event | None = None,
) -> None:
    parts = _parts(req.path)
    stored = h.server.fake.objects.get(_okey(parts[1], parts[2], req.query))
    if stored is None:
        h.send_json(404, {"error": f"no partial segment {parts[1]}/{parts[2]}", "code": "not_found"})
        return
    crc = stored.crc if digest is None else digest
    base = {"ETag": stored.etag, REPR_DIGEST: format_crc32c(crc), "X-Shuffled-Rows": "7",
            "Content-Type": ARROW_STREAM}
    rng = req.headers.get("Range")
    if_range = req.headers.get("If-Range")
    if rng and (if_range is None or if_range == stored.etag):
        start = int(rng.removeprefix("bytes=").rstrip("-"))
        if start >= len(stored.data):
            h.send_json(416, {"error": "range not satisfiable", "code": "range_not_satisfiable"},
                        {"Content-Range": f"bytes */{len(stored.data)}"})
            return
        part = stored.data[start:]
        base["Content-Range"] = f"bytes {start}-{len(stored.data) - 1}/{len(stored.data)}"
        h.send_bytes(206, part, base, truncate_at=truncate_at, stall=stall)
        return
    base[CONTENT_DIGEST] = format_crc32c(crc)
    h.send_bytes(200, stored.data, base, truncate_at=truncate_at, stall=stall)


def serve_aggregate(h: Handler, req: Req, *, digest: int | None = None) -> None:
    parts = _parts(req.path)
    fake = h.server.fake
    subs = req.query.get("subTaskId")
    wanted = _okey(parts[1], "", req.query)[2:]
    chunks = [
        s.data
        for (sup, sub, *rest), s in sorted(fake.objects.items())
        if sup == parts[1] and tuple(rest) == wanted and (subs is None or sub in subs)
    ]
    data = b"".join(chunks)
    crc = crc32c_of(data) if digest is None else digest
    # Chunked transfer encoding: an aggregate's length is not known up front.
    h.send_response(200)
    h.send_header("Content-Type", ARROW_STREAM)
    h.send_header("Transfer-Encoding", "chunked")
    h.send_header(CONTENT_DIGEST, format_crc32c(crc))
    h.end_headers()
    for chunk in chunks:
        if chunk:
            h.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    h.wfile.write(b"0\r\n\r\n")


def default_route(h: Handler, req: Req) -> None:
    fake = h.server.fake
    parts = _parts(req.path)
    if parts == ["status", "health"]:
        h.send_json(200, True)
    elif parts == ["status"]:
        h.send_json(200, {"version": "test", "uptime": 1.0, "locations": []})
    elif parts == ["tasks"]:
        h.send_json(200, {"tasks": {sup: {} for sup, *_ in fake.objects}})
    elif len(parts) == 2 and req.method == "GET":
        held = [k for k in fake.objects if k[0] == parts[1]]
        if not held:
            h.send_json(404, {"error": f"task {parts[1]} is not held here", "code": "not_found"})
        else:
            h.send_json(200, {"supervisorTaskId": parts[1], "partials": len(held)})
    elif len(parts) == 2 and req.method == "DELETE":
        for k in [k for k in fake.objects if k[0] == parts[1]]:
            del fake.objects[k]
        fake.deleted.add(parts[1])
        h.send_response(204)
        h.end_headers()
    elif len(parts) == 3 and parts[2] == "partition":
        serve_aggregate(h, req)
    elif len(parts) == 4 and req.method == "PUT":
        sent = parse_crc32c(req.headers.get(CONTENT_DIGEST))
        if sent != crc32c_of(req.body):
            h.send_json(400, {"error": "digest mismatch", "code": "digest_mismatch"})
            return
        key = PartialKey(parts[1], parts[2], Interval.parse(req.query["start"][0], req.query["end"][0]),
                         int(req.query["partitionId"][0]))
        stored = fake.store(key, req.body)
        h.send_json(201, {"bytes": len(req.body), "rows": 7, "crc32c": f"{stored.crc:08x}",
                          "generation": stored.generation})
    elif len(parts) == 4 and req.method == "GET":
        serve_partial(h, req)
    else:
        h.send_json(404, {"error": "no route", "code": "not_found"})


# --- actions ----------------------------------------------------------------------------


def status(code: int, body: Any, headers: dict[str, str] | None = None) -> Action:
    def act(h: Handler, req: Req) -> None:
        h.send_json(code, body, headers)

    return act


def drop_after(n: int) -> Action:
    return lambda h, req: serve_partial(h, req, truncate_at=n)


def wrong_digest(h: Handler, req: Req) -> None:
    parts = _parts(req.path)
    if len(parts) == 3:
        serve_aggregate(h, req, digest=0xDEADBEEF)
    else:
        serve_partial(h, req, digest=0xDEADBEEF)


def replace_then(data: bytes, key: PartialKey, then: Action | None = None) -> Action:
    """Store new bytes for ``key`` (new ETag) before serving this request."""

    def act(h: Handler, req: Req) -> None:
        h.server.fake.store(key, data)
        (then or default_route)(h, req)

    return act


def close_after_response(h: Handler, req: Req) -> None:
    """Answer normally but close the connection without announcing it (a stale keep-alive)."""
    default_route(h, req)
    h.wfile.flush()
    h.close_connection = True


# --- fixtures ---------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(WAIT)


@dataclass
class Sleeps:
    calls: list[float] = field(default_factory=list)

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def client(server: FakeServer, sleeps: Sleeps) -> Iterator[ShuffleClient]:
    with ShuffleClient(server.url, token="s3cret", retry=FAST, timeout=WAIT,
                       sleep=sleeps) as c:  # record instead of sleeping
        yield c


def payload(n: int, seed: int = 1) -> bytes:
    return (bytes(range(256)) * (n // 256 + 1))[:n] if seed == 1 else os.urandom(n)


# --- tests: put -------------------------------------------------------------------------


def test_put_sends_content_digest_type_length_and_token(server: FakeServer, client: ShuffleClient) -> None:
    body = payload(100_000)
    result = client.put_partial(KEY, memoryview(body))
    assert result["bytes"] == len(body) and result["rows"] == 7
    (put,) = server.fake.of("PUT")
    assert put.path == f"{API_PREFIX}/tasks/sup_1/sub-a/partition"
    assert put.query == {"start": ["2018-01-01T00:00:00.000Z"], "end": ["2018-01-02T00:00:00.000Z"],
                         "partitionId": ["3"]}
    assert put.headers["Content-Type"] == ARROW_STREAM
    assert put.headers["Content-Length"] == str(len(body))
    expected = base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode()
    assert put.headers[CONTENT_DIGEST] == f"crc32c=:{expected}:"
    assert put.headers["Authorization"] == "Bearer s3cret"
    assert put.body == body


def test_put_retries_503_resending_the_whole_body(server: FakeServer, client: ShuffleClient,
                                                  sleeps: Sleeps) -> None:
    server.fake.actions += [status(503, {"error": "busy", "code": "overloaded"}, {"Retry-After": "1"})]
    body = payload(300_000)
    client.put_partial(KEY, bytearray(body))
    puts = server.fake.of("PUT")
    assert len(puts) == 2 and all(p.body == body for p in puts)
    assert sleeps.calls == [FAST.max_backoff * 4]  # Retry-After 1s capped by 4 * max_backoff


@pytest.mark.parametrize("sizes", [(10, 0, 30), (40_000, 1, 300_000, 0, 7)])
def test_a_body_in_pieces_goes_out_whole_on_every_try(server: FakeServer, client: ShuffleClient,
                                                     sleeps: Sleeps, sizes: tuple[int, ...]) -> None:
    """A body given as pieces (a slab's sections, never joined by the client) is sent
    with their total Content-Length, in order, and whole again on a retry; a small one
    (one send with the headers) and a large one alike."""
    import pyarrow as pa

    from shuffled.client.answers import json_dict
    from shuffled.client.http import Request

    pieces = [payload(n, seed=i + 1) for i, n in enumerate(sizes)]
    body = [pieces[0], memoryview(pieces[1]), pa.py_buffer(pieces[2]), *pieces[3:]]
    server.fake.actions += [status(503, {"error": "busy", "code": "overloaded"},
                                   {"Retry-After": "1"}), status(201, {"stored": True})]
    got = client._http.request(Request("PUT", "/pieces", body=body, handle=json_dict,
                                       what="pieces"))
    assert got == {"stored": True}
    sent = server.fake.of("PUT")
    assert len(sent) == 2
    for req in sent:
        assert req.body == b"".join(pieces)
        assert req.headers["Content-Length"] == str(sum(sizes))


def test_put_server_reporting_another_crc_is_a_digest_mismatch(server: FakeServer,
                                                                client: ShuffleClient) -> None:
    server.fake.actions += [status(201, {"bytes": 3, "crc32c": "00000000"})]
    with pytest.raises(DigestMismatch, match="sup_1/sub-a"):
        client.put_partial(KEY, b"abc")


def test_put_rejected_digest_is_not_retried(server: FakeServer, client: ShuffleClient) -> None:
    server.fake.actions += [status(400, {"error": "Content-Digest does not match", "code": "digest_mismatch"})]
    with pytest.raises(DigestMismatch, match="does not match"):
        client.put_partial(KEY, b"abc")
    assert len(server.fake.requests) == 1


def test_put_empty_body(server: FakeServer, client: ShuffleClient) -> None:
    client.put_partial(KEY, b"")
    assert client.get_partial(KEY) == b""


# --- tests: get partial -----------------------------------------------------------------


def test_get_partial_round_trip_reuses_one_connection(server: FakeServer, client: ShuffleClient,
                                                      sleeps: Sleeps) -> None:
    body = payload(3 * (1 << 20) + 17)  # several 1 MiB chunks plus a tail
    client.put_partial(KEY, body)
    assert client.get_partial(KEY) == body
    assert client.get_partial(KEY) == body
    assert len({r.client_port for r in server.fake.requests}) == 1  # keep-alive
    assert sleeps.calls == []


def test_get_partial_resumes_with_range_after_a_drop(server: FakeServer, client: ShuffleClient,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    body = payload(2_500_000)
    stored = server.fake.store(KEY, body)
    server.fake.actions += [drop_after(1_000_000)]
    with caplog.at_level(logging.WARNING, logger="shuffled.client"):
        assert client.get_partial(KEY) == body
    first, second = server.fake.of("GET")
    assert "Range" not in first.headers
    assert second.headers["Range"] == "bytes=1000000-"
    assert second.headers["If-Range"] == stored.etag
    assert second.client_port != first.client_port  # a fresh connection after the drop
    assert any("sup_1/sub-a" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_get_partial_resumes_twice_and_verifies_the_assembled_bytes(server: FakeServer,
                                                                    client: ShuffleClient) -> None:
    body = payload(1_000_000, seed=2)
    server.fake.store(KEY, body)
    server.fake.actions += [drop_after(300_000), drop_after(300_000)]
    assert client.get_partial(KEY) == body
    ranges = [r.headers.get("Range") for r in server.fake.of("GET")]
    assert ranges == [None, "bytes=300000-", "bytes=600000-"]


def test_get_partial_resume_with_wrong_digest_names_the_key(server: FakeServer,
                                                            client: ShuffleClient) -> None:
    server.fake.store(KEY, payload(500_000))

    # The server declares the same (wrong) digest on the 200 and on the resumed 206: the
    # assembled bytes are checked against it.
    server.fake.actions += [
        lambda h, req: serve_partial(h, req, digest=0x12345678, truncate_at=100_000),
        lambda h, req: serve_partial(h, req, digest=0x12345678),
    ]
    with pytest.raises(DigestMismatch) as info:
        client.get_partial(KEY)
    assert str(KEY) in str(info.value)
    assert [r.headers.get("Range") for r in server.fake.of("GET")] == [None, "bytes=100000-"]


def test_get_partial_starts_over_when_the_segment_was_replaced(server: FakeServer,
                                                               client: ShuffleClient) -> None:
    server.fake.store(KEY, payload(400_000))
    new = payload(250_000, seed=2)
    # First try drops; before the resume the task retry replaced the segment (new ETag), so
    # If-Range fails and the server answers 200 with the whole new file.
    server.fake.actions += [drop_after(100_000), replace_then(new, KEY)]
    assert client.get_partial(KEY) == new
    assert server.fake.of("GET")[1].headers["Range"] == "bytes=100000-"


def test_get_partial_to_streams_into_a_file_and_resumes(server: FakeServer, client: ShuffleClient,
                                                        tmp_path: Any) -> None:
    body = payload(3_300_000, seed=2)
    server.fake.store(KEY, body)
    server.fake.actions += [drop_after(1_500_000)]
    target = tmp_path / "part.arrow"
    with open(target, "wb") as out:
        out.write(b"HEADER")  # writes go after the caller's current position
        assert client.get_partial_to(KEY, out) == len(body)
    assert target.read_bytes() == b"HEADER" + body


def test_get_partial_to_restart_rewinds_the_file(server: FakeServer, client: ShuffleClient) -> None:
    server.fake.store(KEY, payload(400_000))
    new = payload(300_000, seed=2)
    server.fake.actions += [drop_after(350_000), replace_then(new, KEY)]
    out = io.BytesIO()
    out.write(b"x")
    assert client.get_partial_to(KEY, out) == len(new)
    assert out.getvalue() == b"x" + new


class _Pipe(io.RawIOBase):
    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, b: Any) -> int:
        # Short writes: the client must loop.
        n = min(len(b), 4096)
        self.data += bytes(b[:n])
        return n


def test_get_partial_to_non_seekable_output_resumes_but_cannot_restart(server: FakeServer,
                                                                       client: ShuffleClient) -> None:
    body = payload(200_000)
    server.fake.store(KEY, body)
    server.fake.actions += [drop_after(50_000)]
    pipe = _Pipe()
    assert client.get_partial_to(KEY, pipe) == len(body)  # type: ignore[arg-type]
    assert bytes(pipe.data) == body

    server.fake.actions += [drop_after(50_000), replace_then(payload(10, seed=2), KEY)]
    with pytest.raises(Conflict, match="not seekable"):
        client.get_partial_to(KEY, _Pipe())  # type: ignore[arg-type]


def test_get_partial_to_local_write_error_is_not_retried(server: FakeServer,
                                                         client: ShuffleClient) -> None:
    server.fake.store(KEY, payload(100_000))

    class Full(io.BytesIO):
        def write(self, b: Any) -> int:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        client.get_partial_to(KEY, Full())
    assert len(server.fake.of("GET")) == 1


def test_get_partial_wrong_digest_raises_naming_the_key(server: FakeServer,
                                                        client: ShuffleClient) -> None:
    server.fake.store(KEY, payload(10_000))
    server.fake.actions += [wrong_digest]
    with pytest.raises(DigestMismatch) as info:
        client.get_partial(KEY)
    assert str(KEY) in str(info.value)
    assert "sup_1/sub-a" in str(info.value) and "partition 3" in str(info.value)
    assert len(server.fake.requests) == 1  # not retried


def test_503_with_retry_after_twice_then_200(server: FakeServer, sleeps: Sleeps) -> None:
    server.fake.store(KEY, b"hello")
    busy = status(503, {"error": "too many requests in flight", "code": "overloaded", "retry_after": 1},
                  {"Retry-After": "1"})
    server.fake.actions += [busy, busy]
    policy = RetryPolicy(attempts=6, backoff=0.001, max_backoff=0.5, deadline=10.0)
    with ShuffleClient(server.url, retry=policy, sleep=sleeps) as c:
        assert c.get_partial(KEY) == b"hello"
    assert sleeps.calls == [1.0, 1.0]  # honoured (cap is 4 * 0.5 = 2s)
    assert len(server.fake.requests) == 3


def test_503_gives_up_with_overloaded_after_attempts(server: FakeServer, client: ShuffleClient,
                                                     sleeps: Sleeps) -> None:
    server.fake.actions += [status(503, {"error": "busy", "code": "overloaded"}, {"Retry-After": "1"})] * 10
    with pytest.raises(Overloaded):
        client.get_partial(KEY)
    assert len(server.fake.requests) == FAST.attempts
    assert len(sleeps.calls) == FAST.attempts - 1


@pytest.mark.parametrize("code,exc", [(500, ShuffleError), (502, ShuffleError), (504, ShuffleError)])
def test_5xx_retried_then_succeeds(server: FakeServer, client: ShuffleClient, code: int,
                                   exc: type[Exception]) -> None:
    server.fake.store(KEY, b"x")
    server.fake.actions += [status(code, {"error": "boom"})]
    assert client.get_partial(KEY) == b"x"
    assert len(server.fake.requests) == 2


def test_a_bad_tier_copy_is_not_retried_and_counts_as_the_daemons(
        server: FakeServer, client: ShuffleClient) -> None:
    """502 bad_tier_copy (a lost peer's copy in deep storage is unusable): asking again
    returns the same, and a reader takes it as that source failing (phase 2 then reports
    it lost, and the driver re-runs what it held); a plain 502 is still retried above."""
    from shuffled.client import daemon_failed

    server.fake.actions += [status(502, {"error": "slab missing", "code": "bad_tier_copy"})]
    with pytest.raises(BadTierCopy) as info:
        client.get_partial(KEY)
    assert len(server.fake.requests) == 1
    assert daemon_failed(info.value)


def test_507_location_failed_is_retried_but_plain_507_is_not(server: FakeServer,
                                                             client: ShuffleClient) -> None:
    server.fake.actions += [status(507, {"error": "disk /a failed", "code": "location_failed"})]
    client.put_partial(KEY, b"abc")
    assert len(server.fake.of("PUT")) == 2

    server.fake.actions += [status(507, {"error": "all locations full", "code": "insufficient_storage"})]
    with pytest.raises(InsufficientStorage) as info:
        client.put_partial(KEY, b"abc")
    assert not isinstance(info.value, LocationFailed)
    assert len(server.fake.of("PUT")) == 3


@pytest.mark.parametrize(
    "code,body,exc",
    [
        (400, {"error": "subTaskId 'a/b' has characters outside ...", "code": "invalid_id", "field": "subTaskId"},
         InvalidId),
        (401, {"error": "missing or wrong token", "code": "unauthorized"}, Unauthorized),
        (404, {"error": "no partial segment", "code": "not_found"}, NotFound),
        (413, {"error": "too large", "code": "too_large"}, ShuffleError),
    ],
)
def test_4xx_raises_the_domain_error_without_retry(server: FakeServer, client: ShuffleClient,
                                                   sleeps: Sleeps, code: int, body: dict[str, Any],
                                                   exc: type[Exception]) -> None:
    server.fake.actions += [status(code, body)]
    with pytest.raises(exc) as info:
        client.get_partial(KEY)
    assert isinstance(info.value, ShuffleError) and info.value.status == code
    assert info.value.message == body["error"]
    assert len(server.fake.requests) == 1 and sleeps.calls == []


def test_non_json_error_body_still_maps_by_status(server: FakeServer, client: ShuffleClient) -> None:
    def text_413(h: Handler, req: Req) -> None:
        raw = b"Request Entity Too Large"
        h.send_response(413)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)

    server.fake.actions += [text_413]
    with pytest.raises(ShuffleError) as info:
        client.put_partial(KEY, b"abc")
    assert info.value.status == 413 and "Too Large" in info.value.message


def test_missing_partial_is_not_found(client: ShuffleClient) -> None:
    with pytest.raises(NotFound):
        client.get_partial(KEY_B)


def test_stalled_body_times_out_and_resumes(server: FakeServer, sleeps: Sleeps) -> None:
    body = payload(2 * CHUNK + 5)
    server.fake.store(KEY, body)
    release = threading.Event()
    stall = lambda h, req: serve_partial(h, req, truncate_at=CHUNK + 50_000, stall=release)  # noqa: E731
    server.fake.actions += [stall, None, stall]
    try:
        with ShuffleClient(server.url, retry=FAST, timeout=0.3, sleep=sleeps) as c:
            out = io.BytesIO()
            assert c.get_partial_to(KEY, out) == len(body) and out.getvalue() == body
            # get_partial reads a known-length body in one go: a timeout restarts it whole.
            assert c.get_partial(KEY) == body
    finally:
        release.set()
    ranges = [r.headers.get("Range") for r in server.fake.of("GET")]
    # Whole 1 MiB chunks already handed over are kept; the chunk cut by the timeout is re-read.
    assert ranges == [None, f"bytes={CHUNK}-", None, None]


def test_stale_keep_alive_connection_is_reopened_silently(server: FakeServer, client: ShuffleClient,
                                                          sleeps: Sleeps,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    server.fake.actions += [close_after_response]
    assert client.health() is True
    with caplog.at_level(logging.WARNING, logger="shuffled.client"):
        assert client.status()["version"] == "test"
    assert sleeps.calls == [] and not caplog.records
    assert len({r.client_port for r in server.fake.requests}) == 2


def test_unreachable_server_raises_shuffle_unavailable(sleeps: Sleeps) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with ShuffleClient(f"http://127.0.0.1:{port}", retry=FAST, timeout=WAIT,
                       sleep=sleeps) as c:
        assert c.health() is False
        with pytest.raises(ShuffleUnavailable, match="sup_1/sub-a") as info:
            c.put_partial(KEY, b"abc")
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert len(sleeps.calls) == FAST.attempts - 1
    assert all(0 < d <= FAST.max_backoff for d in sleeps.calls)


def test_deadline_stops_retrying(server: FakeServer) -> None:
    server.fake.actions += [status(503, {"error": "busy", "code": "overloaded"}, {"Retry-After": "3"})] * 5
    now = [0.0]

    def fake_sleep(d: float) -> None:
        now[0] += d

    with ShuffleClient(server.url, retry=RetryPolicy(attempts=100, max_backoff=10, deadline=5.0),
                       clock=lambda: now[0], sleep=fake_sleep) as c:
        with pytest.raises(Overloaded):
            c.get_partial(KEY)
    assert len(server.fake.requests) == 3  # sleeps 3 + 2 (capped by the deadline), then gives up
    assert now[0] == pytest.approx(5.0)


# --- tests: aggregate -------------------------------------------------------------------


def test_get_partition_passes_sub_task_ids_and_verifies_digest(server: FakeServer,
                                                               client: ShuffleClient) -> None:
    server.fake.store(KEY, b"AAAA")
    server.fake.store(KEY_B, b"BBBBBB")
    server.fake.store(PartialKey("sup_1", "sub-c", INTERVAL, 3), b"CC")
    part = PartitionKey("sup_1", INTERVAL, 3)
    assert client.get_partition(part) == b"AAAABBBBBBCC"
    assert client.get_partition(part, ["sub-a", "sub-c"]) == b"AAAACC"
    last = server.fake.of("GET")[-1]
    assert last.path == f"{API_PREFIX}/tasks/sup_1/partition"
    assert last.query["subTaskId"] == ["sub-a", "sub-c"]
    assert last.query["partitionId"] == ["3"]

    out = io.BytesIO()
    assert client.get_partition_to(part, out, ("sub-b",)) == 6 and out.getvalue() == b"BBBBBB"

    server.fake.actions += [wrong_digest]
    with pytest.raises(DigestMismatch, match="sup_1 2018-01-01T00:00:00.000Z/2018-01-02T00:00:00.000Z partition 3"):
        client.get_partition(part)


def test_get_partition_refuses_bad_or_empty_sub_task_ids(server: FakeServer, client: ShuffleClient) -> None:
    part = PartitionKey("sup_1", INTERVAL, 3)
    with pytest.raises(InvalidId):
        client.get_partition(part, ["../etc"])
    with pytest.raises(ShuffleError, match="empty"):
        client.get_partition(part, [])
    assert server.fake.requests == []


# --- tests: tasks and status ------------------------------------------------------------


def test_task_admin_and_status(server: FakeServer, client: ShuffleClient) -> None:
    assert client.task("sup_1") is None
    client.put_partial(KEY, b"abc")
    assert client.task("sup_1") == {"supervisorTaskId": "sup_1", "partials": 1}
    assert client.list_tasks() == {"tasks": {"sup_1": {}}}
    client.delete_task("sup_1")
    client.delete_task("sup_1")  # idempotent
    server.fake.actions += [status(404, {"error": "unknown task", "code": "not_found"})]
    client.delete_task("never-held")  # a 404 is fine too
    assert client.task("sup_1") is None
    assert client.health() is True
    assert client.status()["version"] == "test"
    deletes = server.fake.of("DELETE")
    assert [d.path for d in deletes] == [f"{API_PREFIX}/tasks/sup_1"] * 2 + [f"{API_PREFIX}/tasks/never-held"]
    with pytest.raises(InvalidId):
        client.task("a/b")


def test_health_false_when_unhealthy(server: FakeServer, client: ShuffleClient, sleeps: Sleeps) -> None:
    server.fake.actions += [status(503, {"error": "draining", "code": "overloaded"}, {"Retry-After": "1"})]
    assert client.health() is False
    assert sleeps.calls == []  # health never retries


def test_status_falls_back_to_root_route(server: FakeServer, client: ShuffleClient) -> None:
    def root_only(h: Handler, req: Req) -> None:
        h.send_json(404, {"error": "no route", "code": "not_found"})

    server.fake.actions += [root_only, lambda h, req: h.send_json(200, True)]
    assert client.health() is True
    assert [r.path for r in server.fake.requests] == [f"{API_PREFIX}/status/health", "/status/health"]


def test_client_base_url_and_validation() -> None:
    c = ShuffleClient("http://127.0.0.1:1234/")
    assert c.base_url == "http://127.0.0.1:1234"
    c.close()
    with pytest.raises(ValueError):
        ShuffleClient("ftp://example")
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_crc32c_of() -> None:
    assert crc32c_of(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c_of(memoryview(b"")) == 0


def test_client_imports_no_server_side_packages() -> None:
    code = (
        "import sys, shuffled.client\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('aiohttp', 'apscheduler', 'prometheus_client', 'pyarrow') or "
        "m.startswith(('shuffled.server', 'shuffled.storage', 'shuffled.config', 'shuffled.spark'))]\n"
        "print(bad)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "[]"


# Silence an unused-import warning for http.client in some linters.
_ = http.client

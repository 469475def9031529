"""What an upload declares cannot make a read cost more than its bytes carry (issue 34).

Found by an adversarial probe: a 224-byte partial whose null-type column declared 2^24
rows made the next aggregate GET allocate +519 MiB (2^34 rows: the daemon OOM-killed at
24 GB); a record batch with more field nodes than its schema was stored and read back as
other columns' bytes. Against a real daemon process (its peak memory read from
/proc/<pid>/status) and the raw HTTP API.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shuffled import framing2
from shuffled.storage.ondisk.ipcshape import ROWS_FREE, ROWS_PER_BYTE
from tests.conftest import PREFIX, arrow_bytes
from tests.helpers.procs import DaemonProcess, host_port, http_get, metric_value, wait_for

QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"


def _put(url: str, sup: str, sub: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"{url}{PREFIX}/tasks/{sup}/{sub}/partition?{QUERY}", data=body, method="PUT",
        headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _null_rows_stream(rows: int) -> bytes:
    """A stream of one batch of ``rows`` rows of a single null-type column, which has no
    buffers: a few hundred bytes, whatever ``rows`` declares."""
    table = pa.table({"n": pa.nulls(rows)})
    return arrow_bytes(table)


def _messages(stream: bytes) -> list[bytes]:
    """The raw IPC messages of a stream (schema, batches), without the end marker."""
    out = []
    for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(stream)):
        sink = pa.BufferOutputStream()
        message.serialize_to(sink)
        out.append(sink.getvalue().to_pybytes())
    return out


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> DaemonProcess:
    base = tmp_path_factory.mktemp("hostile")
    with DaemonProcess([base / "a"], log_path=base / "daemon.log") as proc:
        yield proc


def test_a_batch_declaring_more_rows_than_its_body_can_carry_is_refused(
        daemon: DaemonProcess) -> None:
    body = _null_rows_stream(1 << 24)
    assert len(body) < 400
    status, answer = _put(daemon.url, "hostile", "s0", body)
    assert status == 400, answer
    assert b"declares 16777216 rows" in answer
    # ...and 2^34 rows (more than pyarrow writes: the batch's and the node's lengths are
    # rewritten in the message's metadata, as a hostile client would)
    odd = 0xABCDEF  # a length whose bytes occur nowhere else in the stream
    small = _null_rows_stream(odd)
    huge = small.replace(struct.pack("<q", odd), struct.pack("<q", (1 << 34) + odd))
    assert huge.count(struct.pack("<q", (1 << 34) + odd)) == 3  # length; node length, nulls
    status, answer = _put(daemon.url, "hostile", "s1", huge)
    assert status == 400 and f"declares {(1 << 34) + odd} rows".encode() in answer, answer
    # what a body of that size may declare is still taken
    status, answer = _put(daemon.url, "hostile", "s2", _null_rows_stream(ROWS_FREE))
    assert status == 201, answer


def test_a_batch_written_for_another_schema_is_refused(daemon: DaemonProcess) -> None:
    """A record batch of (x: float64, y: int64) behind the schema (x: int64): pyarrow
    would read x's float bits as int64 and ignore the extra node."""
    declared = arrow_bytes(pa.table({"x": pa.array([1, 2], pa.int64())}))
    other = arrow_bytes(pa.table({"x": pa.array([1.5, 2.5]), "y": pa.array([3, 4])}))
    schema_message = _messages(declared)[0]
    batch_message = _messages(other)[1]
    body = schema_message + batch_message + b"\xff\xff\xff\xff\x00\x00\x00\x00"
    status, answer = _put(daemon.url, "hostile", "nodes", body)
    assert status == 400, answer
    assert b"field nodes" in answer


def test_a_read_that_fills_a_missing_column_is_bounded_in_memory(
        tmp_path: Path) -> None:
    """Two partials of one partition: 8M rows whose column ``n`` is null-typed (carried by
    a 1 MiB boolean column: within what the body allows), and one whose ``n`` is int64.
    The aggregate GET unifies them: ``n`` becomes 64 MiB of int64 nulls if filled at
    once; it is re-encoded in bounded slices instead."""
    rows = 8 << 20
    assert rows <= ROWS_PER_BYTE * (rows // 8) + ROWS_FREE
    wide = pa.table({"flag": pa.array(np.ones(rows, dtype=bool)),
                     "n": pa.nulls(rows)})
    narrow = pa.table({"flag": pa.array([True, False]), "n": pa.array([1, 2], pa.int64())})
    with DaemonProcess([tmp_path / "a"], log_path=tmp_path / "daemon.log") as daemon:
        assert _put(daemon.url, "wide", "s0", arrow_bytes(wide))[0] == 201
        assert _put(daemon.url, "wide", "s1", arrow_bytes(narrow))[0] == 201
        before = _hwm_kib(daemon.pid)
        received = 0
        request = urllib.request.Request(
            f"{daemon.url}{PREFIX}/tasks/wide/partition?{QUERY}")
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200
            reader = pa.ipc.open_stream(resp)
            for batch in reader:
                assert batch.schema.field("n").type == pa.int64()
                received += batch.num_rows
        grown_mib = (_hwm_kib(daemon.pid) - before) / 1024
        assert received == rows + 2
        # filled at once: 64 MiB for n alone, more for the cast and the encoded copy
        assert grown_mib < 32, f"the read grew the daemon's peak by {grown_mib:.0f} MiB"
        status, _, _ = http_get(f"{daemon.url}/status/health")
        assert status == 200


def _post_bulk(url: str, sup: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}{PREFIX}/tasks/{sup}/partials", data=body, method="POST",
        headers={"Content-Type": "application/vnd.shuffled.partials"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_schema_frames_of_one_bulk_upload_are_bounded(tmp_path: Path) -> None:
    """Format-2 SCHEMA frames (up to 1 MiB each) are kept until the request ends: 400 of
    them held +403 MiB. Past ``max_bulk_schema_bytes`` the request is refused (413)."""
    schema = pa.schema([(f"c{i}", pa.int64()) for i in range(2000)])
    message = schema.serialize().to_pybytes()
    assert 64 << 10 < len(message) < framing2.MAX_SCHEMA
    frames = b"".join(framing2.encode_schema(i, len(message)) + message for i in range(400))
    body = frames + framing2.encode_end(0)
    with DaemonProcess([tmp_path / "a"], "--max-bulk-schema-bytes", "1MiB",
                       log_path=tmp_path / "daemon.log") as daemon:
        before = _hwm_kib(daemon.pid)
        status, answer = _post_bulk(daemon.url, "schemas", body)
        assert status == 413 and answer["code"] == "too_large", answer
        assert "max_bulk_schema_bytes" in answer["error"]
        assert (_hwm_kib(daemon.pid) - before) / 1024 < 32
        # a flush's one schema is taken as ever
        ok = framing2.encode_schema(0, len(message)) + message + framing2.encode_end(0)
        assert _post_bulk(daemon.url, "schemas", ok)[0] == 200


def test_lost_verdicts_are_bounded_in_bytes(tmp_path: Path) -> None:
    """``PUT /tasks/{sup}/lost`` kept up to 1,000 addresses for each of 10,000 tasks
    (~5.6 GiB). Now every verdict kept counts against ``max_lost_marks_bytes``: past it,
    503 with Retry-After, and what was kept stays."""
    addresses = [f"http://daemon-{i}.example:8091/" + "x" * 400 for i in range(1000)]
    with DaemonProcess([tmp_path / "a"], "--max-lost-marks-bytes", "2MiB",
                       log_path=tmp_path / "daemon.log") as daemon:
        statuses = []
        for task in range(20):  # ~0.47 MB a task: the fifth is refused
            request = urllib.request.Request(
                f"{daemon.url}{PREFIX}/tasks/t{task}/lost", method="PUT",
                data=json.dumps({"lost": addresses}).encode(),
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    statuses.append(resp.status)
            except urllib.error.HTTPError as err:
                statuses.append(err.code)
                assert err.headers["Retry-After"]
        assert statuses[:4] == [200] * 4 and set(statuses[4:]) == {503}, statuses
        status, _, body = http_get(f"{daemon.url}{PREFIX}/tasks/t0/lost")
        assert status == 200 and len(json.loads(body)["lost"]) == 1000


def _many_partials(count: int, start: int = 0) -> bytes:
    """One bulk upload (format 2) of ``count`` tiny partials under one schema."""
    from shuffled.crc import crc32c
    from shuffled.protocol import Interval, PartialKey

    messages = _messages(arrow_bytes(pa.table({"x": pa.array([1, 2], pa.int64())})))
    schema, body = messages[0], b"".join(messages[1:])
    crc, day = crc32c(body), Interval.parse("2018-01-01", "2018-01-02")
    frames = [framing2.encode_schema(0, len(schema)), schema]
    for i in range(start, start + count):
        key = PartialKey("many", f"s{i:07d}", day, 0)
        frames += [framing2.encode_partial(key, 0, len(body), crc), body]
    return b"".join(frames) + framing2.encode_end(count)


def test_partials_of_one_bulk_upload_are_bounded(tmp_path: Path) -> None:
    """Each partial of a bulk upload is held (its key, record and answer, ~1.5 KB) until
    the request answers: 200,000 tiny ones held about 300 MiB, whatever the bytes. Past
    ``max_bulk_partials`` the request is refused (413); those before it are stored."""
    with DaemonProcess([tmp_path / "a"], "--max-bulk-partials", "1000",
                       log_path=tmp_path / "daemon.log") as daemon:
        before = _hwm_kib(daemon.pid)
        status, answer = _post_bulk(daemon.url, "many", _many_partials(200_000))
        assert status == 413 and answer["code"] == "too_large", answer
        assert "max_bulk_partials" in answer["error"]
        assert answer["complete"] is False and answer["stored"] == 1000, answer["stored"]
        assert (_hwm_kib(daemon.pid) - before) / 1024 < 32
        # up to the bound, a batch is taken as ever
        status, answer = _post_bulk(daemon.url, "many", _many_partials(1000, 5000))
        assert status == 200 and answer["stored"] == 1000


class _Stalled:
    """A bulk upload sent up to ``sent`` bytes of its body (all but its END frame by
    default), its connection left open: the daemon holds its partials until the rest comes
    (or ``upload_idle_timeout``)."""

    def __init__(self, url: str, sup: str, body: bytes, sent: int) -> None:
        host, port = host_port(url)
        self.sock = socket.create_connection((host, port), timeout=30)
        self.rest = body[sent:]
        self.headers: dict[str, str] = {}
        head = (f"POST {PREFIX}/tasks/{sup}/partials HTTP/1.1\r\nHost: {host}\r\n"
                "Content-Type: application/vnd.shuffled.partials\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        self.sock.sendall(head.encode() + body[:sent])

    def finish(self) -> tuple[int, dict]:
        """Send the rest of the body; the answer."""
        self.sock.sendall(self.rest)
        return self.answer()

    def answer(self) -> tuple[int, dict]:
        """The answer, read without sending the END frame (the socket's timeout bounds
        the wait for one that does not come)."""
        resp = http.client.HTTPResponse(self.sock)
        resp.begin()
        self.headers = dict(resp.headers)
        try:
            return resp.status, json.loads(resp.read())
        finally:
            resp.close()
            self.sock.close()


def _stalled(url: str, sup: str, count: int, start: int, sent: int | None = None) -> _Stalled:
    """``count`` partials sent but for their END frame (or only their first ``sent``
    bytes: an upload refused at its first frame need not fill the socket's buffers)."""
    whole = _many_partials(count, start)
    end = len(whole) - len(framing2.encode_end(count))
    return _Stalled(url, sup, whole, end if sent is None else sent)


def _held(daemon: DaemonProcess) -> float:
    _, _, text = http_get(f"{daemon.url}/metrics")
    return metric_value(text.decode(), "shuffled_bulk_held_partials") or 0.0


def test_partials_held_by_all_uploads_together_are_bounded(tmp_path: Path) -> None:
    """``max_bulk_partials`` bounds one upload, but ``max_concurrent_uploads`` (64) of them
    held 64 x 10,000 x ~1.5 KB, about 960 MB. Past ``max_held_partials`` held by every
    upload in flight, the upload that would hold one more is answered 503 with Retry-After,
    ``complete: false`` and what it stored; sent again once the others have answered, it
    is taken."""
    with DaemonProcess([tmp_path / "a"], "--max-bulk-partials", "1000",
                       "--max-held-partials", "1500",
                       log_path=tmp_path / "daemon.log") as daemon:
        first = _stalled(daemon.url, "many", 1000, 0)
        wait_for(lambda: _held(daemon) == 1000, "the first upload's partials held")
        status, answer = _post_bulk(daemon.url, "many", _many_partials(1000, 10_000))
        assert status == 503 and answer["code"] == "overloaded", answer
        assert "max_held_partials" in answer["error"]
        assert answer["complete"] is False and answer["stored"] == 500, answer["stored"]
        assert _held(daemon) == 1000  # the refused upload gave its share back
        status, answer = first.finish()
        assert status == 200 and answer["stored"] == 1000, answer
        assert _held(daemon) == 0
        status, answer = _post_bulk(daemon.url, "many", _many_partials(1000, 10_000))
        assert status == 200 and answer["stored"] == 1000


def test_stalled_uploads_hold_no_more_than_the_bound(tmp_path: Path) -> None:
    """One upload of 10,000 tiny partials stalled before its END holds the bound (10,000
    in all); five more uploads of 10,000 are answered 503 at their first frame, without
    their END (their first 64 KiB sent). The daemon's peak RSS grows by what 10,000 take,
    not 60,000 (+84 MiB with all six held under a bound of 100,000)."""
    with DaemonProcess([tmp_path / "a"], "--max-held-partials", "10000",
                       log_path=tmp_path / "daemon.log") as daemon:
        before = _hwm_kib(daemon.pid)
        first = _stalled(daemon.url, "many", 10_000, 0)
        wait_for(lambda: _held(daemon) == 10_000, "the first upload's partials held")
        later = [_stalled(daemon.url, "many", 10_000, 10_000 * n, sent=64 << 10)
                 for n in range(1, 6)]
        answers = [s.answer() for s in later]  # answered without their END
        assert [(st, a["code"], a["stored"]) for st, a in answers] == [
            (503, "overloaded", 0)] * 5, answers
        assert all(s.headers["Retry-After"] == "1" for s in later)
        grown = (_hwm_kib(daemon.pid) - before) / 1024
        assert grown < 40, f"peak RSS grew {grown:.1f} MiB"
        status, answer = first.finish()
        assert status == 200 and answer["stored"] == 10_000

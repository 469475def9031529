"""Faults against a real daemon: SIGKILL mid-upload, a dropped download, a corrupted byte on
disk, SIGTERM with a download in flight, and overload with a client that backs off.

(Read-only and full locations are in ``tests/storage/test_disk_faults.py``.)
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.crc import crc32c
from shuffled.errors import CorruptData, DigestMismatch
from shuffled.protocol import Interval, PartialKey, PartitionKey, format_crc32c
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.spark.phase2.fetch import fetch_batch
from shuffled.spark.phase2.merge import Assignment, Phase2Config
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, files_under, pack_ends, pack_files, sample_table,
    stored_stream,
)
from tests.helpers.cutting_proxy import CuttingProxy
from tests.helpers.procs import DaemonProcess, host_port, http_get, metric_value, wait_for

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"


def key(sub: str, sup: str = "sup", pid: int = 0) -> PartialKey:
    return PartialKey(sup, sub, INTERVAL, pid)


def raw_put_head(host: str, port: int, sup: str, sub: str, body: bytes) -> socket.socket:
    """Open a PUT of ``body`` and send its headers only; the caller sends the body."""
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(
        f"PUT {PREFIX}/tasks/{sup}/{sub}/partition?{QUERY} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Length: {len(body)}\r\nContent-Digest: {format_crc32c(crc32c(body))}\r\n"
        f"Content-Type: application/vnd.apache.arrow.stream\r\n\r\n".encode())
    return sock


def in_flight(url: str) -> dict[str, int]:
    status, _, body = http_get(f"{url}/status")
    return json.loads(body)["inFlight"] if status == 200 else {}


# --- SIGKILL during uploads --------------------------------------------------------------


def test_sigkill_mid_upload_leaves_no_partial_no_temp_and_completed_intact(tmp_path: Path
                                                                          ) -> None:
    locs = [tmp_path / "a", tmp_path / "b"]
    completed: dict[PartialKey, bytes] = {}
    sent: dict[PartialKey, list[bytes]] = {}  # every body sent for a racing key, in order
    acked: dict[PartialKey, int] = {}  # index in sent[k] of the last one answered 2xx
    stalled = [f"stalled{i}" for i in range(4)]
    socks: list[socket.socket] = []
    daemon = DaemonProcess(locs, "--shutdown-timeout", "5", log_path=tmp_path / "d1.log")
    url = daemon.start()
    host, port = host_port(url)
    try:
        with ShuffleClient(url) as client:
            for i in range(6):
                body = arrow_bytes(sample_table(500 + 100 * i, seed=i))
                client.put_partial(key(f"done{i}"), body)
                completed[key(f"done{i}")] = body
        # Uploads stuck mid-body (most of each body sent, the rest never comes).
        big = arrow_bytes(sample_table(60_000, seed=9))
        for sub in stalled:
            sock = raw_put_head(host, port, "sup", sub, big)
            sock.sendall(big[: len(big) - 1000])  # past the first 1 MiB write
            socks.append(sock)
        wait_for(lambda: in_flight(url).get("uploads") == len(stalled), "stalled uploads")
        # Writers racing the kill: whatever got an answer must survive intact.
        stop = threading.Event()

        def writer(w: int) -> None:
            with ShuffleClient(url, retry=RetryPolicy(attempts=1)) as c:
                for n in range(1000):
                    if stop.is_set():
                        return
                    k = key(f"race{w}-{n % 5}")
                    body = arrow_bytes(sample_table(200 + n % 300, seed=w * 1000 + n))
                    sent.setdefault(k, []).append(body)
                    try:
                        c.put_partial(k, body)
                    except Exception:
                        return  # the daemon is gone
                    acked[k] = len(sent[k]) - 1

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        wait_for(lambda: len(acked) >= 8, "racing writers to commit something")
        # Bytes past each pack's last committed partial (sizes first: a commit landing in
        # between only makes a tail look shorter).
        sizes = [(loc, p, p.stat().st_size) for loc in locs for p in pack_files(loc, "sup")]
        ends = {loc: pack_ends(loc) for loc in locs}
        tails_before = [size - ends[loc].get(int(p.stem), 0) for loc, p, size in sizes]
        daemon.kill()
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
    finally:
        for sock in socks:
            sock.close()
        daemon.kill()
    assert len(big) > 1 << 20  # streamed to a pack as it arrives, not gathered in memory
    # The stalled uploads had reached the disk: each its own pack, with (at least) its first
    # 1 MiB past that pack's committed end.
    assert len([t for t in tails_before if t >= 1 << 20]) >= len(stalled), tails_before

    restarted = DaemonProcess(locs, log_path=tmp_path / "d2.log")
    with restarted, ShuffleClient(restarted.url) as client:
        for k, body in completed.items():
            assert client.get_partial(k) == body  # digest-checked by the client too
        listing = client.task("sup")
        assert listing is not None
        subs = {s["subTaskId"]: s for p in listing["partitions"] for s in p["subTasks"]}
        for k, body in completed.items():
            assert subs[k.sub_task_id]["crc32c"] == f"{crc32c(body):08x}"
            assert subs[k.sub_task_id]["bytes"] == len(body)
        assert not any(s in subs for s in stalled)
        for sub in stalled:
            assert http_get(f"{restarted.url}{PREFIX}/tasks/sup/{sub}/partition?{QUERY}")[0] == 404
        for k, bodies in sent.items():
            stored = subs.get(k.sub_task_id)
            if k in acked:  # answered: the last answered body, or a later one that committed
                assert stored is not None, k
                assert client.get_partial(k) in bodies[acked[k]:], k
            elif stored is not None:  # never answered: absent, or one whole body sent
                assert client.get_partial(k) in bodies, k
        assert client.get_partition(PartitionKey("sup", INTERVAL, 0))  # aggregate reads it all
    for loc in locs:
        assert list((loc / ".tmp").iterdir()) == []
        names = {p.suffix for p in files_under(loc)}
        assert names <= {".pack"}, files_under(loc)
        # No pack holds bytes past its last committed partial, and none holds nothing: the
        # stalled bodies and any upload the kill cut are gone.
        assert {int(p.stem): p.stat().st_size for p in pack_files(loc, "sup")} == pack_ends(loc)


# --- a reader's connection drops mid-download ---------------------------------------------


@pytest.fixture
def proxied_daemon(tmp_path: Path) -> Iterator[tuple[str, CuttingProxy]]:
    with EmbeddedDaemon([tmp_path / "a", tmp_path / "b"], free_space_reserve=0) as url:
        proxy = CuttingProxy(host_port(url), cut=1_500_000)
        try:
            yield url, proxy
        finally:
            proxy.close()


@pytest.mark.parametrize("streamed", [False, True], ids=["get_partial", "get_partial_to"])
def test_dropped_download_resumes_with_range_and_matches_the_digest(
        proxied_daemon: tuple[str, CuttingProxy], tmp_path: Path, streamed: bool) -> None:
    url, proxy = proxied_daemon
    body = arrow_bytes(sample_table(250_000, seed=3))
    assert len(body) > 3 * proxy.cut
    with ShuffleClient(url) as direct:
        direct.put_partial(key("big"), body)
    with ShuffleClient(f"http://127.0.0.1:{proxy.port}",
                       retry=RetryPolicy(attempts=3, backoff=0.01)) as client:
        if streamed:
            out_path = tmp_path / "out.arrow"
            with open(out_path, "wb") as out:
                assert client.get_partial_to(key("big"), out) == len(body)
            got = out_path.read_bytes()
        else:
            got = client.get_partial(key("big"))
    assert crc32c(got) == crc32c(body) and got == body
    assert len(proxy.heads) == 2, proxy.heads  # one cut connection, one resume
    first, second = (h.decode("latin-1").lower() for h in proxy.heads)
    assert "range:" not in first
    resumed_at = int(second.split("range: bytes=", 1)[1].split("-", 1)[0])
    assert 0 < resumed_at < proxy.cut  # resumed where the cut left it, not from byte 0
    assert "if-range: \"" in second
    assert proxy.status_lines[0].startswith(b"HTTP/1.1 200")
    assert proxy.status_lines[1].startswith(b"HTTP/1.1 206")


# --- a corrupted byte in a stored file ----------------------------------------------------


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:  # in place: the daemon holds the pack open
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x5A]))


def stored_at(root: Path, k: PartialKey) -> tuple[Path, int]:
    """The pack holding ``k`` and the partial's offset in it, from the catalog."""
    found = [(loc, r) for loc in root.iterdir() if loc.is_dir()
             for r in catalog_rows(loc, k.supervisor_task_id) if r[0] == k.sub_task_id]
    ((loc, row),) = found
    return loc / k.supervisor_task_id / f"{row[5]}.pack", row[6]


def test_corrupted_byte_is_detected_and_names_the_partial(tmp_path: Path) -> None:
    locs = [tmp_path / "a", tmp_path / "b"]
    bodies = {sub: arrow_bytes(sample_table(3000, seed=i)) for i, sub in
              enumerate(["s1", "s2", "s3"])}
    odd_schema = arrow_bytes(sample_table(50).append_column("extra", pa.array([1.5] * 50)))
    partition = PartitionKey("sup", INTERVAL, 0)
    with EmbeddedDaemon(locs, free_space_reserve=0) as url, ShuffleClient(url) as client:
        for sub, body in bodies.items():
            client.put_partial(key(sub), body)
        whole = client.get_partition(partition, ["s1", "s2", "s3"])
        victim, offset = stored_at(tmp_path, key("s2"))
        flip_byte(victim, offset + len(bodies["s2"]) // 2)  # a value buffer: still parses

        with pytest.raises(DigestMismatch) as info:
            client.get_partial(key("s2"))
        assert str(key("s2")) in str(info.value)
        assert client.get_partial(key("s1")) == bodies["s1"]

        # Aggregate fast path: the combined digest fails, the client names the culprit.
        for subs in (["s1", "s2", "s3"], None):
            with pytest.raises(DigestMismatch) as info:
                client.get_partition(partition, subs)
            assert info.value.details["key"] == str(key("s2"))
            assert "sup/s2" in str(info.value) and "partition 0" in str(info.value)
        with open(tmp_path / "out", "wb") as out, pytest.raises(DigestMismatch) as info:
            client.get_partition_to(partition, out, ["s2", "s3"])
        assert info.value.details["key"] == str(key("s2"))
        assert client.get_partition(partition, ["s1", "s3"])  # the healthy ones still read

        # Slow path (schemas differ, re-encoded, no digest to send): the daemon verifies.
        client.put_partial(key("odd"), odd_schema)
        started = time.monotonic()
        with pytest.raises(CorruptData) as corrupt:
            client.get_partition(partition, ["odd", "s2"])
        assert corrupt.value.details["key"] == str(key("s2")) and "corrupt" in str(corrupt.value)
        assert time.monotonic() - started < 5  # not retried: the same damage would come back

        # Phase 2's read path refuses it: nothing wrong reaches a segment.
        cfg = Phase2Config("sup", layout=None, segment_dir=str(tmp_path))  # type: ignore[arg-type]
        assignment = Assignment(INTERVAL.start, INTERVAL.end, 0,
                                (((url,), ("s1", "s2", "s3"), 9000),))
        with pytest.raises(DigestMismatch, match="sup/s2"):
            fetch_batch({url: client}, cfg, [assignment])

        # Re-running the subtask (a replace) heals it.
        client.put_partial(key("s2"), bodies["s2"])
        assert client.get_partition(partition, ["s1", "s2", "s3"]) == whole


# --- SIGTERM with a download and an upload in flight ---------------------------------------


def read_response(sock: socket.socket, data: bytes = b"", limit: float = 30.0
                  ) -> tuple[bytes, bytes]:
    """Read one HTTP/1.1 response with Content-Length from ``sock`` (``data``: what was
    already received of it): (head, body)."""
    deadline = time.monotonic() + limit
    while b"\r\n\r\n" not in data:
        assert time.monotonic() < deadline, "no response head in time"
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    parts = [body]
    got = len(body)
    while got < length:
        assert time.monotonic() < deadline, f"body incomplete: {got} of {length}"
        chunk = sock.recv(1 << 20)
        assert chunk, f"connection closed after {got} of {length} body bytes"
        parts.append(chunk)
        got += len(chunk)
    return head, b"".join(parts)


def test_sigterm_lets_a_download_and_an_upload_finish_refuses_new_exits_0(tmp_path: Path
                                                                          ) -> None:
    big = arrow_bytes(sample_table(2_000_000, seed=5))  # far more than the socket buffers
    up = arrow_bytes(sample_table(5000, seed=6))
    daemon = DaemonProcess([tmp_path / "a", tmp_path / "b"], "--shutdown-timeout", "30",
                           log_path=tmp_path / "d.log")
    url = daemon.start()
    host, port = host_port(url)
    try:
        with ShuffleClient(url) as client:
            client.put_partial(key("big"), big)
        down = socket.create_connection((host, port), timeout=30)
        down.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        down.sendall(f"GET {PREFIX}/tasks/sup/big/partition?{QUERY} HTTP/1.1\r\n"
                     f"Host: {host}\r\n\r\n".encode())
        first = down.recv(4096)  # the response started; the reader then stops reading
        assert first.startswith(b"HTTP/1.1 200")
        upload = raw_put_head(host, port, "sup", "late", up)
        upload.sendall(up[:1000])
        wait_for(lambda: in_flight(url) == {"uploads": 1, "downloads": 1}, "both in flight")
        daemon.proc.send_signal(15)  # type: ignore[union-attr]

        def refused() -> bool:
            code, headers, _ = http_get(f"{url}{PREFIX}/tasks")
            return code == 503 and headers.get("Retry-After", "").isdigit()

        wait_for(refused, "503 + Retry-After for new requests while draining")
        code, headers, _ = http_get(f"{url}{PREFIX}/tasks/sup/big/partition?{QUERY}")
        assert code == 503 and headers["Retry-After"].isdigit()
        upload.sendall(up[1000:])
        head, _ = read_response(upload)
        assert head.startswith(b"HTTP/1.1 201"), head
        head, body = read_response(down, first)
        assert len(body) == len(big) and crc32c(body) == crc32c(big)
        assert daemon.proc.wait(timeout=40) == 0  # type: ignore[union-attr]
    finally:
        daemon.kill()
        for sock in (locals().get("down"), locals().get("upload")):
            if sock is not None:
                sock.close()
    rows = [(loc, r) for loc in daemon.locations for r in catalog_rows(loc, "sup")
            if r[0] == "late"]
    assert len(rows) == 1  # committed before the exit: in the catalog, bytes in its pack
    loc, row = rows[0]
    assert row[7] == len(up)
    assert stored_stream(loc, "sup", row) == up
    assert not [p for loc in daemon.locations for p in (loc / ".tmp").iterdir()]


# --- overload: 503 + Retry-After, and the client backs off and succeeds ---------------------


def test_overloaded_daemon_answers_503_and_the_client_backs_off_and_succeeds(tmp_path: Path
                                                                              ) -> None:
    body = arrow_bytes(sample_table(4000, seed=8))
    with EmbeddedDaemon([tmp_path / "a", tmp_path / "b"], free_space_reserve=0,
                        max_concurrent_uploads=1) as url:
        host, port = host_port(url)
        holder = raw_put_head(host, port, "sup", "holder", body)
        try:
            holder.sendall(body[:100])
            wait_for(lambda: in_flight(url).get("uploads") == 1, "the slot to be taken")
            outcome: dict[str, object] = {}

            def put() -> None:
                policy = RetryPolicy(attempts=20, backoff=0.05, max_backoff=0.5, deadline=60)
                try:
                    with ShuffleClient(url, retry=policy) as client:
                        outcome["result"] = client.put_partial(key("patient"), body)
                except Exception as exc:  # reported below
                    outcome["error"] = exc

            thread = threading.Thread(target=put)
            thread.start()

            def refusals() -> float:
                text = http_get(f"{url}/metrics")[2].decode()
                return metric_value(text, "shuffled_rejected_requests_total",
                                    reason="overloaded") or 0.0

            wait_for(lambda: refusals() >= 1, "the client to be refused with 503")
            assert "result" not in outcome and thread.is_alive()  # it backs off, not fails
            holder.sendall(body[100:])
            head, _ = read_response(holder)
            assert head.startswith(b"HTTP/1.1 201"), head
            thread.join(timeout=30)
            assert not thread.is_alive() and "error" not in outcome, outcome
            assert outcome["result"]["bytes"] == len(body)  # type: ignore[index]
            with ShuffleClient(url) as client:
                assert client.get_partial(key("patient")) == body
        finally:
            holder.close()

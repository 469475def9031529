"""Bulk upload (POST /tasks/{sup}/partials) against real daemons on loopback.

Every partial of a batch is all-or-nothing on its own; a batch cut anywhere (at each frame
boundary, inside a fixed part, a header or a body) never reads as complete, and what it
leaves is whole partials or nothing, with no stray bytes in the packs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from shuffled import framing
from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch, InvalidBody
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server import make_app
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import DAY, PREFIX, arrow_bytes, files_under, pack_files, sample_table

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
MEDIA = {"Content-Type": framing.MEDIA_TYPE}


def key(sub: str, sup: str = "sup", pid: int = 0, day: int = 0) -> PartialKey:
    return PartialKey(sup, sub, Interval(INTERVAL.start + day * 86_400_000,
                                         INTERVAL.end + day * 86_400_000), pid)


def batch(items: list[tuple[PartialKey, bytes]], *, end: bool = True) -> tuple[bytes, list[int]]:
    """The body of a bulk batch and the offsets where each frame starts (and the END)."""
    out, starts, at = [], [], 0
    for k, body in items:
        frame = framing.encode(k, len(body), crc32c(body)) + body
        starts.append(at)
        out.append(frame)
        at += len(frame)
    starts.append(at)
    if end:
        out.append(framing.encode_end(len(items)))
    return b"".join(out), starts


def partials(sup: str, n: int = 6) -> list[tuple[PartialKey, bytes]]:
    return [(key(f"s{i % 3}", sup, pid=i % 2, day=i // 3), arrow_bytes(sample_table(20 + i, i)))
            for i in range(n)]


async def post(daemon: TestClient, sup: str, body: bytes, **headers: str) -> tuple[int, Any]:
    resp = await daemon.post(f"{PREFIX}/tasks/{sup}/partials", data=body,
                             headers={**MEDIA, **headers})
    return resp.status, await resp.json()


async def get(daemon: TestClient, k: PartialKey) -> tuple[int, bytes]:
    resp = await daemon.get(f"{PREFIX}/tasks/{k.supervisor_task_id}/{k.sub_task_id}/partition",
                            params={"start": k.interval.start_iso, "end": k.interval.end_iso,
                                    "partitionId": str(k.partition_id)})
    return resp.status, await resp.read()


async def test_a_batch_stores_every_partial_readable_alone_and_together(daemon: TestClient,
                                                                         settings) -> None:
    items = partials("sup", 12)
    status, answer = await post(daemon, "sup", batch(items)[0])
    assert status == 200, answer
    assert answer["complete"] and answer["count"] == answer["stored"] == 12
    assert [(p["subTaskId"], p["partitionId"], p["status"]) for p in answer["partials"]] == [
        (k.sub_task_id, k.partition_id, "created") for k, _ in items]
    for (k, body), item in zip(items, answer["partials"]):
        assert item["crc32c"] == f"{crc32c(body):08x}" and item["bytes"] == len(body)
        assert await get(daemon, k) == (200, body)
    resp = await daemon.get(f"{PREFIX}/tasks/sup/partition",
                            params={**DAY, "partitionId": "0"})
    assert resp.status == 200 and int(resp.headers["X-Shuffled-Partials"]) == 2
    on_disk = [p for loc in settings.locations for p in files_under(loc.path)]
    assert all(p.suffix == ".pack" for p in on_disk)
    assert sum(p.stat().st_size for p in on_disk) == sum(len(b) for _, b in items)


def _cuts(body: bytes, starts: list[int]) -> list[int]:
    """Every frame boundary, and points inside each fixed part, header and body."""
    cuts = set(starts)
    for at in starts[:-1]:
        header_len = struct.unpack_from("<I", body, at + 8)[0]
        cuts |= {at + 1, at + 12, at + framing.FIXED_LEN - 1, at + framing.FIXED_LEN + 1,
                 at + framing.FIXED_LEN + header_len + 1,
                 at + framing.FIXED_LEN + header_len + 100}
    cuts |= {len(body) - 1, len(body) - framing.FIXED_LEN}  # inside the END frame
    return sorted(c for c in cuts if 0 < c < len(body))


async def test_a_batch_cut_anywhere_is_never_complete_and_leaves_whole_partials_or_none(
        daemon: TestClient, settings) -> None:
    items = partials("x", 4)
    body, starts = batch(items)
    cuts = _cuts(body, starts)
    assert len(cuts) > 20
    for n, cut in enumerate(cuts):
        sup = f"cut{n}"
        items = partials(sup, 4)
        body, starts = batch(items)
        status, answer = await post(daemon, sup, body[:cut])
        assert status == 400 and answer["complete"] is False, (cut, answer)
        assert answer["code"] == "bad_framing"
        whole = sum(1 for s in starts[1:] if s <= cut)  # frames entirely before the cut
        stored = 0
        for i, (k, b) in enumerate(items):
            code, data = await get(daemon, k)
            if code == 200:
                assert data == b and i < whole, (cut, i)  # a whole partial, fully sent
                stored += 1
            else:
                assert code == 404, (cut, i, code)
        packs = [p for loc in settings.locations for p in pack_files(loc.path, sup)]
        assert sum(p.stat().st_size for p in packs) == sum(len(b) for _, b in items[:stored])


def test_a_connection_dropped_mid_batch_stores_nothing_partial(tmp_path: Path) -> None:
    items = partials("drop", 4)
    body, starts = batch(items)
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        cut = starts[2] + 50  # inside the third frame
        sock = socket.create_connection((host, int(port)), timeout=30)
        try:
            sock.sendall(f"POST {PREFIX}/tasks/drop/partials HTTP/1.1\r\nHost: x\r\n"
                         f"Content-Type: {framing.MEDIA_TYPE}\r\nContent-Length: {len(body)}"
                         f"\r\n\r\n".encode() + body[:cut])
        finally:
            sock.close()
        with ShuffleClient(url) as client:
            deadline = time.monotonic() + 20
            while client.status()["inFlight"]["uploads"] and time.monotonic() < deadline:
                time.sleep(0.01)  # poll interval of a bounded wait for the daemon to notice
            held = client.task("drop")
            subs = ({(s["subTaskId"], p["partitionId"], p["start"]) for p in held["partitions"]
                     for s in p["subTasks"]} if held else set())
            for k, b in items[2:]:
                assert (k.sub_task_id, k.partition_id, k.interval.start_iso) not in subs
            for k, b in items[:2]:
                if (k.sub_task_id, k.partition_id, k.interval.start_iso) in subs:
                    assert client.get_partial(k) == b
        assert sum(p.stat().st_size for p in pack_files(tmp_path / "a", "drop")) == sum(
            len(b) for k, b in items[:2]
            if (k.sub_task_id, k.partition_id, k.interval.start_iso) in subs)


async def test_a_bad_partial_is_rejected_alone(daemon: TestClient) -> None:
    items = partials("bad", 5)
    good = arrow_bytes(sample_table(30))
    frames = []
    for i, (k, body) in enumerate(items):
        if i == 1:  # declared CRC does not match
            frames.append(framing.encode(k, len(body), crc32c(body) ^ 1) + body)
        elif i == 3:  # not an Arrow stream
            junk = b"\x00" * len(good)
            frames.append(framing.encode(k, len(junk), crc32c(junk)) + junk)
        else:
            frames.append(framing.encode(k, len(body), crc32c(body)) + body)
    status, answer = await post(daemon, "bad", b"".join(frames) + framing.encode_end(5))
    assert status == 200 and answer["complete"] and answer["stored"] == 3
    codes = [p.get("error", {}).get("code") for p in answer["partials"]]
    assert codes == [None, "digest_mismatch", None, "invalid_body", None]
    assert [p["status"] for p in answer["partials"]] == [
        "created", "rejected", "created", "rejected", "created"]
    for i, (k, body) in enumerate(items):
        assert (await get(daemon, k))[0] == (404 if i in (1, 3) else 200)


@pytest.mark.parametrize("mangle, mentions", [
    (lambda b: b[:20] + bytes([b[20] ^ 1]) + b[21:], "CRC32C"),  # header CRC
    (lambda b: b"SHB2" + b[4:], "version"),
    (lambda b: b"XXXX" + b[4:], "does not start"),
    (lambda b: b[:-len(framing.encode_end(2))] + framing.encode_end(3), "END frame says"),
    (lambda b: b + b"more", "follow the END"),
    (lambda b: b[:-len(framing.encode_end(2))], "cut"),
])
async def test_framing_errors_stop_the_batch(daemon: TestClient, mangle: Any,
                                             mentions: str) -> None:
    body, _ = batch(partials("frm", 2))
    status, answer = await post(daemon, "frm", mangle(body))
    assert status == 400 and answer["complete"] is False and answer["code"] == "bad_framing"
    assert mentions.lower() in answer["error"].lower(), answer


async def test_wrong_content_type_and_bad_ids_are_refused(daemon: TestClient) -> None:
    body, _ = batch(partials("ct", 1))
    resp = await daemon.post(f"{PREFIX}/tasks/ct/partials", data=body,
                             headers={"Content-Type": "application/octet-stream"})
    assert resp.status == 400 and framing.MEDIA_TYPE in (await resp.json())["error"]
    bad = framing.encode(key("ok", "ct"), 10, 0).replace(b'"ok"', b'"/.."')
    fixed = framing.FIXED.pack(framing.MAGIC, 0, b"\0\0\0", len(bad) - 24, 10)
    header = bad[24:]
    frame = fixed + crc32c(header, crc32c(fixed)).to_bytes(4, "little") + header + b"x" * 10
    status, answer = await post(daemon, "ct", frame + framing.encode_end(1))
    assert status == 400 and answer["code"] == "bad_framing" and "subTaskId" in answer["error"]


async def test_bulk_replaces_a_key_stored_by_put(daemon: TestClient) -> None:
    k = key("s", "rep")
    first, second = arrow_bytes(sample_table(5)), arrow_bytes(sample_table(9, seed=2))
    resp = await daemon.put(f"{PREFIX}/tasks/rep/s/partition", params={**DAY, "partitionId": "0"},
                            data=first)
    assert resp.status == 201
    status, answer = await post(daemon, "rep", batch([(k, second)])[0])
    assert status == 200 and answer["partials"][0]["status"] == "replaced"
    assert await get(daemon, k) == (200, second)


def test_client_round_trip_streams_while_the_caller_produces(tmp_path: Path) -> None:
    bodies = [arrow_bytes(sample_table(30_000, seed=i)) for i in range(12)]  # ~0.5 MiB each
    seen_stored_while_producing: list[int] = []
    with EmbeddedDaemon([tmp_path / "a", tmp_path / "b"], free_space_reserve=0) as url:
        with ShuffleClient(url) as client, ShuffleClient(url) as watcher:
            def produce() -> Iterator[tuple[PartialKey, bytes]]:
                for i, body in enumerate(bodies):
                    if i == 8:
                        # Earlier partials are on the daemon while this one is not even made.
                        deadline = time.monotonic() + 20
                        while time.monotonic() < deadline:
                            held = watcher.task("lazy")
                            if held and held["files"]:
                                seen_stored_while_producing.append(held["files"])
                                break
                            time.sleep(0.01)  # poll interval of a bounded wait
                    yield key(f"s{i}", "lazy"), body

            answers = client.put_partials("lazy", produce())
            assert [a["status"] for a in answers] == ["created"] * 12
            assert seen_stored_while_producing, "nothing stored before the batch ended"
            for i, body in enumerate(bodies):
                assert client.get_partial(key(f"s{i}", "lazy")) == body
            with pytest.raises(ValueError):
                client.put_partials("lazy", [(key("s", "other"), bodies[0])])
            assert client.put_partials("lazy", []) == []
            bad = bytearray(bodies[0])
            bad[-1] ^= 1  # breaks the end-of-stream marker: not an Arrow stream
            with pytest.raises(InvalidBody):
                client.put_partials("lazy", [(key("bad", "lazy"), bytes(bad))])


def test_client_resends_a_batch_whose_answer_was_cut(tmp_path: Path) -> None:
    from tests.test_faults import CuttingProxy

    items = partials("resend", 5)
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        proxy = CuttingProxy((host, int(port)), cut=400)  # inside the JSON answer
        try:
            with ShuffleClient(f"http://127.0.0.1:{proxy.port}") as client:
                answers = client.put_partials("resend", items)
                assert [a["status"] for a in answers] == ["replaced"] * 5  # the second try
                assert proxy.status_lines[0].startswith(b"HTTP/1.1 200")  # answered, then cut
                for k, body in items:
                    assert client.get_partial(k) == body
        finally:
            proxy.close()
        assert sum(p.stat().st_size for p in pack_files(tmp_path / "a", "resend")) == 2 * sum(
            len(b) for _, b in items)  # the first try's bytes stay until the task goes


async def test_client_falls_back_to_puts_on_an_older_daemon(settings) -> None:
    @web.middleware
    async def no_bulk_route(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":  # what a daemon before bulk upload answers
            raise web.HTTPNotFound(text=json.dumps({"error": "no route", "code": "not_found"}),
                                   content_type="application/json")
        return await handler(request)

    app = make_app(settings, registry=CollectorRegistry())
    app.middlewares.insert(0, no_bulk_route)
    daemon = TestClient(TestServer(app, host="127.0.0.1"))
    await daemon.start_server()
    url = str(daemon.make_url("")).rstrip("/")
    items = partials("old", 3)

    def run() -> list[dict[str, Any]]:
        with ShuffleClient(url) as client:
            return client.put_partials("old", items)

    answers: list[list[dict[str, Any]]] = []
    thread = threading.Thread(target=lambda: answers.append(run()))
    thread.start()
    deadline = time.monotonic() + 60
    while thread.is_alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # let the daemon on this loop serve the client thread
    thread.join(timeout=30)
    assert answers and [a["bytes"] for a in answers[0]] == [len(b) for _, b in items]
    for k, body in items:
        assert await get(daemon, k) == (200, body)
    await daemon.close()


def test_digest_reported_back_is_checked() -> None:
    from shuffled.client.bulk import check_stored

    body = memoryview(b"abc")
    with pytest.raises(DigestMismatch):
        check_stored((key("s"), body, crc32c(body)), {"crc32c": "00000000", "bytes": 3})
    with pytest.raises(DigestMismatch):
        check_stored((key("s"), body, crc32c(body)), {"crc32c": f"{crc32c(body):08x}",
                                                      "bytes": 4})
    check_stored((key("s"), body, crc32c(body)), {"crc32c": f"{crc32c(body):08x}", "bytes": 3})
    assert PartitionKey  # re-exported names used above stay importable

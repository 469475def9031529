"""Bulk upload (POST /tasks/{sup}/partials) against real daemons on loopback.

Every partial of a batch is all-or-nothing on its own; a batch cut anywhere (at each frame
boundary, inside a fixed part, a header or a body) never reads as complete, and what it
leaves is whole partials or nothing, with no stray bytes in the packs.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from shuffled import framing
from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.protocol import PartialKey
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.server.state import STATE
from shuffled.storage.write.upload import SMALL
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, committed_bytes, data_size, files_under, pack_files,
    sample_table,
)
from tests.helpers.bulk import MEDIA, get, key, partials, post
from tests.helpers.procs import host_port


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
    # Packs hold the committed partials' bytes and nothing else (format 3: schema messages
    # once per pack, bodies, no end markers).
    assert sum(data_size(p) for p in on_disk) == sum(
        committed_bytes(loc.path, "sup") for loc in settings.locations) < sum(
        len(b) for _, b in items)


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
        assert sum(data_size(p) for p in packs) == sum(
            committed_bytes(loc.path, sup) for loc in settings.locations)


def test_a_connection_dropped_mid_batch_stores_nothing_partial(tmp_path: Path) -> None:
    items = partials("drop", 4)
    body, starts = batch(items)
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as url:
        host, port = host_port(url)
        cut = starts[2] + 50  # inside the third frame
        sock = socket.create_connection((host, port), timeout=30)
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
        assert sum(data_size(p) for p in pack_files(tmp_path / "a", "drop")) == (
            committed_bytes(tmp_path / "a", "drop"))


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
    (lambda b: b"SHB3" + b[4:], "version"),
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


# --- large bodies, refusals that skip a body, stalls, slots ----------------------------------

def big(seed: int) -> bytes:
    body = arrow_bytes(sample_table(90_000, seed=seed))
    assert len(body) > SMALL  # streamed to the store in chunks, not read whole
    return body


async def test_large_bodies_stream_and_a_refused_one_is_skipped(daemon: TestClient,
                                                                settings) -> None:
    small = arrow_bytes(sample_table(10))
    good, damaged, after = key("a", "big"), key("b", "big"), key("c", "big")
    ok_body, bad_body = big(1), big(2)
    body = (framing.encode(good, len(ok_body), crc32c(ok_body)) + ok_body
            + framing.encode(damaged, len(bad_body), crc32c(bad_body) ^ 1) + bad_body
            + framing.encode(after, len(small), crc32c(small)) + small + framing.encode_end(3))
    status, answer = await post(daemon, "big", body)
    assert status == 200 and [p["status"] for p in answer["partials"]] == [
        "created", "rejected", "created"], answer
    assert answer["partials"][1]["error"]["code"] == "digest_mismatch"
    assert await get(daemon, good) == (200, ok_body)
    assert (await get(daemon, damaged))[0] == 404
    assert await get(daemon, after) == (200, small)
    packs = [p for loc in settings.locations for p in pack_files(loc.path, "big")]
    assert sum(data_size(p) for p in packs) == sum(
        committed_bytes(loc.path, "big") for loc in settings.locations) < len(ok_body) + len(small)


async def test_a_batch_cut_inside_a_large_body_keeps_nothing_of_it(daemon: TestClient,
                                                                   settings) -> None:
    small, large = arrow_bytes(sample_table(10)), big(3)
    body = (framing.encode(key("a", "bigcut"), len(small), crc32c(small)) + small
            + framing.encode(key("b", "bigcut"), len(large), crc32c(large)) + large
            + framing.encode_end(2))
    status, answer = await post(daemon, "bigcut", body[: len(body) - len(large) // 2])
    assert status == 400 and answer["complete"] is False and answer["code"] == "bad_framing"
    assert (await get(daemon, key("b", "bigcut")))[0] == 404
    assert await get(daemon, key("a", "bigcut")) == (200, small)
    packs = [p for loc in settings.locations for p in pack_files(loc.path, "bigcut")]
    assert sum(data_size(p) for p in packs) == len(small) - 8  # no end marker stored


async def test_too_large_partials_are_rejected_and_the_batch_goes_on(start_daemon,
                                                                     make_settings) -> None:
    daemon = await start_daemon(make_settings(max_partial_bytes=SMALL + 10))
    fits, over_small, over_big = arrow_bytes(sample_table(10)), big(4), big(5)
    items = [(key("a", "lim"), fits), (key("b", "lim"), over_small), (key("c", "lim"), fits),
             (key("d", "lim"), over_big), (key("e", "lim"), fits)]
    status, answer = await post(daemon, "lim", batch(items)[0])
    assert status == 200 and answer["stored"] == 3 and answer["rejected"] == 2, answer
    assert [p.get("error", {}).get("code") for p in answer["partials"]] == [
        None, "too_large", None, "too_large", None]


async def test_frames_split_into_tiny_chunks_are_read_whole(daemon: TestClient) -> None:
    items = partials("tiny", 3)
    body = batch(items)[0]

    async def pieces() -> AsyncIterator[bytes]:  # chunked, 7 bytes at a time
        for at in range(0, len(body), 7):
            yield body[at: at + 7]

    status, answer = await post(daemon, "tiny", pieces())  # type: ignore[arg-type]
    assert status == 200 and answer["stored"] == 3, answer
    for k, b in items:
        assert await get(daemon, k) == (200, b)


class RawPost:
    """A bulk POST written by hand on a socket, to hold a batch open between frames."""

    def __init__(self, daemon: TestClient, sup: str, length: int) -> None:
        self.daemon, self.sup, self.length = daemon, sup, length

    async def __aenter__(self) -> RawPost:
        port = self.daemon.server.port
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        self.writer.write(f"POST {PREFIX}/tasks/{self.sup}/partials HTTP/1.1\r\nHost: x\r\n"
                          f"Content-Type: {framing.MEDIA_TYPE}\r\n"
                          f"Content-Length: {self.length}\r\n\r\n".encode())
        return self

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, dict[str, Any]]:
        async with asyncio.timeout(20):
            head = await self.reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            return int(head.split()[1]), json.loads(await self.reader.readexactly(length))

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()


async def until(check: Any, what: str) -> None:
    """Wait (bounded) until ``await check()`` is true."""
    async with asyncio.timeout(20):
        while not await check():
            await asyncio.sleep(0.01)  # poll interval of a bounded wait, not a synchronisation


async def test_partials_commit_while_the_batch_is_still_open(daemon: TestClient) -> None:
    items = partials("open", 4)
    body, starts = batch(items)
    async with RawPost(daemon, "open", len(body)) as raw:
        await raw.send(body[: starts[2]])  # two small frames, then the client goes quiet

        async def both_stored() -> bool:
            return [(await get(daemon, k))[0] for k, _ in items[:2]] == [200, 200]

        await until(both_stored, "the first two partials stored before the batch ends")
        assert (await get(daemon, items[2][0]))[0] == 404
        await raw.send(body[starts[2]:])
        status, answer = await raw.answer()
    assert status == 200 and answer["stored"] == 4


async def test_a_stalled_batch_is_abandoned_with_408(start_daemon, make_settings) -> None:
    daemon = await start_daemon(make_settings(upload_idle_timeout=0.3))
    items = partials("stall", 3)
    body, starts = batch(items)
    async with RawPost(daemon, "stall", len(body)) as raw:
        await raw.send(body[: starts[1] + 30])
        status, answer = await raw.answer()
    assert status == 408 and answer["code"] == "request_timeout" and not answer["complete"]
    assert [p["status"] for p in answer["partials"]] == ["created"]
    assert await get(daemon, items[0][0]) == (200, items[0][1])
    assert daemon.app[STATE].uploads.active == 0  # the slot is free again


async def test_one_upload_slot_per_batch(start_daemon, make_settings) -> None:
    daemon = await start_daemon(make_settings(max_concurrent_uploads=1))
    body, starts = batch(partials("slot", 2))
    async with RawPost(daemon, "slot", len(body)) as raw:
        await raw.send(body[: starts[1]])

        async def taken() -> bool:
            return daemon.app[STATE].uploads.active == 1

        await until(taken, "the open batch holds the upload slot")
        resp = await daemon.post(f"{PREFIX}/tasks/slot2/partials", data=body, headers=MEDIA)
        assert resp.status == 503 and resp.headers["Retry-After"]
        await raw.send(body[starts[1]:])
        status, answer = await raw.answer()
    assert status == 200 and answer["stored"] == 2


# --- the answer as openapi.yaml documents it; metrics -----------------------------------------

BULK = f"{PREFIX}/tasks/{{supervisorTaskId}}/partials"


async def test_answers_match_openapi(start_daemon, make_settings) -> None:
    from tests.helpers.openapi_checker import Checker

    daemon = await start_daemon(make_settings(upload_idle_timeout=0.3))
    check = Checker(daemon)
    items = partials("doc", 3)
    body, starts = batch(items)
    bad = framing.encode(items[0][0], len(items[0][1]), 1) + items[0][1] + framing.encode_end(1)
    await check("POST", BULK, sup="doc", data=body, headers=MEDIA, expect=200)
    await check("POST", BULK, sup="doc", data=bad, headers=MEDIA, expect=200)
    _, cut = await check("POST", BULK, sup="doc", data=body[:-5], headers=MEDIA, expect=400)
    assert cut["count"] == 3 and cut["stored"] == 3
    _, ct = await check("POST", BULK, sup="doc", data=body, expect=400,
                        headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    assert ct["field"] == "Content-Type" and ct["partials"] == []
    _, bad_id = await check("POST", BULK, sup=".hidden", data=body, headers=MEDIA, expect=400)
    assert bad_id["code"] == "invalid_id" and bad_id["complete"] is False

    async def stalled() -> AsyncIterator[bytes]:
        yield body[: starts[1]]
        await asyncio.sleep(30)  # never reached in full: the daemon gives up after 0.3 s

    await check("POST", BULK, sup="doc", data=stalled(), headers=MEDIA, expect=408)


async def test_metrics_count_each_stored_partial(daemon: TestClient) -> None:
    async def received() -> tuple[float, float]:
        text = await (await daemon.get("/metrics")).text()
        values = [float(re.search(rf"^{name} (\S+)$", text, re.M)[1])  # type: ignore[index]
                  for name in ("shuffled_received_partials_total", "shuffled_received_bytes_total")]
        return values[0], values[1]

    before = await received()
    items = partials("met", 4)
    broken = [(k, b if i != 2 else b"junk") for i, (k, b) in enumerate(items)]
    status, answer = await post(daemon, "met", batch(broken)[0])
    assert status == 200 and answer["stored"] == 3
    after = await received()
    assert after[0] - before[0] == 3
    assert after[1] - before[1] == sum(len(b) for i, (_, b) in enumerate(items) if i != 2)

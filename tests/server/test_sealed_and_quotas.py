"""Sealed means sealed, failed takes nothing, per-task quotas, and the paged-read review's
open points (read again after a seal leaves out what a reader passed, draining answers
long polls at once, pages by sendfile)."""

from __future__ import annotations

import asyncio
import io
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from shuffled import framing
from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.server.state import STATE
from shuffled.server.waiters import WATCH
from tests.conftest import DAY, PREFIX, arrow_bytes, committed_bytes, metric, sample_table

PARAMS = {**DAY, "partitionId": "0"}
BULK = {"Content-Type": framing.MEDIA_TYPE}
INTERVAL = Interval.parse(DAY["start"], DAY["end"])


def bulk_body(items: list[tuple[PartialKey, bytes]]) -> bytes:
    """A bulk upload body (format 1, docs/bulk-upload.md)."""
    return b"".join(framing.encode(k, len(b), crc32c(b)) + b for k, b in items) + \
        framing.encode_end(len(items))


def url(sup: str, sub: str) -> str:
    return f"{PREFIX}/tasks/{sup}/{sub}/partition"


async def put(client: Any, sup: str, sub: str, rows: int = 5, seed: int = 0) -> Any:
    return await client.put(url(sup, sub), params=PARAMS,
                            data=arrow_bytes(sample_table(rows, seed=seed)))


async def test_a_sealed_subtask_can_no_longer_be_replaced(daemon: Any, tmp_path: Path) -> None:
    assert (await put(daemon, "sup", "s1", seed=1)).status == 201
    before = await (await daemon.get(url("sup", "s1"), params=PARAMS)).read()
    seal = await daemon.put(f"{PREFIX}/tasks/sup/seal", json={"subTaskIds": ["s1"]})
    assert seal.status == 200
    stored = sum(committed_bytes(tmp_path / f"loc{i}", "sup") for i in range(2))
    again = await put(daemon, "sup", "s1", rows=9, seed=2)
    body = await again.json()
    assert (again.status, body["code"]) == (409, "sealed") and "sealed" in body["error"]
    # Nothing changed: the same bytes are served, nothing more committed.
    assert await (await daemon.get(url("sup", "s1"), params=PARAMS)).read() == before
    assert sum(committed_bytes(tmp_path / f"loc{i}", "sup") for i in range(2)) == stored
    # A bulk upload of the sealed subtask is refused partial by partial; a new subtask
    # (the recovery path's recompute, sealed later by an extension) is taken.
    frames = bulk_body([
        (PartialKey("sup", "s1", INTERVAL, 0), arrow_bytes(sample_table(3))),
        (PartialKey("sup", "s7", INTERVAL, 0), arrow_bytes(sample_table(3)))])
    bulk = await daemon.post(f"{PREFIX}/tasks/sup/partials", data=frames, headers=BULK)
    answers = (await bulk.json())["partials"]
    assert [a["error"]["code"] if a["status"] == "rejected" else a["status"]
            for a in answers] == ["sealed", "created"]
    extend = await daemon.put(f"{PREFIX}/tasks/sup/seal", json={"subTaskIds": ["s1", "s7"]})
    assert extend.status == 200
    assert (await put(daemon, "sup", "s7")).status == 409  # now sealed too


async def test_uploads_to_a_failed_task_are_refused(daemon: Any) -> None:
    assert (await put(daemon, "sup", "s1")).status == 201
    assert (await daemon.post(f"{PREFIX}/tasks/sup/fail")).status == 200
    late = await put(daemon, "sup", "s2")
    body = await late.json()
    assert (late.status, body["code"]) == (409, "sealed") and "failed" in body["error"]
    listing = await (await daemon.get(f"{PREFIX}/tasks/sup")).json()
    assert listing["files"] == 1
    assert (await put(daemon, "other", "s1")).status == 201  # other tasks unaffected


async def test_a_seal_landing_mid_upload_refuses_its_commit(daemon: Any) -> None:
    """An upload of a subtask admitted before the seal but committing after it is refused
    at its commit: what the seal committed never changes."""
    assert (await put(daemon, "sup", "s1", seed=1)).status == 201
    before = await (await daemon.get(url("sup", "s1"), params=PARAMS)).read()
    gate = asyncio.Event()
    body = arrow_bytes(sample_table(5, seed=3))

    async def slow() -> Any:
        yield body[:100]
        await gate.wait()
        yield body[100:]

    upload = asyncio.ensure_future(daemon.put(url("sup", "s1"), params=PARAMS, data=slow(),
                                              headers={"Content-Length": str(len(body))}))
    store = daemon.server.app[STATE].store
    deadline = time.monotonic() + 10
    while not store.uploads.busy("sup"):  # the upload's session is open
        assert time.monotonic() < deadline, "the upload never started"
        await asyncio.sleep(0.01)
    seal = await daemon.put(f"{PREFIX}/tasks/sup/seal", json={"subTaskIds": ["s1"]})
    assert seal.status == 200
    gate.set()
    resp = await asyncio.wait_for(upload, 10)
    assert (resp.status, (await resp.json())["code"]) == (409, "sealed")
    assert await (await daemon.get(url("sup", "s1"), params=PARAMS)).read() == before


async def test_quota_refuses_the_task_over_it_and_no_other(start_daemon: Any,
                                                           make_settings: Any) -> None:
    daemon = await start_daemon(make_settings(task_quota_partials=3,
                                              task_quota_bytes=4 << 20))
    for i in range(3):
        assert (await put(daemon, "greedy", f"s{i}")).status == 201
    over = await put(daemon, "greedy", "s3")
    body = await over.json()
    assert (over.status, body["code"], body["quota"]) == (507, "quota_exceeded", "partials")
    assert "greedy" in body["error"] and "task_quota_partials" in body["error"]
    # A body that would pass the byte quota: refused, nothing of it stored.
    big = arrow_bytes(sample_table(200_000))
    assert len(big) > 4 << 20
    over = await daemon.put(url("greedy2", "s0"), params=PARAMS, data=big)
    body = await over.json()
    assert (over.status, body["quota"]) == (507, "bytes") and "greedy2" in body["error"]
    # Another task's bulk upload in the same moment succeeds in full.
    partials = [(PartialKey("calm", f"s{i}", INTERVAL, 0), arrow_bytes(sample_table(50, i)))
                for i in range(3)]
    refused, bulk = await asyncio.gather(
        put(daemon, "greedy", "s4"),
        daemon.post(f"{PREFIX}/tasks/calm/partials", data=bulk_body(partials), headers=BULK))
    assert refused.status == 507
    assert [a["status"] for a in (await bulk.json())["partials"]] == ["created"] * 3
    registry = daemon.server.app[STATE].metrics.registry
    assert metric(registry, "shuffled_task_quota_partials") == 3
    assert metric(registry, "shuffled_task_quota_used_ratio_max") == pytest.approx(1.0)
    page = await (await daemon.get("/ui")).text()
    assert "100% of 3 partials" in page
    # The driver asks for a tighter quota through its heartbeat, never a looser one.
    beat = await daemon.post(f"{PREFIX}/tasks/calm/heartbeat",
                             json={"quota": {"partials": 10, "bytes": 1 << 20}})
    assert (await beat.json())["quota"] == {"bytes": 1 << 20, "partials": 3}
    bad = await daemon.post(f"{PREFIX}/tasks/calm/heartbeat", json={"quota": {"bytes": -1}})
    assert bad.status == 400


async def test_a_reader_past_an_attempt_the_seal_leaves_out_reads_again(daemon: Any) -> None:
    for sub, seed in (("attempt1", 1), ("attempt2", 2)):
        assert (await put(daemon, "sup", sub, rows=20, seed=seed)).status == 201
    pages = f"{PREFIX}/tasks/sup/partition/pages"
    first = await daemon.get(pages, params={**PARAMS, "token": "0"})
    assert first.status == 200 and await first.read()
    passed = first.headers["X-Shuffled-Page-Next-Token"]
    # The seal keeps attempt2 only; attempt1, committed first, was served to this reader.
    seal = await daemon.put(f"{PREFIX}/tasks/sup/seal", json={"subTaskIds": ["attempt2"]})
    assert seal.status == 200
    again = await daemon.get(pages, params={**PARAMS, "token": passed})
    body = await again.json()
    assert (again.status, body["code"]) == (409, "read_again") and "token 0" in body["error"]
    # From 0, the reader gets exactly the sealed attempt, complete.
    got, token = [], "0"
    for _ in range(10):
        page = await daemon.get(pages, params={**PARAMS, "token": token})
        data = await page.read()
        if data:
            got.append(pa.ipc.open_stream(data).read_all())
        token = page.headers["X-Shuffled-Page-Next-Token"]
        if page.headers["X-Shuffled-Complete"] == "true":
            break
    assert pa.concat_tables(got).equals(sample_table(20, seed=2))
    # A token handed out after the seal is never sent back to read again.
    again = await daemon.get(pages, params={**PARAMS, "token": token})
    assert again.status == 200 and again.headers["X-Shuffled-Complete"] == "true"


def test_the_client_reader_starts_over_when_told_to(tmp_path: Path) -> None:
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as base, \
            ShuffleClient(base) as client:
        partition = PartitionKey("sup", INTERVAL, 0)
        for sub, seed in (("attempt1", 1), ("attempt2", 2)):
            client.put_partial(PartialKey("sup", sub, INTERVAL, 0),
                               arrow_bytes(sample_table(20, seed=seed)))
        page = client.read_page(partition, 0)
        assert page.body
        client.seal("sup", ["attempt2"])
        with pytest.raises(Exception) as raised:
            client.read_page(partition, page.next_token)
        assert getattr(raised.value, "code", "") == "read_again"
        tables = [pa.ipc.open_stream(b).read_all() for b in client.pages(partition)]
        assert pa.concat_tables(tables).equals(sample_table(20, seed=2))


async def test_draining_answers_waiting_long_polls_at_once(daemon: Any) -> None:
    assert (await put(daemon, "sup", "s1")).status == 201
    pages = f"{PREFIX}/tasks/sup/partition/pages"
    first = await daemon.get(pages, params={**PARAMS, "token": "0"})
    await first.read()
    token = first.headers["X-Shuffled-Page-Next-Token"]
    state = daemon.server.app[STATE]
    waiting = asyncio.ensure_future(daemon.get(pages, params={**PARAMS, "token": token,
                                                              "maxWait": "25"}))
    watch = daemon.server.app[WATCH]
    deadline = time.monotonic() + 10
    while watch.waiting == 0:
        assert time.monotonic() < deadline, "the long poll never started waiting"
        await asyncio.sleep(0.01)
    started = time.monotonic()
    state.drain.start()
    resp = await asyncio.wait_for(waiting, 5)
    assert resp.status == 200 and time.monotonic() - started < 2
    assert resp.headers["X-Shuffled-Complete"] == "false" and not await resp.read()
    again = await daemon.get(pages, params={**PARAMS, "token": token, "maxWait": "25"})
    assert again.status == 503  # new requests: draining


def test_pages_go_out_by_sendfile_not_through_memory(tmp_path: Path) -> None:
    """A 48 MiB page served by an in-process daemon allocates no page-sized buffer
    (tracemalloc sees every Python allocation of the daemon's thread)."""
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as base, \
            ShuffleClient(base) as client:
        table = pa.table({"v": pa.array(range(6 << 20), pa.int64())})  # 48 MiB
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=1 << 20)
        client.put_partial(PartialKey("sup", "s1", INTERVAL, 0), sink.getvalue())
        client.seal("sup", ["s1"])
        partition = PartitionKey("sup", INTERVAL, 0)
        tracemalloc.start()
        try:
            _, before = tracemalloc.get_traced_memory()
            page = client.read_page(partition, 0, max_bytes=256 << 20)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(page.body) > 48 << 20
        # The client holds one copy (measured: 1.0x the page); a daemon reading the page
        # into memory (its pieces, then joined) would add two more.
        assert peak - before < 1.5 * len(page.body), (peak, len(page.body))

"""Bulk format 2 (shuffled.framing2) on real daemons: a flush sent as one schema message
and addressed bodies is stored as storage format 3 has it (the schema once, the bodies
back to back), read back as whole streams; its bodies are validated together, a bad one
refused alone; framing faults stop the batch; a client falls back to format 1 for a daemon
that reads only that (0.1.0's exact refusal)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pyarrow as pa
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from shuffled import framing, framing2
from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.protocol import PartitionKey
from shuffled.server.state import STATE
from shuffled.storage import fast_plan
from shuffled.storage.ondisk.arrowfile import EOS, SchemaMessage, validate_bodies
from tests.conftest import (
    PREFIX, committed_bytes, data_size, pack_files, pack_records, sample_table,
)
from tests.helpers.bulk import INTERVAL, MEDIA, frames_of, get, key, post


def flush(table: pa.Table, cuts: list[int]) -> tuple[bytes, list[bytes]]:
    """``table`` written as ONE stream, a batch per slice between ``cuts``: its schema
    message and each batch's bytes (what phase 1 sends)."""
    sink = pa.BufferOutputStream()
    ends = []
    head = len(table.schema.serialize())  # written with the first batch
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for lo, hi in zip([0, *cuts], [*cuts, table.num_rows]):
            writer.write_batch(table.slice(lo, hi - lo).to_batches()[0])
            ends.append(sink.tell())
    data = sink.getvalue().to_pybytes()
    assert data[:head] == table.schema.serialize().to_pybytes()
    bounds = [head, *ends]
    return data[:head], [data[a:b] for a, b in zip(bounds, bounds[1:])]


def frames(sup: str, schema: bytes, items: list[tuple[Any, bytes]]) -> bytes:
    out = [framing2.encode_schema(7, len(schema)), schema]
    for k, body in items:
        out += [framing2.encode_partial(k, 7, len(body), crc32c(body)), body]
    return b"".join([*out, framing2.encode_end(len(items))])


def test_bodies_of_one_schema_are_validated_together_and_a_bad_one_alone() -> None:
    table = sample_table(300, seed=4)
    head, bodies = flush(table, [50, 120, 200])
    schema = SchemaMessage.parse(head)
    views = [memoryview(b) for b in bodies]
    assert validate_bodies(schema, views) == [(50, 1), (70, 1), (80, 1), (100, 1)]
    bad = [views[0], memoryview(bodies[1][:40]), views[2],  # cut short
           memoryview(bodies[3] + EOS + b"junk"),  # a stream end inside a body
           memoryview(head), memoryview(b"")]  # a schema message as a body; an empty one
    got = validate_bodies(schema, bad)
    assert got[0] == (50, 1) and got[2] == (80, 1) and got[5] == (0, 0)
    assert all(isinstance(g, Exception) for g in (got[1], got[3], got[4])), got
    with pytest.raises(Exception, match="exactly one schema message"):
        SchemaMessage.parse(head + bodies[0])


async def test_a_flush_is_stored_contiguously_and_read_back_whole(daemon: TestClient,
                                                                   settings: Any) -> None:
    table = sample_table(1000, seed=1)
    head, bodies = flush(table, list(range(100, 1000, 100)))
    items = [(key(f"f{i}", "flush"), b) for i, b in enumerate(bodies)]  # one partition
    status, answer = await post(daemon, "flush", frames("flush", head, items))
    assert status == 200 and answer["complete"] and answer["stored"] == 10, answer
    for (k, body), item in zip(items, answer["partials"]):
        whole = head + body + EOS
        assert (item["bytes"], item["crc32c"]) == (len(whole), f"{crc32c(whole):08x}")
        assert await get(daemon, k) == (200, whole)
    # Storage format 3: the schema message once, the ten bodies back to back; then (format
    # 5) the one commit record naming the ten.
    (pack,) = [p for loc in settings.locations for p in pack_files(loc.path, "flush")]
    stored = head + b"".join(bodies)
    (record,) = pack_records(pack)
    assert pack.read_bytes()[: record.at] == stored and record.at == len(stored)
    assert record.end == pack.stat().st_size and len(record.rows) == 10
    store = daemon.app[STATE].store
    metas = store.partition(PartitionKey("flush", INTERVAL, 0))
    plan = fast_plan(metas)
    assert plan is not None and len(plan.pieces) == 2  # schema + ONE range: one sendfile
    resp = await daemon.get(f"{PREFIX}/tasks/flush/partition",
                            params={**{k: v for k, v in items[0][0].query().items()
                                       if k != "subTaskId"}})
    got = pa.ipc.open_stream(await resp.read()).read_all()
    assert got.equals(table.combine_chunks()) or got.to_pylist() == table.to_pylist()


async def test_a_bad_body_is_refused_alone_and_leaves_nothing(daemon: TestClient,
                                                              settings: Any) -> None:
    head, bodies = flush(sample_table(90, seed=2), [30, 60])
    items = [(key("a", "bad"), bodies[0]), (key("b", "bad"), bodies[1][:40]),
             (key("c", "bad"), bodies[2])]
    status, answer = await post(daemon, "bad", frames("bad", head, items))
    assert status == 200 and [p["status"] for p in answer["partials"]] == [
        "created", "rejected", "created"], answer
    assert answer["partials"][1]["error"]["code"] == "invalid_body"
    assert (await get(daemon, items[1][0]))[0] == 404
    packs = [p for loc in settings.locations for p in pack_files(loc.path, "bad")]
    assert sum(data_size(p) for p in packs) == sum(
        committed_bytes(loc.path, "bad") for loc in settings.locations)


@pytest.mark.parametrize("mangle, mentions", [
    (lambda s, b: framing2.encode_schema(7, 5) + b"12345", "not an Arrow"),
    (lambda s, b: framing2.encode_schema(7, len(s) + len(b)) + s + b, "exactly one schema"),
    (lambda s, b: b"", "refers to schema 7"),  # no SCHEMA frame before the PARTIAL
])
async def test_schema_faults_stop_the_batch(daemon: TestClient, mangle: Any,
                                            mentions: str) -> None:
    head, (body,) = flush(sample_table(10), [])
    k = key("x", "sf")
    data = (mangle(head, body) + framing2.encode_partial(k, 7, len(body), crc32c(body)) + body
            + framing2.encode_end(1))
    status, answer = await post(daemon, "sf", data)
    assert status == 400 and answer["complete"] is False and answer["code"] == "bad_framing"
    assert mentions in answer["error"], answer
    assert (await get(daemon, k))[0] == 404


def test_put_flush_round_trip(daemon_url: str) -> None:
    table = sample_table(400, seed=3)
    head, bodies = flush(table, [100, 250])
    items = [(key(f"p{i}", "pf", pid=i), b) for i, b in enumerate(bodies)]
    with ShuffleClient(daemon_url) as client:
        answers = client.put_flush("pf", head, items)
        assert [a["status"] for a in answers] == ["created"] * 3
        for k, body in items:
            assert client.get_partial(k) == head + body + EOS  # digest-checked


async def test_a_format_1_daemon_gets_format_1() -> None:
    """0.1.0 refuses a format-2 batch at its first frame with this answer; the client sends
    the batch again in format 1 and keeps to it on that connection."""
    seen: list[bytes] = []

    async def post_(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(body[:4])
        if body[:4] != framing.MAGIC:
            return web.json_response({"error": "frame does not start with b'SHB1': bulk format "
                                      "version '2' is not supported (this daemon reads 1)",
                                      "code": "bad_framing", "field": "body",
                                      "complete": False, "count": 0, "partials": []}, status=400)
        parsed = [f for f in frames_of(body, request.match_info["sup"]) if f[0] is not None]
        items = [{"subTaskId": k.sub_task_id, "start": k.interval.start_iso,
                  "end": k.interval.end_iso, "partitionId": k.partition_id,
                  "status": "created", "bytes": len(b), "crc32c": f"{crc:08x}"}
                 for k, crc, b in parsed]
        return web.json_response({"complete": True, "count": len(items), "partials": items})

    app = web.Application()
    app.router.add_post(f"{PREFIX}/tasks/{{sup}}/partials", post_)
    server = TestClient(TestServer(app, host="127.0.0.1"))
    await server.start_server()
    head, bodies = flush(sample_table(60), [20, 40])
    out: list[Any] = []

    def run() -> None:
        try:
            with ShuffleClient(str(server.make_url("")).rstrip("/")) as c:
                out.append(c.put_flush("old", head, [(key(f"o{i}", "old"), b)
                                                      for i, b in enumerate(bodies)]))
                out.append(c.put_flush("old", head, [(key("o9", "old"), bodies[0])]))
        except Exception as exc:  # handed back to the test
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    async with asyncio.timeout(60):
        while thread.is_alive():
            await asyncio.sleep(0.01)  # the server answers on this loop
    await server.close()
    assert not any(isinstance(o, Exception) for o in out), out
    assert [a["status"] for a in out[0]] == ["created"] * 3
    assert seen == [framing2.MAGIC, framing.MAGIC, framing.MAGIC]  # one refusal, then 1

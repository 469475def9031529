"""Every endpoint of docs/design.md section 3 against a real daemon with real directories."""

from __future__ import annotations

import asyncio
import time

import pyarrow as pa
from aiohttp.test_utils import TestClient

from shuffled.crc import crc32c
from shuffled.protocol import format_crc32c
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, data_size, files_under, packed_size, sample_table,
)
from tests.helpers.clock import Clock


def part_url(sup: str = "sup", sub: str | None = "s1") -> str:
    return f"{PREFIX}/tasks/{sup}/{sub}/partition" if sub else f"{PREFIX}/tasks/{sup}/partition"


def q(pid: int = 0, **extra: str) -> dict[str, str]:
    return {**DAY, "partitionId": str(pid), **extra}


async def put(client: TestClient, body: bytes, sup: str = "sup", sub: str = "s1", pid: int = 0,
              digest: bool = True) -> tuple[int, dict]:
    headers = {"Content-Type": "application/vnd.apache.arrow.stream"}
    if digest:
        headers["Content-Digest"] = format_crc32c(crc32c(body))
    resp = await client.put(part_url(sup, sub), params=q(pid), data=body, headers=headers)
    return resp.status, await resp.json()


async def test_put_get_round_trip_with_headers(daemon: TestClient) -> None:
    body = arrow_bytes(sample_table(100))
    status, info = await put(daemon, body)
    assert status == 201 and info["rows"] == 100 and info["bytes"] == len(body)
    assert info["crc32c"] == f"{crc32c(body):08x}" and info["replaced"] is False
    resp = await daemon.get(part_url(), params=q())
    assert resp.status == 200
    assert await resp.read() == body
    assert resp.headers["Content-Length"] == str(len(body))
    assert resp.headers["Content-Digest"] == format_crc32c(crc32c(body))
    assert resp.headers["Repr-Digest"] == resp.headers["Content-Digest"]
    assert resp.headers["X-Shuffled-Rows"] == "100"
    etag = resp.headers["ETag"]
    again = await daemon.get(part_url(), params=q(), headers={"If-None-Match": etag})
    assert again.status == 304


async def test_range_requests(daemon: TestClient) -> None:
    body = arrow_bytes(sample_table(500))
    await put(daemon, body)
    resp = await daemon.get(part_url(), params=q(), headers={"Range": "bytes=100-199"})
    assert resp.status == 206 and await resp.read() == body[100:200]
    assert resp.headers["Content-Range"] == f"bytes 100-199/{len(body)}"
    assert "Content-Digest" not in resp.headers  # RFC 9530: content != representation
    assert resp.headers["Repr-Digest"] == format_crc32c(crc32c(body))
    tail = await daemon.get(part_url(), params=q(), headers={"Range": "bytes=-10"})
    assert tail.status == 206 and await tail.read() == body[-10:]
    open_end = await daemon.get(part_url(), params=q(), headers={"Range": "bytes=7-"})
    assert await open_end.read() == body[7:]
    bad = await daemon.get(part_url(), params=q(), headers={"Range": f"bytes={len(body)}-"})
    assert bad.status == 416 and bad.headers["Content-Range"] == f"bytes */{len(body)}"
    stale = await daemon.get(part_url(), params=q(),
                             headers={"Range": "bytes=0-9", "If-Range": '"nope"'})
    assert stale.status == 200 and await stale.read() == body


async def test_replace_is_atomic_and_keeps_one_file(daemon: TestClient, settings) -> None:
    first, second = arrow_bytes(sample_table(10)), arrow_bytes(sample_table(20, seed=3))
    assert (await put(daemon, first))[0] == 201
    status, info = await put(daemon, second)
    assert status == 200 and info["replaced"] is True
    assert await (await daemon.get(part_url(), params=q())).read() == second
    # Packs only, holding the two bodies and nothing else: the old bytes stay in their pack
    # (a reader that looked it up first reads them whole) until the task is deleted.
    files = [p for loc in settings.locations for p in files_under(loc.path)]
    assert files and all(p.suffix == ".pack" for p in files)
    assert sum(data_size(p) for p in files) == packed_size([first, second], len(files))
    listing = await (await daemon.get(f"{PREFIX}/tasks/sup")).json()
    assert listing["files"] == 1 and listing["bytes"] == len(second)
    # One partial's worth of committed data: the catalogs hold one row for the key, the new
    # bytes (an older copy in the other location is forgotten right after the commit).
    deadline = time.monotonic() + 10
    while True:
        rows = [r for loc in settings.locations for r in catalog_rows(loc.path, "sup")]
        if len(rows) == 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)  # poll interval of a bounded wait
    assert len(rows) == 1 and rows[0][0] == "s1" and rows[0][7] == len(second)
    assert rows[0][8] == crc32c(second)


async def test_aggregate_streams_every_partial_as_one_arrow_stream(daemon: TestClient) -> None:
    tables = {f"s{i}": sample_table(30 + i, seed=i) for i in range(5)}
    for sub, table in tables.items():
        await put(daemon, arrow_bytes(table, batch_rows=7), sub=sub)
    await put(daemon, arrow_bytes(sample_table(3)), sub="other", pid=1)
    resp = await daemon.get(part_url(sub=None), params=q())
    assert resp.status == 200
    data = await resp.read()
    assert resp.headers["Content-Digest"] == format_crc32c(crc32c(data))
    assert resp.headers["Content-Length"] == str(len(data))
    assert resp.headers["X-Shuffled-Partials"] == "5"
    got = pa.ipc.open_stream(data).read_all()
    expected = pa.concat_tables(tables[s] for s in sorted(tables))
    assert got.equals(expected)
    only = await daemon.get(part_url(sub=None), params=[*q().items(), ("subTaskId", "s3"),
                                                        ("subTaskId", "s1")])
    assert pa.ipc.open_stream(await only.read()).read_all().equals(
        pa.concat_tables([tables["s3"], tables["s1"]]))
    missing = await daemon.get(part_url(sub=None), params=[*q().items(), ("subTaskId", "zz")])
    assert missing.status == 404 and "zz" in (await missing.json())["error"]
    none = await daemon.get(part_url(sub=None), params=q(pid=9))
    assert none.status == 404


async def test_aggregate_mixes_gathered_small_and_sendfile_large_partials(daemon: TestClient) -> None:
    # Pieces up to 256 KiB are gathered into shared buffers, larger ones go by sendfile;
    # batch boundaries (1 MiB) fall inside runs of small ones.
    sizes = [40, 30_000, 50, 2_000, 9_000, 9_000, 9_000, 9_000, 9_000, 9_000, 60, 30_000, 70]
    tables = {f"s{i:02d}": sample_table(n, seed=i) for i, n in enumerate(sizes)}
    bodies = {sub: arrow_bytes(t) for sub, t in tables.items()}
    assert any(len(b) > 256 << 10 for b in bodies.values())
    assert sum(len(b) for b in bodies.values() if len(b) <= 256 << 10) > 1 << 20
    for sub, body in bodies.items():
        await put(daemon, body, sub=sub)
    resp = await daemon.get(part_url(sub=None), params=q())
    data = await resp.read()
    assert resp.status == 200 and resp.headers["Content-Digest"] == format_crc32c(crc32c(data))
    got = pa.ipc.open_stream(data).read_all()
    assert got.equals(pa.concat_tables(tables[s] for s in sorted(tables)))


async def test_aggregate_unifies_differing_schemas_or_refuses(daemon: TestClient) -> None:
    await put(daemon, arrow_bytes(pa.table({"a": [1, 2], "b": ["x", "y"]})), sub="s1")
    await put(daemon, arrow_bytes(pa.table({"a": [3]})), sub="s2")
    resp = await daemon.get(part_url(sub=None), params=q())
    assert resp.status == 200
    got = pa.ipc.open_stream(await resp.read()).read_all()
    assert got.to_pydict() == {"a": [1, 2, 3], "b": ["x", "y", None]}
    await put(daemon, arrow_bytes(pa.table({"a": pa.array([[1]])})), sub="s3", pid=2)
    await put(daemon, arrow_bytes(pa.table({"a": pa.array([{"x": 1}])})), sub="s4", pid=2)
    clash = await daemon.get(part_url(sub=None), params=q(pid=2))
    assert clash.status == 409 and "unified" in (await clash.json())["error"]


async def test_listing_detail_delete(daemon: TestClient, settings) -> None:
    body = arrow_bytes(sample_table(10))
    await put(daemon, body, sup="a", sub="s1")
    await put(daemon, body, sup="a", sub="s2", pid=3)
    await put(daemon, body, sup="b", sub="s1")
    listing = await (await daemon.get(f"{PREFIX}/tasks")).json()
    assert [t["supervisorTaskId"] for t in listing["tasks"]] == ["a", "b"]
    assert listing["files"] == 3 and listing["bytes"] == 3 * len(body)
    detail = await (await daemon.get(f"{PREFIX}/tasks/a")).json()
    assert [(p["partitionId"], [s["subTaskId"] for s in p["subTasks"]])
            for p in detail["partitions"]] == [(0, ["s1"]), (3, ["s2"])]
    assert detail["partitions"][0]["subTasks"][0]["crc32c"] == f"{crc32c(body):08x}"
    assert (await daemon.get(f"{PREFIX}/tasks/nope")).status == 404
    resp = await daemon.delete(f"{PREFIX}/tasks/a")
    assert resp.status == 200 and (await resp.json())["files"] == 2
    again = await daemon.delete(f"{PREFIX}/tasks/a")
    assert again.status == 200 and (await again.json())["deleted"] is False
    assert (await daemon.get(part_url("a"), params=q())).status == 404
    for loc in settings.locations:
        assert not (loc.path / "a").exists()
    assert (await daemon.get(part_url("b"), params=q())).status == 200


async def test_listing_does_not_refresh_expiry(start_daemon, settings) -> None:
    """README: a task expires from the last PUT/GET of its data; the listings (GET /tasks,
    GET /tasks/{sup}) do not refresh it. Time moved by the app's injected clock."""
    clock = Clock()
    daemon = await start_daemon(settings, clock=clock)
    await put(daemon, arrow_bytes(sample_table(3)), sup="exp")

    async def expiry() -> tuple[float, float]:
        detail = await (await daemon.get(f"{PREFIX}/tasks/exp")).json()
        listing = await (await daemon.get(f"{PREFIX}/tasks")).json()
        return detail["expiresAt"], listing["tasks"][0]["expiresAt"]

    first = await expiry()
    assert first[0] == first[1] == clock.now + settings.expiry_timeout
    for _ in range(3):
        clock.advance(5)
        assert await expiry() == first
    clock.advance(5)  # the positive control: a data GET refreshes it
    assert (await daemon.get(part_url("exp"), params=q())).status == 200
    assert await expiry() == (clock.now + settings.expiry_timeout,) * 2


async def test_status_health_metrics(daemon: TestClient) -> None:
    assert await (await daemon.get("/status/health")).json() is True
    status = await (await daemon.get("/status")).json()
    assert status["version"] and len(status["locations"]) == 2
    assert all(loc["healthy"] for loc in status["locations"])
    text = await (await daemon.get("/metrics")).text()
    assert "shuffled_location_used_bytes" in text


async def test_every_answer_names_its_request_id(daemon: TestClient) -> None:
    """A caller's plain X-Request-Id is kept; otherwise each request gets a new id of 16
    hex digits (drawn without a system call)."""
    ids = [(await daemon.get("/status/health")).headers["X-Request-Id"] for _ in range(50)]
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids) and len(set(ids)) == 50
    kept = await daemon.get("/status/health", headers={"X-Request-Id": "spark-s1-t7-a0"})
    assert kept.headers["X-Request-Id"] == "spark-s1-t7-a0"
    forged = await daemon.get("/status/health", headers={"X-Request-Id": "a b\tc"})
    assert forged.headers["X-Request-Id"] != "a b\tc"


async def test_round_robin_then_507_when_full(start_daemon, make_settings, tmp_path) -> None:
    body = arrow_bytes(sample_table(50))
    size = len(body)
    # Room for two partials a location, and their commit records (~130 bytes each).
    room = size * 2 + 300
    settings = make_settings([f"{tmp_path / 'a'}:{room}", f"{tmp_path / 'b'}:{room}"])
    client = await start_daemon(settings)
    for i in range(4):
        status, info = await put(client, body, sub=f"s{i}")
        assert status == 201
        assert info["location"] == str(tmp_path / ("a" if i % 2 == 0 else "b"))
    resp = await client.put(part_url(sub="s9"), params=q(), data=body)
    assert resp.status == 507
    assert "no location" in (await resp.json())["error"]
    assert not any(p.name.startswith("s9") for p in files_under(tmp_path))
    assert not list((tmp_path / "a" / ".tmp").iterdir())


async def test_restart_keeps_data(start_daemon, settings) -> None:
    first = await start_daemon(settings)
    body = arrow_bytes(sample_table(40))
    await put(first, body, sub="s1")
    await put(first, body, sub="s2", pid=4)
    await first.close()
    second = await start_daemon(settings)
    resp = await second.get(part_url(sub="s1"), params=q())
    assert await resp.read() == body
    detail = await (await second.get(f"{PREFIX}/tasks/sup")).json()
    assert detail["files"] == 2 and detail["bytes"] == 2 * len(body)
    assert detail["partitions"][1]["subTasks"][0]["rows"] == 40

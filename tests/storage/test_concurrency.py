"""Concurrent uploads, readers racing a replacing writer, and crash leftovers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from aiohttp.test_utils import TestClient

from shuffled.crc import crc32c
from shuffled.errors import LocationLocked
from shuffled.protocol import format_crc32c
from shuffled.storage import Store
from shuffled.storage.ondisk import arrowfile
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, data_size, files_under, pack_files, pack_records,
    sample_table,
)


def url(sup: str, sub: str) -> str:
    return f"{PREFIX}/tasks/{sup}/{sub}/partition"


async def test_fifty_concurrent_uploads_then_every_file_verifies(daemon: TestClient,
                                                                 settings) -> None:
    bodies: dict[tuple[str, int], list[bytes]] = {}

    async def upload(i: int) -> tuple[str, int, bytes]:
        # 20 uploads fight over 4 keys; 30 go to distinct keys.
        sub, pid = (f"hot{i % 4}", 0) if i < 20 else (f"s{i}", i % 3)
        body = arrow_bytes(sample_table(200 + i, seed=i), batch_rows=50)
        bodies.setdefault((sub, pid), []).append(body)
        resp = await daemon.put(url("sup", sub), params={**DAY, "partitionId": pid}, data=body,
                                headers={"Content-Digest": format_crc32c(crc32c(body))})
        assert resp.status in (200, 201), await resp.text()
        return sub, pid, body

    await asyncio.gather(*(upload(i) for i in range(50)))
    detail = await (await daemon.get(f"{PREFIX}/tasks/sup")).json()
    assert detail["files"] == 4 + 30
    for (sub, pid), candidates in bodies.items():
        resp = await daemon.get(url("sup", sub), params={**DAY, "partitionId": pid})
        data = await resp.read()
        assert data in candidates  # one complete upload, never a mix
        assert resp.headers["Content-Digest"] == format_crc32c(crc32c(data))
    on_disk = [p for loc in settings.locations for p in files_under(loc.path)]
    assert on_disk and all(p.suffix == ".pack" for p in on_disk)  # nothing in .tmp either
    # One row per key (a copy replaced in the other location is forgotten right after the
    # commit), each pointing at one of the bodies sent for it...
    deadline = time.monotonic() + 10
    while True:
        rows = [r for loc in settings.locations for r in catalog_rows(loc.path, "sup")]
        if len(rows) == 34 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)  # poll interval of a bounded wait
    assert len(rows) == 34 and len({(r[0], r[3]) for r in rows}) == 34
    assert all(r[8] in {crc32c(b) for b in bodies[(r[0], r[3])]} for r in rows)
    # ...and the packs hold every body that was acknowledged, nothing half-written: each
    # stream but its schema message and end-of-stream marker, and the (one) schema message
    # once per pack.
    head = arrowfile.inspect_bytes(bodies[("s20", 2)][0]).schema_len
    assert sum(data_size(p) for p in on_disk) == sum(
        len(b) - head - 8 for bs in bodies.values() for b in bs) + head * len(on_disk)


async def test_reader_racing_replacing_writer_sees_old_or_new(daemon: TestClient) -> None:
    versions = [arrow_bytes(sample_table(2000 + 10 * i, seed=i)) for i in range(6)]
    params = {**DAY, "partitionId": 0}
    await daemon.put(url("sup", "s1"), params=params, data=versions[0])
    stop = asyncio.Event()
    seen: list[bytes] = []

    async def writer() -> None:
        for body in versions[1:] * 4:
            resp = await daemon.put(url("sup", "s1"), params=params, data=body)
            assert resp.status == 200
        stop.set()

    async def reader() -> None:
        while not stop.is_set():
            resp = await daemon.get(url("sup", "s1"), params=params)
            assert resp.status == 200
            data = await resp.read()
            assert resp.headers["Content-Digest"] == format_crc32c(crc32c(data))
            seen.append(data)

    await asyncio.wait_for(asyncio.gather(writer(), reader(), reader()), timeout=60)
    assert seen and all(data in versions for data in seen)


async def test_restart_cleans_crash_leftovers(start_daemon, settings) -> None:
    client = await start_daemon(settings)
    body = arrow_bytes(sample_table(30))
    params = {**DAY, "partitionId": 0}
    for sub in ("s1", "s2", "s3", "s4"):
        await client.put(url("sup", sub), params=params, data=body)
    await client.close()
    loc0 = settings.locations[0].path
    # What a crash can leave: a half-written upload past a pack's committed end, a pack
    # created for an upload that never committed, a stray temp file.
    (pack,) = pack_files(loc0, "sup")
    committed = pack.stat().st_size  # its last body, and the commit record naming it
    assert pack_records(pack)[-1].end == committed
    with open(pack, "ab") as fh:
        fh.write(body[: len(body) // 2])
    orphan = pack.with_name("999.pack")
    orphan.write_bytes(body)
    # The first upload of a task that never committed: its directory and pack, nothing more.
    ghost = loc0 / "ghost" / "1000.pack"
    ghost.parent.mkdir()
    ghost.write_bytes(body[:100])
    (loc0 / ".tmp" / "dead.part").write_bytes(b"half an upload")
    rows = {i: catalog_rows(loc.path, "sup") for i, loc in enumerate(settings.locations)}
    client = await start_daemon(settings)
    assert not (loc0 / ".tmp" / "dead.part").exists()
    assert not orphan.exists() and not ghost.parent.exists()
    assert pack.stat().st_size == committed  # the torn tail is cut off
    assert {i: catalog_rows(loc.path, "sup")  # what was committed is kept as it was
            for i, loc in enumerate(settings.locations)} == rows
    assert sum(len(r) for r in rows.values()) == 4
    for loc in settings.locations:
        assert [p for p in files_under(loc.path) if p.suffix != ".pack"] == []
    assert (await client.get(f"{PREFIX}/tasks/ghost")).status == 404
    for sub in ("s1", "s2", "s3", "s4"):
        resp = await client.get(url("sup", sub), params=params)
        assert await resp.read() == body
    detail = await (await client.get(f"{PREFIX}/tasks/sup")).json()
    assert detail["files"] == 4


async def test_second_daemon_on_a_locked_location_refuses(settings) -> None:
    first = Store(settings)
    await first.open()
    try:
        second = Store(settings)
        with pytest.raises(LocationLocked, match="locked by another shuffled process"):
            await second.open()
        await second.close()
        proc = subprocess.run(
            [sys.executable, "-m", "shuffled", "serve", "--port", "0",
             "--location", str(settings.locations[0].path)],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": "."},
        )
        assert proc.returncode == 2
        assert "locked by another shuffled process" in proc.stderr
    finally:
        await first.close()


async def test_chunked_upload_without_content_length(daemon: TestClient) -> None:
    body = arrow_bytes(sample_table(5000), batch_rows=100)

    async def chunks():
        for i in range(0, len(body), 4096):
            yield body[i:i + 4096]

    resp = await daemon.put(url("sup", "s1"), params={**DAY, "partitionId": 0}, data=chunks())
    assert resp.status == 201
    got = await (await daemon.get(url("sup", "s1"), params={**DAY, "partitionId": 0})).read()
    assert got == body
    assert pa.ipc.open_stream(got).read_all().num_rows == 5000


def test_executor_client_never_imports_server() -> None:
    code = ("import sys, shuffled.client; bad = [m for m in sys.modules if m.startswith("
            "('aiohttp', 'apscheduler', 'prometheus_client', 'shuffled.server', "
            "'shuffled.storage'))]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""Packed storage end to end: torn tails, SIGKILL during group commits, readers racing
replace and delete, shared syncs, the paged listing, and migration from format 1."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from shuffled import framing
from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.crc import crc32c
from shuffled.errors import ConfigError
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server import handlers
from shuffled.server.state import STATE
from shuffled.storage import arrowfile
from shuffled.storage.migrate import migrate_location
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, files_under, pack_files, sample_table,
)
from tests.procs import DaemonProcess

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
ROOT = Path(__file__).resolve().parent.parent


def key(sub: str, sup: str = "sup", pid: int = 0) -> PartialKey:
    return PartialKey(sup, sub, INTERVAL, pid)


def url_of(k: PartialKey) -> str:
    return f"{PREFIX}/tasks/{k.supervisor_task_id}/{k.sub_task_id}/partition"


# --- torn tails ---------------------------------------------------------------------------


def test_torn_tails_are_cut_and_a_damaged_last_partial_is_never_served(tmp_path: Path) -> None:
    loc = tmp_path / "a"
    bodies = {f"s{i}": arrow_bytes(sample_table(100 + i, seed=i)) for i in range(6)}
    with DaemonProcess([loc], log_path=tmp_path / "d1.log") as daemon:
        with ShuffleClient(daemon.url) as client:
            client.put_partials("sup", [(key(s), b) for s, b in bodies.items()])
    (pack,) = pack_files(loc, "sup")
    committed = pack.stat().st_size
    assert committed == sum(len(b) for b in bodies.values())
    # A crash mid-append: garbage, then half of a valid partial, past the committed end.
    with open(pack, "ab") as fh:
        fh.write(os.urandom(1000) + bodies["s0"][: len(bodies["s0"]) // 2])
    with DaemonProcess([loc], log_path=tmp_path / "d2.log") as daemon:
        with ShuffleClient(daemon.url) as client:
            for s, b in bodies.items():
                assert client.get_partial(key(s)) == b
            assert client.task("sup")["files"] == 6
    assert pack.stat().st_size == committed
    # Damage the last partial's bytes (what a power loss with fsync off can do): its CRC32C
    # fails at restart, so it is dropped and never served; the others stay.
    rows = catalog_rows(loc, "sup")
    last = max(rows, key=lambda r: r[6])
    with open(pack, "r+b") as fh:
        fh.seek(last[6] + last[7] // 2)
        byte = fh.read(1)[0]
        fh.seek(last[6] + last[7] // 2)
        fh.write(bytes([byte ^ 0xFF]))
    with DaemonProcess([loc], log_path=tmp_path / "d3.log") as daemon:
        with ShuffleClient(daemon.url, retry=RetryPolicy(attempts=1)) as client:
            code = client._http.request(
                "GET", url_of(key(last[0])), query=key(last[0]).query(), what="x",
                handle=lambda r: (r.read(), r.status)[1], accept=(404,))
            assert code == 404
            for s, b in bodies.items():
                if s != last[0]:
                    assert client.get_partial(key(s)) == b
            assert client.task("sup")["files"] == 5
    assert pack.stat().st_size == last[6]  # cut back to before the damaged partial


# --- SIGKILL while group commits are under way --------------------------------------------


def test_sigkill_during_group_commits_keeps_every_acknowledged_partial(tmp_path: Path) -> None:
    locs = [tmp_path / "a", tmp_path / "b"]
    sent: dict[PartialKey, list[bytes]] = {}
    acked: dict[PartialKey, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    daemon = DaemonProcess(locs, log_path=tmp_path / "d1.log")  # fsync on: the default
    url = daemon.start()

    def writer(w: int) -> None:
        rnd = random.Random(w)
        with ShuffleClient(url, retry=RetryPolicy(attempts=1)) as c:
            for n in range(5000):
                if stop.is_set():
                    return
                batch = []
                for j in range(rnd.randint(1, 8)):
                    k = key(f"w{w}-{rnd.randint(0, 20)}", pid=j % 2)
                    body = arrow_bytes(sample_table(rnd.randint(1, 400), seed=w * 10_000 + n))
                    with lock:
                        sent.setdefault(k, []).append(body)
                    batch.append((k, body))
                try:
                    if len(batch) == 1:
                        c.put_partial(*batch[0])
                    else:
                        c.put_partials("sup", batch)
                except Exception:
                    return  # the daemon is gone
                with lock:
                    for k, body in batch:
                        acked[k] = sent[k].index(body, acked.get(k, 0))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 40 and time.monotonic() < deadline:
            threading.Event().wait(0.01)  # poll interval of a bounded wait
        assert len(acked) >= 40, "writers committed too little before the kill"
        daemon.kill()  # SIGKILL, while commits are under way
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        daemon.kill()
    with DaemonProcess(locs, log_path=tmp_path / "d2.log") as restarted, \
            ShuffleClient(restarted.url) as client:
        listing = client.task("sup")
        held = {(s["subTaskId"], p["partitionId"]) for p in listing["partitions"]
                for s in p["subTasks"]}
        for k, bodies in sent.items():
            if k in acked:  # acknowledged: that body, or a later one that committed
                assert (k.sub_task_id, k.partition_id) in held, k
                assert client.get_partial(k) in bodies[acked[k]:], k
            elif (k.sub_task_id, k.partition_id) in held:  # never acknowledged: whole or absent
                assert client.get_partial(k) in bodies, k
        assert client.get_partition(PartitionKey("sup", INTERVAL, 0))
    for loc in locs:  # no pack holds bytes past its last committed partial
        ends: dict[int, int] = {}
        for row in catalog_rows(loc, "sup"):
            ends[row[5]] = max(ends.get(row[5], 0), row[6] + row[7])
        for pack in pack_files(loc, "sup"):
            assert pack.stat().st_size == ends[int(pack.stem)], pack


# --- readers racing replace and delete ----------------------------------------------------


async def test_readers_racing_replace_and_delete_see_old_or_new_whole(
        daemon: TestClient, settings: Any) -> None:
    versions = [arrow_bytes(sample_table(3000 + 7 * i, seed=i)) for i in range(5)]
    subs = ["r0", "r1", "r2"]
    params = {**DAY, "partitionId": "0"}
    stop = asyncio.Event()
    seen: list[bytes] = []

    async def writer() -> None:
        for round_ in range(12):
            for sub in subs:
                body = versions[(round_ + subs.index(sub)) % len(versions)]
                resp = await daemon.put(f"{PREFIX}/tasks/race/{sub}/partition", params=params,
                                        data=body)
                assert resp.status in (200, 201, 409)
            if round_ % 4 == 3:
                resp = await daemon.delete(f"{PREFIX}/tasks/race")
                assert resp.status == 200
        stop.set()

    async def reader(sub: str) -> None:
        while not stop.is_set():
            resp = await daemon.get(f"{PREFIX}/tasks/race/{sub}/partition", params=params)
            if resp.status == 404:
                await resp.read()
                continue
            assert resp.status == 200
            data = await resp.read()
            assert data in versions  # old or new, whole
            seen.append(data)
            ranged = await daemon.get(f"{PREFIX}/tasks/race/{sub}/partition", params=params,
                                      headers={"Range": "bytes=100-999"})
            if ranged.status == 206:
                part = await ranged.read()
                assert any(v[100:1000] == part for v in versions)

    async def aggregate() -> None:
        while not stop.is_set():
            resp = await daemon.get(f"{PREFIX}/tasks/race/partition", params=params)
            body = await resp.read()
            assert resp.status in (200, 404, 409), body
            if resp.status == 200:
                digest = base64.b64decode(resp.headers["Content-Digest"].split(":")[1])
                assert crc32c(body) == int.from_bytes(digest, "big")

    await asyncio.wait_for(asyncio.gather(writer(), *(reader(s) for s in subs), aggregate()),
                           timeout=120)
    assert seen
    resp = await daemon.delete(f"{PREFIX}/tasks/race")
    assert resp.status == 200
    for loc in settings.locations:
        assert not [p for p in files_under(loc.path) if "race" in p.parts]
        assert catalog_rows(loc.path, "race") == []


# --- group commit -------------------------------------------------------------------------


async def test_concurrent_uploads_share_syncs_and_are_durable(start_daemon, make_settings
                                                              ) -> None:
    settings = make_settings(locations=1, fsync=True)
    daemon = await start_daemon(settings)
    commit = daemon.app[STATE].store.commits[0]
    bodies = {f"g{i}": arrow_bytes(sample_table(50 + i, seed=i)) for i in range(40)}

    async def put(sub: str) -> None:
        resp = await daemon.put(f"{PREFIX}/tasks/gc/{sub}/partition",
                                params={**DAY, "partitionId": "0"}, data=bodies[sub])
        assert resp.status == 201

    await asyncio.gather(*(put(s) for s in bodies))
    assert commit.partials == 40
    assert commit.groups < 40, "no two uploads shared a group commit"
    await daemon.close()
    again = await start_daemon(settings)
    for sub, body in bodies.items():
        resp = await again.get(f"{PREFIX}/tasks/gc/{sub}/partition",
                               params={**DAY, "partitionId": "0"})
        assert await resp.read() == body


# --- the paged listing --------------------------------------------------------------------


async def test_the_listing_pages_in_key_order_across_locations(daemon: TestClient,
                                                               monkeypatch: Any) -> None:
    body = arrow_bytes(sample_table(3))
    expected = []
    for day in range(5):
        interval = Interval(INTERVAL.start + day * 86_400_000, INTERVAL.end + day * 86_400_000)
        for pid in range(5):
            items = [(PartialKey("pg", f"s{i:03d}", interval, pid), body) for i in range(100)]
            expected += [(interval.start_iso, pid, k.sub_task_id) for k, _ in items]
            frames = b"".join(framing.encode(k, len(b), crc32c(b)) + b for k, b in items)
            resp = await daemon.post(f"{PREFIX}/tasks/pg/partials",
                                     data=frames + framing.encode_end(len(items)),
                                     headers={"Content-Type": framing.MEDIA_TYPE})
            assert resp.status == 200
    assert len(expected) == 2500
    got, cursor, pages = [], None, 0
    while True:
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        page = await (await daemon.get(f"{PREFIX}/tasks/pg", params=params)).json()
        pages += 1
        got += [(p["start"], p["partitionId"], s["subTaskId"]) for p in page["partitions"]
                for s in p["subTasks"]]
        cursor = page["nextCursor"]
        if cursor is None:
            break
        assert pages < 100
    assert pages == 25 and got == expected  # each exactly once, in key order
    bad = await daemon.get(f"{PREFIX}/tasks/pg", params={"limit": "10", "cursor": "nope"})
    assert bad.status == 400 and (await bad.json())["field"] == "cursor"
    assert (await daemon.get(f"{PREFIX}/tasks/pg", params={"limit": "0"})).status == 400
    monkeypatch.setattr(handlers, "UNPAGED_MAX", 1000)
    refused = await daemon.get(f"{PREFIX}/tasks/pg")
    assert refused.status == 400 and "limit" in (await refused.json())["error"]


# --- migration from format 1 ---------------------------------------------------------------


def _legacy(root: Path, sup: str, sub: str, pid: int, generation: int, body: bytes) -> None:
    facts = arrowfile.inspect_bytes(body)
    d = root / sup / f"{INTERVAL.start_iso}_{INTERVAL.end_iso}" / str(pid) / sub
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{generation}.arrow").write_bytes(body)
    (d / f"{generation}.json").write_text(json.dumps({
        "supervisorTaskId": sup, "subTaskId": sub, "start": INTERVAL.start_iso,
        "end": INTERVAL.end_iso, "partitionId": pid, "generation": generation,
        "bytes": len(body), "rows": facts.rows, "crc32c": f"{crc32c(body):08x}",
        "schemaLen": facts.schema_len, "schemaCrc32c": f"{facts.schema_crc:08x}",
        "bodyCrc32c": f"{facts.body_crc:08x}", "hasDictionaries": False, "created": 1.0}))


def test_a_format_1_location_is_refused_then_migrated_without_loss(tmp_path: Path) -> None:
    loc = tmp_path / "old"
    (loc / ".tmp").mkdir(parents=True)
    bodies = {(sup, sub, pid): arrow_bytes(sample_table(10 + pid, seed=len(sub)))
              for sup in ("t1", "t2") for sub in ("a", "bb") for pid in (0, 1)}
    for (sup, sub, pid), body in bodies.items():
        _legacy(loc, sup, sub, pid, 5, body)
    _legacy(loc, "t1", "a", 0, 3, arrow_bytes(sample_table(99)))  # an older generation

    serve = [sys.executable, "-m", "shuffled", "serve", "--port", "0", "--location", str(loc)]
    refused = subprocess.run(serve, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode != 0 and "shuffled migrate" in refused.stderr, refused.stderr
    from shuffled.config import load_settings
    from shuffled.storage import Store
    with pytest.raises(ConfigError, match="shuffled migrate"):
        asyncio.run(Store(load_settings(environ={}, overrides={
            "locations": [str(loc)], "free_space_reserve": 0})).open())

    # An interrupted earlier attempt (packs and a catalog, no format mark) is redone.
    (loc / ".shuffled").mkdir()
    (loc / ".shuffled" / "catalog.sqlite").write_bytes(b"junk")
    (loc / "t1" / "7.pack").write_bytes(b"junk")
    migrate = [sys.executable, "-m", "shuffled", "migrate", "--location", str(loc)]
    done = subprocess.run(migrate, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "migrated 8 partial segments" in done.stdout
    again = subprocess.run(migrate, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert not [p for p in loc.rglob("*") if p.suffix in (".arrow", ".json")]
    with DaemonProcess([loc], log_path=tmp_path / "d.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for (sup, sub, pid), body in bodies.items():
            assert client.get_partial(PartialKey(sup, sub, INTERVAL, pid)) == body
        assert client.get_partition(PartitionKey("t1", INTERVAL, 0), ["a", "bb"])
    assert migrate_location(loc).already

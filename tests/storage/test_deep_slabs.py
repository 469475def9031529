"""Slabs in deep storage (docs/slab.md, docs/deep-storage.md) against a real S3-compatible
server (moto on loopback) and real daemons:

- a sealed task's slab files are copied beside its packs, encrypted, journaled, and its
  manifest (version 2) lists them with what a reader needs; a task of partials only
  still writes version 1; a manifest of an unknown version is refused, naming it;
- a survivor answers ``POST /peers/<instance>/.../shards`` (and its ``"without"``) with
  exactly what the lost daemon answered, from the tier;
- a full location evicts offloaded slab files like packs, and shards read them back (a
  restart keeps their rows);
- a manifest naming a slab whose object is missing or is another object gives a clear
  error, never other rows;
- DELETE leaves nothing in the bucket nor on the disks, and the orphan sweep removes a
  lost daemon's slabs with its task's prefix;
- a task's slab files are not evicted while its shards are being read.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from shuffled.client import ShuffleClient
from shuffled.errors import BadTierCopy
from shuffled.protocol import Interval
from shuffled.server.state import STATE
from shuffled.slab.wire import KeyKind
from shuffled.storage.deep import crypt, manifest
from shuffled.storage.deep.journal import Copied
from shuffled.storage.deep.readback import CACHE_DIR
from tests.cleanup.test_cleanup import Clock
from tests.conftest import PREFIX, metric
from tests.helpers.slabs import HOUR, make_slab, rows_table
from tests.storage.test_deep_evict import UPLOAD, _full, _put, _refill
from tests.storage.test_deep_storage import (  # noqa: F401 (fixtures)
    _arrow, _objects, _offloaded, _q, _store, _table, s3, tier,
)

BOUNDS = [None, (1 << 30).to_bytes(4, "big"), (3 << 30).to_bytes(4, "big"), None]
SHARDS = [(Interval(c * HOUR, (c + 1) * HOUR), lo, hi)
          for c in range(3) for lo, hi in zip(BOUNDS[:-1], BOUNDS[1:])]


def _url(client: TestClient, prefix: str = "") -> str:
    return str(client.make_url(prefix)).rstrip("/")


def _rows(t: pa.Table | None) -> list[tuple[Any, ...]]:
    if t is None:
        return []
    cols = ["__time", "dim", "user", "count"]
    return sorted(zip(*(t[c].to_pylist() for c in cols)))


async def _shards(url: str, sup: str, without: tuple[str, ...] = ()) -> list[Any]:
    """Every shard of SHARDS, as (rows, slab count) each (one batched read)."""
    def read() -> list[Any]:
        with ShuffleClient(url) as client:
            return [(_rows(r.table), r.slabs)
                    for r in client.read_shards(sup, SHARDS, without)]
    return await asyncio.to_thread(read)


async def _put_slabs(url: str, sup: str, subs: int = 3, unsealed: int = 1,
                     rows: int = 2000) -> list[str]:
    """``subs`` sealed subtasks of two slabs each (one attempt 1 replacing an attempt
    0), and ``unsealed`` more never sealed; the sealed ones."""
    def put() -> list[str]:
        sealed = [f"s{i}" for i in range(subs)]
        with ShuffleClient(url) as client:
            for i in range(subs + unsealed):
                for slab in range(2):
                    client.put_slab(sup, make_slab(rows_table(rows, seed=10 * i + slab),
                                                   sub=f"s{i}", slab_id=slab))
            # A retried flush: attempt 1 of slab 0 of s0 replaces attempt 0 in reads.
            client.put_slab(sup, make_slab(rows_table(rows // 2, seed=99), sub="s0",
                                           slab_id=0, attempt=1))
            client.seal(sup, sealed)
        return sealed
    return await asyncio.to_thread(put)


def _names(fs: Any, prefix: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True, recursive=True))
    return sorted(i.path[len(prefix) + 1:] for i in infos if i.type == pafs.FileType.File)


def _slab_files(settings: Any, sup: str) -> list[Path]:
    return sorted(p for loc in settings.locations for p in (loc.path / sup).glob("*.slab"))


async def test_sealed_slabs_are_offloaded_encrypted_and_listed_in_the_manifest(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    settings = tier["settings"](locations=[str(tmp_path / "a0"), str(tmp_path / "a1")])
    a = await start_daemon(settings, registry=registry)
    # Partials too: their packs go as before, beside the slabs.
    resp = await a.put(f"{PREFIX}/tasks/mix-1/p0/partition", params=_q(0),
                       data=_arrow(_table(1)))
    assert resp.status == 201
    sealed = await _put_slabs(_url(a), "mix-1")
    resp = await a.put(f"{PREFIX}/tasks/mix-1/seal", json={"subTaskIds": [*sealed, "p0"]})
    assert resp.status == 200
    await _offloaded(a)
    deep = _store(a).deep
    assert deep is not None and deep.offloaded("mix-1")
    instance = deep.instance
    objects = _objects(tier["fs"], f"{tier['base']}/mix-1")
    slab_objects = {n: d for n, d in objects.items() if n.startswith(f"{instance}/slabs/")}
    # The sealed subtasks' slabs, every attempt (s3's, never sealed, stay local only).
    local = {p.read_bytes() for p in _slab_files(settings, "mix-1") if not p.name.startswith("s3.")}
    assert len(slab_objects) == len(local) == 7
    key = crypt.task_key(tier["secret"], "mix-1")
    assert {crypt.decrypt(key, "mix-1", f"mix-1/{n}", d)
            for n, d in slab_objects.items()} == local
    # Ciphertext only: no 32-byte run of any plaintext slab (its magic and header, Arrow
    # messages, rows) is in any object. Short markers ("SHS1", a 3-byte value) are found
    # in random bytes often enough to fail one run in twenty; 32 bytes, never.
    runs = {p[i:i + 32] for p in local for i in range(0, len(p) - 32, 1024)}
    assert runs
    for data in objects.values():
        assert not any(r in data for r in runs)
    name = manifest.manifest_object("mix-1", instance)
    body = manifest.parse(crypt.decrypt(key, "mix-1", name, objects[f"{instance}/manifest.json"]))
    assert body["version"] == 2
    listed = manifest.parse_slabs(body)
    assert sorted((r.sub, r.slab, r.attempt) for _, r, _ in listed) == sorted(
        [(f"s{i}", s, 0) for i in range(3) for s in range(2)] + [("s0", 0, 1)])
    assert all(r.idx and r.rows and c.object in objects or f"mix-1/{c.object}"
               for _, r, c in listed)
    assert {c.object.split("/", 1)[1] for _, _, c in listed} == set(slab_objects)
    assert len(body["packs"]) >= 1 and body["rows"]  # the partial's pack, as before
    # The journal says so (version 2, as it holds slabs).
    journal = json.loads((settings.locations[0].path / ".shuffled" / "deep"
                          / "mix-1.json").read_text())
    assert journal["version"] == 2 and len(journal["slabs"]) == 7 and journal["complete"]
    assert metric(registry, "shuffled_deep_offloaded_slabs_total") == 7
    assert metric(registry, "shuffled_deep_errors_total") == 0
    # A seal adding a subtask copies only its slabs, and the manifest again.
    resp = await a.put(f"{PREFIX}/tasks/mix-1/seal", json={"subTaskIds": [*sealed, "p0", "s3"]})
    assert resp.status == 200
    await _offloaded(a)
    assert metric(registry, "shuffled_deep_offloaded_slabs_total") == 9
    # DELETE: nothing left in the bucket, nor on the disks.
    resp = await a.delete(f"{PREFIX}/tasks/mix-1")
    assert resp.status == 200
    assert _names(tier["fs"], f"{tier['base']}/mix-1") == []
    assert _slab_files(settings, "mix-1") == []
    assert not any((loc.path / "mix-1").exists() for loc in settings.locations)
    assert not any((loc.path / ".shuffled" / "deep" / "mix-1.json").exists()
                   for loc in settings.locations)


def test_manifests_are_versioned() -> None:
    packs = {"0.0": Copied("t/i/packs/0.0.pack", 10, 1)}
    v1 = manifest.parse(manifest.build(sup="t", instance="i", subs=["a"], packs=packs,
                                       rows=[]))
    assert v1["version"] == 1 and manifest.parse_slabs(v1) == []  # older readers read it
    future = json.dumps({**v1, "version": 3}).encode()
    with pytest.raises(ValueError, match="manifest version 3; this daemon reads versions 1, 2"):
        manifest.parse(future)


async def _lost(tier: dict[str, Any], start_daemon: Any, tmp_path: Path, sup: str,
                ) -> tuple[str, Any, dict[str, Any]]:
    """Daemon A stores slabs of ``sup``, offloads them and is lost with its disks; the
    instance, A's settings, and A's answers (without nothing, and without s1)."""
    settings_a = tier["settings"](locations=[str(tmp_path / "a0"), str(tmp_path / "a1")])
    a = await start_daemon(settings_a)
    await _put_slabs(_url(a), sup)
    await _offloaded(a)
    instance = _store(a).deep.instance  # type: ignore[union-attr]
    before = {(): await _shards(_url(a), sup), ("s1",): await _shards(_url(a), sup, ("s1",))}
    assert any(rows for rows, _ in before[()]) and before[()] != before[("s1",)]
    await a.close()
    for loc in settings_a.locations:
        shutil.rmtree(loc.path)
    return instance, settings_a, before


async def test_a_survivor_serves_a_lost_peers_shards_from_the_tier(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    instance, _, before = await _lost(tier, start_daemon, tmp_path, "lost-1")
    registry = CollectorRegistry()
    settings_b = tier["settings"](locations=[str(tmp_path / "b0")])
    b = await start_daemon(settings_b, registry=registry)
    peer = _url(b, f"/peers/{instance}")
    assert await _shards(peer, "lost-1") == before[()]
    assert await _shards(peer, "lost-1", ("s1",)) == before[("s1",)]
    fetched = metric(registry, "shuffled_deep_read_bytes_total")
    assert fetched > 0
    cache = settings_b.locations[0].path / ".shuffled" / CACHE_DIR / "lost-1"
    assert len(list(cache.rglob("*.slab"))) == 6  # the newest attempts, each once
    assert await _shards(peer, "lost-1") == before[()]
    assert metric(registry, "shuffled_deep_read_bytes_total") == fetched
    # The warm-up takes the slabs too.
    resp = await b.post(f"/peers/{instance}{PREFIX}/tasks/lost-1/warm")
    assert resp.status == 202 and (await resp.json())["packs"] == 0
    # B holds nothing of its own: its own shard route answers 404.
    resp = await b.post(f"{PREFIX}/tasks/lost-1/shards", json={"shards": [
        {"start": "1970-01-01T00:00:00.000Z", "end": "1970-01-01T01:00:00.000Z"}]})
    assert resp.status == 404
    resp = await b.delete(f"{PREFIX}/tasks/lost-1")
    assert resp.status == 200
    assert not cache.exists()
    assert _names(tier["fs"], f"{tier['base']}/lost-1") == []
    assert metric(registry, "shuffled_deep_errors_total") == 0


async def test_a_missing_or_swapped_slab_object_is_a_clear_error(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    instance, _, _ = await _lost(tier, start_daemon, tmp_path, "bad-1")
    fs, base = tier["fs"], f"{tier['base']}/bad-1/{instance}/slabs"
    names = _names(fs, base)
    s1 = [n for n in names if ".s1." in n]
    s2 = [n for n in names if ".s2." in n]
    fs.delete_file(f"{base}/{s1[0]}")  # missing
    with fs.open_input_stream(f"{base}/{s2[1]}") as src:  # another slab's object in place
        other = src.read()
    with fs.open_output_stream(f"{base}/{s2[0]}") as out:
        out.write(other)
    b = await start_daemon(tier["settings"](locations=[str(tmp_path / "b0")]))
    peer = _url(b, f"/peers/{instance}")
    # 502 bad_tier_copy, not retried: that copy is unusable, the reader needs another.
    with pytest.raises(BadTierCopy, match="is missing from"):
        await _shards(peer, "bad-1", ("s2",))
    with pytest.raises(BadTierCopy, match="does not check"):
        await _shards(peer, "bad-1", ("s1",))
    # Leaving both out, what is whole is served.
    got = await _shards(peer, "bad-1", ("s1", "s2"))
    assert any(rows for rows, _ in got) and {n for _, n in got} == {2}  # s0's two


# The reserve follows the shared disk's live free space (test_deep_evict's _refill):
# alone, with no other test writing or deleting.
@pytest.mark.serial
async def test_a_full_location_evicts_offloaded_slabs_and_reads_them_back(
        tier: dict[str, Any], start_daemon: Any) -> None:
    one = tier["settings"](locations=1, pack_max_bytes="1MiB")
    first = await start_daemon(one)
    await _put_slabs(_url(first), "ev-1", rows=40_000)
    await _offloaded(first)
    before = await _shards(_url(first), "ev-1")
    files = [p for p in _slab_files(one, "ev-1") if not p.name.startswith("s3.")]
    size = sum(p.stat().st_size for p in files)
    assert size > UPLOAD
    await first.close()

    registry = CollectorRegistry()
    client = await start_daemon(_full(one, tier["settings"], pack_max_bytes="1MiB"),
                                registry=registry)
    store = _store(client)
    assert store.evictor is not None
    store.evictor.margin = 0
    _refill(store)
    assert await _put(client, "up-1", "s0", _arrow(_table(1, rows=20, blob=UPLOAD))) == 201
    assert not any(p.exists() for p in files)  # the sealed subtasks' slabs went
    assert all(p.exists() for p in _slab_files(one, "ev-1"))  # s3's (no copy) stayed
    assert metric(registry, "shuffled_deep_evicted_bytes_total") == size
    assert await _shards(_url(client), "ev-1") == before
    assert metric(registry, "shuffled_deep_read_bytes_total") == size
    await client.close()
    # A restart keeps their rows (recovery does not drop them) and serves them.
    again = await start_daemon(one, registry=CollectorRegistry())
    assert await _shards(_url(again), "ev-1") == before
    resp = await again.delete(f"{PREFIX}/tasks/ev-1")
    assert resp.status == 200
    assert _names(tier["fs"], f"{tier['base']}/ev-1") == []
    assert not (one.locations[0].path / "ev-1").exists()
    assert not (one.locations[0].path / ".shuffled" / CACHE_DIR / "ev-1").exists()
    assert _store(again).deep.journal.entries.get("ev-1") is None  # type: ignore[union-attr]


async def test_kind_none_and_tuple_slabs_round_trip_through_a_peer(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    a = await start_daemon(tier["settings"](locations=[str(tmp_path / "a0")]))

    def put() -> None:
        with ShuffleClient(_url(a)) as client:
            client.put_slab("tup-1", make_slab(rows_table(3000), kind=KeyKind.TUPLE))
            client.seal("tup-1", ["sub0"])
    await asyncio.to_thread(put)
    await _offloaded(a)
    instance = _store(a).deep.instance  # type: ignore[union-attr]
    before = await _shards(_url(a), "tup-1")
    await a.close()
    b = await start_daemon(tier["settings"](locations=[str(tmp_path / "b0")]))
    assert await _shards(_url(b, f"/peers/{instance}"), "tup-1") == before


# The reserve follows the shared disk's live free space (test_deep_evict's _refill):
# alone, with no other test writing or deleting.
@pytest.mark.serial
async def test_slabs_being_read_are_not_evicted(tier: dict[str, Any],
                                                start_daemon: Any) -> None:
    """A shard read holds its task's slab files from its index to its last file: an
    eviction meanwhile leaves them (the upload then finds nothing else to free: 507);
    once the read is over they go."""
    one = tier["settings"](locations=1, pack_max_bytes="1MiB")
    first = await start_daemon(one)
    await _put_slabs(_url(first), "rd-1", rows=40_000)
    await _offloaded(first)
    await first.close()
    client = await start_daemon(_full(one, tier["settings"], pack_max_bytes="1MiB"))
    store = _store(client)
    assert store.evictor is not None
    store.evictor.margin = 0
    _refill(store)
    files = [p for p in _slab_files(one, "rd-1") if not p.name.startswith("s3.")]
    big = _arrow(_table(1, rows=20, blob=UPLOAD))
    with store.slabs.reading("rd-1"):
        assert await _put(client, "up-1", "s0", big) == 507
        assert all(p.exists() for p in files)
    _refill(store)
    assert await _put(client, "up-1", "s0", big) == 201
    assert not any(p.exists() for p in files)


async def test_the_orphan_sweep_removes_a_lost_daemons_slabs(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    """A task's DELETE never came and its daemon is gone: the orphan sweep (by age, no
    overlord) removes its whole prefix, slab objects and manifest included."""
    instance, _, _ = await _lost(tier, start_daemon, tmp_path, "orph-1")
    fs, base = tier["fs"], f"{tier['base']}/orph-1"
    assert any(n.startswith(f"{instance}/slabs/") for n in _names(fs, base))
    clock = Clock(time.time())
    registry = CollectorRegistry()
    b = await start_daemon(tier["settings"](locations=[str(tmp_path / "b0")],
                                            deep_storage_orphan_seconds=3600.0),
                           registry=registry, clock=clock)
    sweeper = b.server.app[STATE].sweeper
    assert (await sweeper.run_once()).orphans == []  # young: kept
    clock.advance(3605)
    assert (await sweeper.run_once()).orphans == ["orph-1"]
    assert _names(fs, base) == []
    assert metric(registry, "shuffled_deep_orphans_removed_total") == 1


async def test_slabs_of_a_location_out_of_service_are_read_from_the_tier(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    """As packs are: a location taken out of service (I/O errors) no longer serves its
    slab files; the task's shards come from their copies in the tier, the same rows."""
    registry = CollectorRegistry()
    settings = tier["settings"](locations=[str(tmp_path / "a0"), str(tmp_path / "a1")])
    a = await start_daemon(settings, registry=registry)
    await _put_slabs(_url(a), "oos-1")
    await _offloaded(a)
    before = await _shards(_url(a), "oos-1")  # its index is built (and kept) now
    store = _store(a)
    held = {p.parent.parent for p in _slab_files(settings, "oos-1")}
    assert len(held) == 2  # slabs on both locations
    store.locations[1].healthy = False
    for p in (settings.locations[1].path / "oos-1").glob("*.slab"):
        p.rename(p.with_suffix(".gone"))  # what a failed disk gives: nothing
    assert await _shards(_url(a), "oos-1") == before
    assert metric(registry, "shuffled_deep_read_bytes_total") > 0
    cache = settings.locations[0].path / ".shuffled" / CACHE_DIR / "oos-1"
    assert list(cache.rglob("*.slab"))

"""Deep storage's eviction and spill (issue 24) against a real S3-compatible server (moto)
and real daemons, the location made "full" by a ``free_space_reserve`` just under the
real free space of the test's file system:

- a full location evicts the packs of offloaded tasks, oldest offload first and no more
  than needed, and the upload lands (201, not 507); every read path answers the same
  bytes and digests from the tier, and so does a restarted daemon (recovery keeps the
  rows of evicted packs);
- a task not sealed and not being written is spilled (copied, then evicted) instead of
  a 507; sealed later, its offload completes with only the rest copied;
- packs being written (the uploading task's own) are never evicted: 507 as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from tests.conftest import DAY, PREFIX, metric, pack_files
from tests.storage.test_deep_storage import (  # noqa: F401 (fixtures)
    _answers, _arrow, _fill, _objects, _offloaded, _q, _store, _table, s3, tier)

UPLOAD = 1 << 20  # the upload that finds the location full
SHORT = 256 << 10  # the reserve is this much over what the free space allows that upload

# The reserve follows the shared disk's live free space: alone, with no other test writing.
pytestmark = pytest.mark.serial


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _packs(settings: Any, sup: str) -> list[Path]:
    return [p for loc in settings.locations for p in pack_files(loc.path, sup)]


def _full(settings: Any, make: Callable[..., Any], **more: Any) -> Any:
    """The same settings with a reserve that leaves no room for UPLOAD bytes (short by
    SHORT bytes)."""
    root = settings.locations[0].path
    return make(locations=[str(root)], free_space_reserve=_free(root) - UPLOAD + SHORT,
                **more)


def _refill(store: Any) -> None:
    """The reserve again from the free space now, leaving no room for UPLOAD bytes (short
    by SHORT): the disk is shared, and its free space moves between the daemon's start and
    the upload by more than SHORT when something else writes."""
    loc = store.locations[0]
    loc.reserve_bytes = _free(loc.path) - UPLOAD + SHORT


async def _put(client: TestClient, sup: str, sub: str, body: bytes) -> int:
    resp = await client.put(f"{PREFIX}/tasks/{sup}/{sub}/partition", params=_q(0), data=body)
    await resp.read()
    return resp.status


def _big(seed: int) -> bytes:
    body = _arrow(_table(seed, rows=20, blob=UPLOAD))
    assert len(body) > UPLOAD
    return body


async def test_a_full_location_evicts_offloaded_packs_oldest_first(
        tier: dict[str, Any], start_daemon: Any) -> None:
    one = tier["settings"](locations=1, pack_max_bytes="1MiB")
    first = await start_daemon(one)
    sent_old = await _fill(first, "old-1", subs=2, pids=3, blob=600_000)
    await _offloaded(first)
    sent_new = await _fill(first, "new-1", subs=2, pids=3, blob=600_000)
    await _offloaded(first)
    before_old = await _answers(first, "old-1", sent_old)
    before_new = await _answers(first, "new-1", sent_new)
    old_packs, new_packs = _packs(one, "old-1"), _packs(one, "new-1")
    old_bytes = sum(p.stat().st_size for p in old_packs)
    assert old_bytes > 3 * SHORT
    await first.close()

    registry = CollectorRegistry()
    full = _full(one, tier["settings"], pack_max_bytes="1MiB")
    client = await start_daemon(full, registry=registry)
    store = _store(client)
    assert store.evictor is not None
    store.evictor.margin = 0  # evict no more than this upload needs: one task's packs
    upload = _big(1)
    _refill(store)
    assert await _put(client, "up-1", "s0", upload) == 201
    # The oldest offload went, the newer one stayed.
    assert not any(p.exists() for p in old_packs)
    assert all(p.exists() for p in new_packs)
    assert metric(registry, "shuffled_deep_evicted_bytes_total") == old_bytes
    entry = store.deep.journal.entries["old-1"]  # type: ignore[union-attr]
    assert entry.evicted == set(entry.packs)
    # Every read path: the same bytes, digests, tokens (pages) and ranges, from the tier.
    assert await _answers(client, "old-1", sent_old) == before_old
    assert await _answers(client, "new-1", sent_new) == before_new
    assert metric(registry, "shuffled_deep_read_bytes_total") == old_bytes
    assert metric(registry, "shuffled_deep_errors_total") == 0
    page = await (await client.get("/ui")).text()
    assert "evicted" in page and "deep storage" in page
    await client.close()

    # A restart keeps the rows of the evicted packs and serves them.
    again = await start_daemon(one, registry=CollectorRegistry())
    assert _store(again).dropped_on_recovery == 0
    assert not any(p.exists() for p in old_packs)
    assert await _answers(again, "old-1", sent_old) == before_old
    resp = await again.get(f"{PREFIX}/tasks/up-1/s0/partition", params=_q(0))
    assert resp.status == 200 and await resp.read() == upload


async def test_a_task_not_sealed_spills_to_the_tier_instead_of_507(
        tier: dict[str, Any], start_daemon: Any) -> None:
    one = tier["settings"](locations=1, pack_max_bytes="1MiB")
    first = await start_daemon(one)
    bodies = {}
    for s in range(3):
        bodies[f"sub{s}"] = _arrow(_table(s, blob=600_000))
        assert await _put(first, "open-1", f"sub{s}", bodies[f"sub{s}"]) == 201
    await first.close()
    packs = _packs(one, "open-1")
    size = sum(p.stat().st_size for p in packs)

    registry = CollectorRegistry()
    client = await start_daemon(_full(one, tier["settings"], pack_max_bytes="1MiB"),
                                registry=registry)
    _refill(_store(client))
    assert await _put(client, "up-2", "s0", _big(2)) == 201  # not 507
    assert metric(registry, "shuffled_deep_spilled_packs_total") == len(packs)
    assert metric(registry, "shuffled_deep_evicted_bytes_total") == size
    assert not any(p.exists() for p in packs)
    for sub, body in bodies.items():
        resp = await client.get(f"{PREFIX}/tasks/open-1/{sub}/partition", params=_q(0))
        assert resp.status == 200 and await resp.read() == body
    await client.close()

    # Restarted, the task (still not sealed) keeps its spilled copies; sealed, its offload
    # completes (the manifest) without copying its packs again.
    registry = CollectorRegistry()
    again = await start_daemon(one, registry=registry)
    deep = _store(again).deep
    assert deep is not None and not deep.offloaded("open-1")
    resp = await again.put(f"{PREFIX}/tasks/open-1/seal", json={"subTaskIds": list(bodies)})
    assert resp.status == 200
    await _offloaded(again)
    assert deep.offloaded("open-1")
    assert metric(registry, "shuffled_deep_offloaded_packs_total") == 0
    objects = _objects(tier["fs"], f"{tier['base']}/open-1")
    assert f"{deep.instance}/manifest.json" in objects
    for sub, body in bodies.items():
        resp = await again.get(f"{PREFIX}/tasks/open-1/{sub}/partition", params=_q(0))
        assert resp.status == 200 and await resp.read() == body


async def test_packs_being_written_are_never_evicted(tier: dict[str, Any],
                                                     start_daemon: Any) -> None:
    one = tier["settings"](locations=1)
    first = await start_daemon(one)
    assert await _put(first, "busy-1", "sub0", _arrow(_table(0, blob=600_000))) == 201
    await first.close()
    packs = _packs(one, "busy-1")
    registry = CollectorRegistry()
    client = await start_daemon(_full(one, tier["settings"]), registry=registry)
    # The only packs are the uploading task's own: nothing may go, 507 as without a tier.
    _refill(_store(client))
    assert await _put(client, "busy-1", "sub1", _big(3)) == 507
    assert all(p.exists() for p in packs)
    assert metric(registry, "shuffled_deep_evicted_bytes_total") == 0
    assert _objects(tier["fs"], f"{tier['base']}/busy-1") == {}

"""Deep storage's cleanup (issue 24) against a real S3-compatible server (moto on
loopback) and real daemons sharing one bucket:

- the supervisor's DELETE removes the whole ``<sup>/`` prefix, every daemon's copy (a lost
  peer's too), and nothing of another task whose name starts the same;
- an expiry on one daemon removes only that daemon's ``<sup>/<instance>/``;
- a failing tier: the deletion is journaled and retried by the next sweep;
- the orphan sweep removes the prefixes of tasks over that no daemon holds (a lost
  daemon's): with an overlord (a real HTTP stand-in) those it says finished or does not
  know, keeping running ones and all while it cannot answer; without one, those whose
  newest object is older than ``deep_storage_orphan_seconds``; a bounded number a pass.

Time is a clock the test drives and sweeps are ``run_once()`` calls: nothing sleeps, and
every wait is bounded.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from shuffled.cleanup.sweeper import Sweeper
from shuffled.server.state import STATE
from shuffled.storage import Store
from shuffled.storage.deep import DeepStorage, manifest
from shuffled.storage.deep.orphans import Orphans
from tests.cleanup.test_cleanup import Clock, Overlord, status_object
from tests.conftest import DAY, PREFIX, arrow_bytes, metric, sample_table
from tests.storage.test_deep_storage import s3  # noqa: F401 (the module's S3 server)

pytest.importorskip("moto.server", reason="moto[server] is not installed (test extras)")

WAIT = 60.0  # the longest any wait below may take
EXPIRY = 100.0
BODY = arrow_bytes(sample_table(40))


@pytest.fixture
def tier(s3: Any, tmp_path: Path, make_settings: Callable[..., Any]) -> dict[str, Any]:
    """A fresh bucket, a per-run secret, and settings for daemon ``name`` (its own
    locations) on them."""
    bucket = "clean-" + secrets.token_hex(6)
    s3.create_dir(bucket)
    key_file = tmp_path / "deep.key"
    key_file.write_bytes(secrets.token_bytes(48))

    def settings(name: str = "a", **overrides: Any) -> Any:
        values = {"deep_storage": f"s3://{bucket}/tier", "deep_storage_key_file": str(key_file),
                  "locations": [str(tmp_path / name / f"loc{i}") for i in range(2)],
                  "expiry_timeout": EXPIRY, "sweep_period": 3600.0}
        values.update(overrides)
        return make_settings(**values)

    return {"fs": s3, "bucket": bucket, "base": f"{bucket}/tier", "settings": settings}


@pytest.fixture
async def overlord() -> Any:
    stand_in = Overlord()
    yield stand_in
    await stand_in.close()


def objects(fs: Any, prefix: str) -> list[str]:
    """Every object under ``prefix``, by name relative to it."""
    infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True, recursive=True))
    return sorted(i.path[len(prefix) + 1:] for i in infos if i.type == pafs.FileType.File)


def store(client: TestClient) -> Store:
    return client.server.app[STATE].store


def deep(client: TestClient) -> DeepStorage:
    d = store(client).deep
    assert d is not None
    return d


def sweeper(client: TestClient) -> Sweeper:
    sw = client.server.app[STATE].sweeper
    assert sw is not None
    return sw


async def fill(client: TestClient, sup: str, pids: int = 2) -> None:
    """Upload ``pids`` partials of ``sup``, seal it and wait for its offload."""
    for pid in range(pids):
        resp = await client.put(f"{PREFIX}/tasks/{sup}/s1/partition",
                                params={**DAY, "partitionId": str(pid)}, data=BODY)
        assert resp.status == 201, await resp.text()
    resp = await client.put(f"{PREFIX}/tasks/{sup}/seal", json={"subTaskIds": ["s1"]})
    assert resp.status == 200, await resp.text()
    await asyncio.wait_for(deep(client).idle(), WAIT)
    assert deep(client).offloaded(sup)


def instances(fs: Any, base: str, sup: str) -> set[str]:
    return {name.split("/")[0] for name in objects(fs, f"{base}/{sup}")}


async def test_delete_removes_every_instance_prefix_of_the_task(
        tier: dict[str, Any], start_daemon: Any) -> None:
    fs, base = tier["fs"], tier["base"]
    a = await start_daemon(tier["settings"]("a"))
    b = await start_daemon(tier["settings"]("b"))
    await fill(a, "del-1")
    await fill(b, "del-1")
    await fill(a, "del-10")  # a name del-1's prefix must not swallow
    ia, ib = deep(a).instance, deep(b).instance
    assert ia != ib
    assert instances(fs, base, "del-1") == {ia, ib}
    # A lost daemon's copy: its process is gone for good, its prefix is not.
    lost = "lost-" + secrets.token_hex(4)
    with fs.open_output_stream(f"{base}/del-1/{lost}/{manifest.MANIFEST_NAME}") as out:
        out.write(b"ciphertext of a daemon that will not come back")
    await b.close()

    resp = await a.delete(f"{PREFIX}/tasks/del-1")
    assert resp.status == 200 and (await resp.json())["deleted"] is True
    assert objects(fs, f"{base}/del-1") == []
    assert instances(fs, base, "del-10") == {ia}
    assert not deep(a).journal.entries.get("del-1")
    # A DELETE reaching a daemon that never held the task still ends it in the tier.
    await fill(a, "del-2")
    c = await start_daemon(tier["settings"]("c"))
    resp = await c.delete(f"{PREFIX}/tasks/del-2")
    assert resp.status == 200 and (await resp.json())["deleted"] is False
    assert objects(fs, f"{base}/del-2") == []
    assert [n.split("/", 1)[0] for n in objects(fs, base)] == ["del-10"] * len(
        objects(fs, f"{base}/del-10"))
    for loc in tier["settings"]("c").locations:
        assert not (loc.path / ".shuffled" / "deep" / "del-2.json").exists()


async def test_expiry_removes_only_this_daemons_instance(
        tier: dict[str, Any], start_daemon: Any) -> None:
    fs, base = tier["fs"], tier["base"]
    clock = Clock(time.time())
    a = await start_daemon(tier["settings"]("a"), clock=clock)
    b = await start_daemon(tier["settings"]("b"), clock=clock)
    await fill(a, "exp-1")
    await fill(b, "exp-1")
    ia, ib = deep(a).instance, deep(b).instance
    b_objects = [n for n in objects(fs, f"{base}/exp-1") if n.startswith(ib + "/")]
    assert instances(fs, base, "exp-1") == {ia, ib} and b_objects

    clock.advance(EXPIRY + 1)
    result = await sweeper(a).run_once()
    assert "exp-1" in result.deleted and store(a).task("exp-1") is None
    # b still serves its copy: only a's prefix went.
    assert objects(fs, f"{base}/exp-1") == b_objects
    assert store(b).task("exp-1") is not None and deep(b).offloaded("exp-1")
    # Then b expires it too: nothing is left.
    result = await sweeper(b).run_once()
    assert "exp-1" in result.deleted
    assert objects(fs, base) == []


async def test_a_failing_tier_is_retried_by_the_next_sweep(
        tier: dict[str, Any], start_daemon: Any) -> None:
    fs, base = tier["fs"], tier["base"]
    registry = CollectorRegistry()
    a = await start_daemon(tier["settings"]("a"), registry=registry)
    b = await start_daemon(tier["settings"]("b"))
    await fill(a, "retry-1")
    await fill(b, "retry-1")
    # The tier refuses deletions (credentials lost the right, the store is down).
    real = deep(a).tier.delete_prefix

    def refuse(prefix: str) -> None:
        raise OSError(f"test: the tier refuses to delete {prefix}")

    deep(a).tier.delete_prefix = refuse  # type: ignore[method-assign]
    resp = await a.delete(f"{PREFIX}/tasks/retry-1")
    assert resp.status == 200
    assert len(instances(fs, base, "retry-1")) == 2
    assert metric(registry, "shuffled_deep_errors_total") == 1
    entry = deep(a).journal.entries["retry-1"]
    assert entry.deleting and entry.everyone  # journaled: the whole prefix is owed
    # Owed by the journal: never taken for an orphan meanwhile (the overlord and the age
    # rule would both call it over).
    done = await Orphans(deep(a), lambda sup: False, max_age=1.0).run(time.time() + 10, None)
    assert "retry-1" not in done.looked_at and not done.removed
    deep(a).tier.delete_prefix = real  # type: ignore[method-assign]
    await sweeper(a).run_once()
    assert objects(fs, base) == []
    assert "retry-1" not in deep(a).journal.entries


async def _lost_daemon(tier: dict[str, Any], start_daemon: Any, *sups: str) -> str:
    """A daemon that offloads ``sups`` and is then lost for good; its instance."""
    b = await start_daemon(tier["settings"]("lost"))
    for sup in sups:
        await fill(b, sup)
    instance = deep(b).instance
    await b.close()
    return instance


async def test_orphan_sweep_asks_the_overlord(tier: dict[str, Any], start_daemon: Any,
                                              overlord: Overlord) -> None:
    fs, base = tier["fs"], tier["base"]
    lost = await _lost_daemon(tier, start_daemon, "o-unknown", "o-done", "o-running", "o-held")
    registry = CollectorRegistry()
    url = await overlord.start()
    a = await start_daemon(tier["settings"]("a", overlord_url=url), registry=registry,
                           clock=Clock(time.time()))
    await fill(a, "o-held")  # held here: kept whatever the overlord says
    overlord.running("o-running")
    overlord.tasks["o-done"] = status_object("o-done", "SUCCESS")
    # The overlord cannot answer: everything is kept.
    overlord.mode = "error500"
    result = await sweeper(a).run_once()
    assert result.orphans == [] and overlord.calls
    assert {n.split("/")[0] for n in objects(fs, base)} == {
        "o-unknown", "o-done", "o-running", "o-held"}

    overlord.mode, overlord.calls = "ok", []
    result = await sweeper(a).run_once()
    assert sorted(result.orphans) == ["o-done", "o-unknown"]
    assert sorted(i for call in overlord.calls for i in call) == [
        "o-done", "o-running", "o-unknown"]  # never asked about a task held here
    assert metric(registry, "shuffled_deep_orphans_removed_total") == 2
    assert metric(registry, "shuffled_deep_errors_total") == 0
    remaining = objects(fs, base)
    assert {n.split("/")[0] for n in remaining} == {"o-running", "o-held"}
    assert instances(fs, base, "o-running") == {lost}
    assert instances(fs, base, "o-held") == {lost, deep(a).instance}

    # The task finishes: its prefix goes with the next sweep, the lost daemon's copy too.
    overlord.tasks["o-running"] = status_object("o-running", "FAILED")
    result = await sweeper(a).run_once()
    assert result.orphans == ["o-running"]
    assert {n.split("/")[0] for n in objects(fs, base)} == {"o-held"}
    assert metric(registry, "shuffled_deep_orphans_removed_total") == 3


async def test_orphan_sweep_without_overlord_goes_by_age(tier: dict[str, Any],
                                                         start_daemon: Any) -> None:
    fs, base = tier["fs"], tier["base"]
    orphan_age = 3600.0
    lost = await _lost_daemon(tier, start_daemon, "g-old", "g-held")
    registry = CollectorRegistry()
    clock = Clock(time.time())
    a = await start_daemon(tier["settings"]("a", deep_storage_orphan_seconds=orphan_age,
                                            expiry_timeout=100_000.0, max_age=100_000.0),
                           registry=registry, clock=clock)
    await fill(a, "g-held")
    # Young: kept.
    result = await sweeper(a).run_once()
    assert result.orphans == []
    assert {n.split("/")[0] for n in objects(fs, base)} == {"g-old", "g-held"}

    clock.advance(orphan_age + 5)
    result = await sweeper(a).run_once()
    assert result.orphans == ["g-old"] and store(a).task("g-held") is not None
    assert metric(registry, "shuffled_deep_orphans_removed_total") == 1
    assert instances(fs, base, "g-held") == {lost, deep(a).instance}
    assert {n.split("/")[0] for n in objects(fs, base)} == {"g-held"}

    # Bounded: at most `limit` prefixes a pass, the next pass going on from there.
    strays = [f"g-stray-{i}" for i in range(5)]
    for sup in strays:
        with fs.open_output_stream(f"{base}/{sup}/{lost}/{manifest.MANIFEST_NAME}") as out:
            out.write(b"x")
    orphans = Orphans(deep(a), lambda sup: store(a).task(sup) is not None,
                      max_age=orphan_age, limit=2)
    passes = []
    for _ in range(3):
        done = await orphans.run(clock() + orphan_age, None)
        assert len(done.looked_at) <= 2 and not done.errors
        passes.append(done.removed)
    assert passes == [strays[0:2], strays[2:4], strays[4:5]]
    assert {n.split("/")[0] for n in objects(fs, base)} == {"g-held"}
    assert deep(a).stats.orphans_removed == 6

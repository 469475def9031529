"""A lost peer's share served by a survivor from deep storage (issue 24), against a real
S3-compatible server (moto on loopback) and real daemons:

- daemon B answers ``/peers/<A's instance>/...`` with exactly what A answered (bytes,
  digests, ETags, Range, aggregate, pages and their tokens, bulk read) once A is gone and
  its disks with it;
- the seal's answer names A's instance and the task state says when its offload is done;
- refusals: an instance with no complete copy (404), a daemon without deep storage (404),
  a write token (403), an instance that is no id (400).
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from shuffled.client import ShuffleClient
from shuffled.server.state import STATE
from shuffled.protocol import Interval, PartitionKey
from shuffled.spark.rows.rollup import from_ipc
from shuffled.storage.deep.peers import PEER_DIR
from shuffled.storage.deep.readback import CACHE_DIR
from shuffled.tokens import Scope, mint
from tests.conftest import DAY, PREFIX, metric
from tests.storage.test_deep_storage import (  # noqa: F401 (fixtures)
    _answers, _fill, _offloaded, _q, _store, s3, tier,
)
import pyarrow.fs as pafs
from prometheus_client import CollectorRegistry


async def test_a_survivor_serves_a_lost_peers_share_with_the_same_answers(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    settings_a = tier["settings"](locations=[str(tmp_path / "a0"), str(tmp_path / "a1")],
                                  pack_max_bytes="8KiB")
    a = await start_daemon(settings_a)
    sent = await _fill(a, "peer-1", subs=3, pids=3)
    state = await (await a.get(f"{PREFIX}/tasks/peer-1/state")).json()
    instance = state["deepStorage"]["instance"]
    await _offloaded(a)
    state = await (await a.get(f"{PREFIX}/tasks/peer-1/state")).json()
    assert state["deepStorage"] == {"instance": instance, "offload": "complete"}
    before = await _answers(a, "peer-1", sent)
    await a.close()
    for loc in settings_a.locations:  # A is gone, and its disks with it
        shutil.rmtree(loc.path)

    registry = CollectorRegistry()
    settings_b = tier["settings"](locations=[str(tmp_path / "b0")])
    b = await start_daemon(settings_b, registry=registry)
    peer = f"/peers/{instance}{PREFIX}"
    assert await _answers(b, "peer-1", sent, prefix=peer) == before
    read = metric(registry, "shuffled_deep_read_bytes_total")
    assert read > 0
    # Read once: the packs are in B's read-back cache, under the task (deleted with it).
    cache = settings_b.locations[0].path / ".shuffled" / CACHE_DIR / "peer-1"
    assert sorted(p.name for p in (cache / f"{PEER_DIR}{instance}").rglob("*.pack"))
    assert await _answers(b, "peer-1", sent, prefix=peer) == before
    assert metric(registry, "shuffled_deep_read_bytes_total") == read
    # The client reads a peer's share with its usual calls, base URL ending in the prefix:
    # the bulk read, and pages until complete (each page acknowledged).
    def read() -> tuple[list[int], list[int]]:
        with ShuffleClient(str(b.make_url(f"/peers/{instance}"))) as client:
            keys = [PartitionKey("peer-1", Interval.parse(DAY["start"], DAY["end"]), p)
                    for p in range(3)]
            bulk = [from_ipc(x).num_rows for x in client.get_partitions(
                "peer-1", [(k, None) for k in keys])]
            paged = [sum(from_ipc(x).num_rows for x in client.pages(k, max_bytes=2000))
                     for k in keys]
        return bulk, paged
    rows = [sum(from_ipc(body).num_rows for (_, p), body in sent.items() if p == pid)
            for pid in range(3)]
    assert await asyncio.to_thread(read) == (rows, rows)
    # B holds nothing of its own for the task: its own routes answer 404.
    resp = await b.get(f"{PREFIX}/tasks/peer-1/partition", params=_q(0))
    assert resp.status == 404
    resp = await b.delete(f"{PREFIX}/tasks/peer-1")
    assert resp.status == 200
    assert not cache.exists()
    assert metric(registry, "shuffled_deep_errors_total") == 0


async def test_warming_a_peers_share_fetches_it_before_any_read(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    settings_a = tier["settings"](locations=[str(tmp_path / "a0")], pack_max_bytes="8KiB")
    a = await start_daemon(settings_a)
    sent = await _fill(a, "warm-1", subs=2, pids=3)
    await _offloaded(a)
    instance = _store(a).deep.instance
    before = await _answers(a, "warm-1", sent)
    await a.close()
    registry = CollectorRegistry()
    settings_b = tier["settings"](locations=[str(tmp_path / "b0")])
    b = await start_daemon(settings_b, registry=registry)
    resp = await b.post(f"/peers/{instance}{PREFIX}/tasks/warm-1/warm")
    assert resp.status == 202, await resp.text()
    packs = (await resp.json())["packs"]
    assert packs >= 2
    background = b.server.app[STATE].background
    await asyncio.wait_for(asyncio.gather(*background), 60)  # bounded
    fetched = metric(registry, "shuffled_deep_read_bytes_total")
    assert fetched > 0
    cache = settings_b.locations[0].path / ".shuffled" / CACHE_DIR / "warm-1"
    assert len(list(cache.rglob("*.pack"))) == packs
    # Every read now comes from the cache: nothing more is fetched.
    assert await _answers(b, "warm-1", sent, prefix=f"/peers/{instance}{PREFIX}") == before
    assert metric(registry, "shuffled_deep_read_bytes_total") == fetched
    resp = await b.post(f"/peers/nobody{PREFIX}/tasks/warm-1/warm")
    assert resp.status == 404


async def test_peer_reads_refuse_what_they_cannot_serve(
        tier: dict[str, Any], start_daemon: Any, make_settings: Any, tmp_path: Path) -> None:
    secret_file = tmp_path / "signing"
    secret_file.write_text("s" * 40 + "\n")
    settings_a = tier["settings"](locations=[str(tmp_path / "a0")],
                                  signing_secret_file=str(secret_file))
    a = await start_daemon(settings_a)
    admin = mint(settings_a.signing_secrets[0], "peer-2", Scope.ADMIN, 600)
    read = mint(settings_a.signing_secrets[0], "peer-2", Scope.READ, 600)
    write = mint(settings_a.signing_secrets[0], "peer-2", Scope.WRITE, 600)
    other = mint(settings_a.signing_secrets[0], "peer-3", Scope.READ, 600)
    await _fill(a, "peer-2", headers={"Authorization": f"Bearer {admin}"})
    await _offloaded(a)
    instance = _store(a).deep.instance
    peer = f"/peers/{instance}{PREFIX}/tasks/peer-2/partition"

    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    resp = await a.get(peer, params=_q(0), headers=auth(read))
    assert resp.status == 200, await resp.text()
    for token, status in ((write, 403), (other, 403), ("garbage", 401)):
        resp = await a.get(peer, params=_q(0), headers=auth(token))
        assert resp.status == status, (token, await resp.text())
    warm = f"/peers/{instance}{PREFIX}/tasks/peer-2/warm"
    for token, status in ((write, 403), (other, 403), (read, 202), (admin, 202)):
        resp = await a.post(warm, headers=auth(token))
        assert resp.status == status, (token, await resp.text())
    resp = await a.get(f"/peers/nobody{PREFIX}/tasks/peer-2/partition", params=_q(0),
                       headers=auth(read))
    assert resp.status == 404 and "no complete copy" in (await resp.json())["error"]
    resp = await a.get(f"/peers/a%20b{PREFIX}/tasks/peer-2/partition", params=_q(0),
                       headers=auth(read))
    assert resp.status == 400, await resp.text()
    # A daemon without deep storage has no peers to serve.
    plain = await start_daemon(make_settings(locations=[str(tmp_path / "c0")]))
    resp = await plain.get(f"/peers/{instance}{PREFIX}/tasks/peer-2/partition", params=_q(0))
    assert resp.status == 404 and "no deep storage" in (await resp.json())["error"]


async def test_an_unusable_copy_of_a_peers_pack_answers_502_not_500(
        tier: dict[str, Any], start_daemon: Any, tmp_path: Path) -> None:
    """A pack object missing from the tier, or another's bytes in its place, is the copy's
    fault, not the survivor's: 502 bad_tier_copy (never other rows), so that the driver
    gives that copy up and recomputes the share (as with slabs, test_deep_slabs)."""
    settings_a = tier["settings"](locations=[str(tmp_path / "a0")], pack_max_bytes="8KiB")
    a = await start_daemon(settings_a)
    await _fill(a, "peer-9", subs=3, pids=2)
    instance = (await (await a.get(f"{PREFIX}/tasks/peer-9/state")).json())[
        "deepStorage"]["instance"]
    await _offloaded(a)
    await a.close()
    shutil.rmtree(settings_a.locations[0].path)
    fs, base = tier["fs"], f"{tier['base']}/peer-9/{instance}"
    packs = sorted(i.path for i in fs.get_file_info(
        pafs.FileSelector(base, recursive=True)) if i.path.endswith(".pack"))
    assert len(packs) >= 2, packs
    for damage in ("swapped", "missing"):
        if damage == "swapped":
            with fs.open_input_stream(packs[1]) as src:
                other = src.read()
            with fs.open_output_stream(packs[0]) as out:
                out.write(other)
        else:
            fs.delete_file(packs[0])
        b = await start_daemon(tier["settings"](locations=[str(tmp_path / f"b-{damage}")]))
        codes = set()
        for pid in range(2):
            resp = await b.get(f"/peers/{instance}{PREFIX}/tasks/peer-9/partition",
                               params=_q(pid))
            if resp.status != 200:
                body = await resp.json()
                codes.add((resp.status, body.get("code")))
        assert codes == {(502, "bad_tier_copy")}, (damage, codes)
        await b.close()

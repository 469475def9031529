"""Deep storage (issue 24, first slice) against a real S3-compatible server: moto's
standalone server on loopback, credentials and bucket names made per run.

- a sealed task is copied to the tier in the background, as ciphertext only;
- a daemon stopped mid-offload resumes on restart and completes, copying only the rest;
- with a pack gone locally, or its location out of service, reads answer the same bytes
  and digests from the tier (per-partial GET, Range, the aggregate, pages, bulk read);
- DELETE (and expiry, the same path) leaves nothing under the task's prefix.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry

from shuffled.errors import ConfigError
from shuffled.protocol import COMPLETE_HEADER, NEXT_TOKEN_HEADER
from shuffled.server.state import STATE
from shuffled.storage import Store
from shuffled.storage.deep import crypt, manifest
from shuffled.storage.deep.readback import CACHE_DIR
from tests.conftest import DAY, PREFIX, metric, pack_files
from tests.helpers.s3 import moto_s3

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed "
                                  "(it is in the test extras)")

WAIT = 60.0  # the longest any wait below may take


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """A moto S3 server on loopback and the AWS environment pointing at it."""
    with moto_s3() as (fs, _):
        yield fs


@pytest.fixture
def tier(s3: Any, tmp_path: Path, make_settings: Callable[..., Any]) -> dict[str, Any]:
    """A fresh bucket, a per-run secret and a settings factory using them."""
    bucket = "deep-" + secrets.token_hex(6)
    s3.create_dir(bucket)
    key_file = tmp_path / "deep.key"
    key_file.write_bytes(secrets.token_bytes(48))

    def settings(**overrides: Any) -> Any:
        values = {"deep_storage": f"s3://{bucket}/tier", "deep_storage_key_file": str(key_file)}
        values.update(overrides)
        return make_settings(**values)

    return {"fs": s3, "bucket": bucket, "base": f"{bucket}/tier", "settings": settings,
            "secret": key_file.read_bytes().strip()}


def _objects(fs: Any, prefix: str) -> dict[str, bytes]:
    infos = fs.get_file_info(pafs.FileSelector(prefix, allow_not_found=True, recursive=True))
    out = {}
    for info in infos:
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as src:
                out[info.path[len(prefix) + 1:]] = src.read()
    return out


def _store(client: TestClient) -> Store:
    return client.server.app[STATE].store


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (cheap, in memory) until true, at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _offloaded(client: TestClient) -> None:
    deep = _store(client).deep
    assert deep is not None
    await asyncio.wait_for(deep.idle(), WAIT)


MARKER = "plaintext-marker-" + secrets.token_hex(8)


def _table(i: int, rows: int = 50, blob: int = 0) -> pa.Table:
    columns: dict[str, Any] = {
        "__time": pa.array([1514764800000 + r for r in range(rows)], pa.int64()),
        "dim": pa.array([f"{MARKER}-{i}-{r % 3}" for r in range(rows)]),
        "count": pa.array(list(range(rows)), pa.int64()),
    }
    if blob:
        columns["blob"] = pa.array([os.urandom(blob // rows) for _ in range(rows)], pa.binary())
    return pa.table(columns)


def _arrow(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def _q(pid: int) -> dict[str, str]:
    return {**DAY, "partitionId": str(pid)}


async def _fill(client: TestClient, sup: str, subs: int = 2, pids: int = 3,
                blob: int = 0, headers: dict[str, str] | None = None,
                ) -> dict[tuple[str, int], bytes]:
    """Upload subs x pids partials of ``sup`` and seal it; what was uploaded."""
    sent = {}
    for s in range(subs):
        for p in range(pids):
            body = _arrow(_table(s * 10 + p, blob=blob))
            resp = await client.put(f"{PREFIX}/tasks/{sup}/sub{s}/partition", params=_q(p),
                                    data=body, headers=headers)
            assert resp.status == 201, await resp.text()
            sent[(f"sub{s}", p)] = body
    resp = await client.put(f"{PREFIX}/tasks/{sup}/seal",
                            json={"subTaskIds": [f"sub{s}" for s in range(subs)]},
                            headers=headers)
    assert resp.status == 200, await resp.text()
    return sent


async def _answers(client: TestClient, sup: str, sent: dict[tuple[str, int], bytes],
                   prefix: str = PREFIX) -> list[Any]:
    """Everything a reader can get of ``sup``: each partial whole and a Range of it with
    their digests, each partition's aggregate, its pages, and the bulk read (under
    ``prefix``: a peer's share is read under ``/peers/<instance>`` + PREFIX)."""
    PREFIX = prefix  # noqa: N806 (the module's name, shadowed on purpose)
    out: list[Any] = []
    for (sub, pid), body in sorted(sent.items()):
        resp = await client.get(f"{PREFIX}/tasks/{sup}/{sub}/partition", params=_q(pid))
        data = await resp.read()
        assert resp.status == 200 and data == body
        out.append((data, resp.headers["Content-Digest"], resp.headers["ETag"]))
        resp = await client.get(f"{PREFIX}/tasks/{sup}/{sub}/partition", params=_q(pid),
                                headers={"Range": "bytes=7-300"})
        assert resp.status == 206
        out.append((await resp.read(), resp.headers["Content-Range"]))
    for pid in sorted({p for _, p in sent}):
        resp = await client.get(f"{PREFIX}/tasks/{sup}/partition", params=_q(pid))
        assert resp.status == 200
        out.append((await resp.read(), resp.headers.get("Content-Digest")))
        token, pages = 0, []
        for _ in range(100):
            resp = await client.get(f"{PREFIX}/tasks/{sup}/partition/pages",
                                    params={**_q(pid), "token": str(token), "maxBytes": "2000"})
            assert resp.status == 200, await resp.text()
            pages.append((token, await resp.read(), resp.headers.get("Content-Digest")))
            token = int(resp.headers[NEXT_TOKEN_HEADER])
            if resp.headers[COMPLETE_HEADER] == "true":
                break
        out.append(pages)
    resp = await client.post(f"{PREFIX}/tasks/{sup}/partitions",
                             json={"partitions": [{**DAY, "partitionId": p}
                                                  for p in sorted({p for _, p in sent})]})
    assert resp.status == 200, await resp.text()
    out.append(await resp.read())
    return out


async def test_a_sealed_task_is_offloaded_as_ciphertext(tier: dict[str, Any],
                                                        start_daemon: Any) -> None:
    registry = CollectorRegistry()
    settings = tier["settings"]()
    client = await start_daemon(settings, registry=registry)
    sent = await _fill(client, "offload-1")
    await _offloaded(client)
    store = _store(client)
    assert store.deep is not None
    instance = store.deep.instance
    objects = _objects(tier["fs"], f"{tier['base']}/offload-1")
    packs = [p for loc in settings.locations for p in pack_files(loc.path, "offload-1")]
    names = sorted(objects)
    assert names == sorted([f"{instance}/{manifest.MANIFEST_NAME}"] + [
        f"{instance}/packs/{i}.{p.stem}.pack" for i, loc in enumerate(settings.locations)
        for p in pack_files(loc.path, "offload-1")]), names
    plain = [p.read_bytes() for p in packs]
    schema_message = plain[0][:200]
    for name, data in objects.items():
        assert data.startswith(crypt.MAGIC)
        assert b"ARROW1" not in data and MARKER.encode() not in data, name
        assert schema_message not in data and b"__time" not in data, name
    # What came back decrypts, with the task's key, to the packs and the catalog rows.
    key = crypt.task_key(tier["secret"], "offload-1")
    assert sorted(crypt.decrypt(key, "offload-1", f"offload-1/{n}", objects[n])
                  for n in names if n.endswith(".pack")) == sorted(plain)
    body = manifest.parse(crypt.decrypt(
        key, "offload-1", f"offload-1/{instance}/{manifest.MANIFEST_NAME}",
        objects[f"{instance}/{manifest.MANIFEST_NAME}"]))
    assert len(body["rows"]) == len(sent) and body["subTaskIds"] == ["sub0", "sub1"]
    with pytest.raises(crypt.Undecryptable):  # another task's key reads nothing
        crypt.decrypt(crypt.task_key(tier["secret"], "other"), "offload-1",
                      f"offload-1/{names[0]}", objects[names[0]])
    assert metric(registry, "shuffled_deep_offloaded_bytes_total") == sum(map(len, plain))
    assert metric(registry, "shuffled_deep_offloaded_packs_total") == len(packs)
    assert metric(registry, "shuffled_deep_offload_pending_tasks") == 0
    assert metric(registry, "shuffled_deep_errors_total") == 0


async def test_a_daemon_stopped_mid_offload_resumes_and_completes(
        tier: dict[str, Any], start_daemon: Any) -> None:
    # Packs of ~100 KB (one per partial), copied one at a time at 200 KB/s: the daemon is
    # stopped once the first is in the tier, well before the last.
    slow = tier["settings"](pack_max_bytes="64KiB", deep_storage_concurrency=1,
                            deep_storage_bandwidth="200KB")
    first = await start_daemon(slow)
    sent = await _fill(first, "resume-1", subs=2, pids=4, blob=100_000)
    deep = _store(first).deep
    assert deep is not None
    instance = deep.instance
    await _until(lambda: deep.stats.offloaded_packs >= 1, "the first pack's copy")
    await first.close()
    copied_before = deep.stats.offloaded_packs
    packs = sum(len(pack_files(loc.path, "resume-1")) for loc in slow.locations)
    assert 1 <= copied_before < packs
    names = _objects(tier["fs"], f"{tier['base']}/resume-1")
    assert f"{instance}/{manifest.MANIFEST_NAME}" not in names  # not complete

    registry = CollectorRegistry()
    again = await start_daemon(tier["settings"](pack_max_bytes="64KiB"), registry=registry)
    deep2 = _store(again).deep
    assert deep2 is not None and deep2.instance == instance  # stable across restarts
    await _offloaded(again)
    assert deep2.offloaded("resume-1")
    # Only what was not copied yet was copied again.
    assert metric(registry, "shuffled_deep_offloaded_packs_total") == packs - copied_before
    objects = _objects(tier["fs"], f"{tier['base']}/resume-1")
    assert {n.split("/")[0] for n in objects} == {instance}
    assert len([n for n in objects if n.endswith(".pack")]) == packs
    assert f"{instance}/{manifest.MANIFEST_NAME}" in objects
    # Every pack in the tier is the local one, exactly.
    key = crypt.task_key(tier["secret"], "resume-1")
    local = sorted(p.read_bytes() for loc in slow.locations
                   for p in pack_files(loc.path, "resume-1"))
    assert sorted(crypt.decrypt(key, "resume-1", f"resume-1/{n}", d)
                  for n, d in objects.items() if n.endswith(".pack")) == local
    assert len(sent) == 8


async def test_reads_fall_back_to_the_tier_with_the_same_answers(
        tier: dict[str, Any], start_daemon: Any) -> None:
    registry = CollectorRegistry()
    settings = tier["settings"](pack_max_bytes="8KiB")
    client = await start_daemon(settings, registry=registry)
    sent = await _fill(client, "fallback-1", subs=3, pids=3)
    sent2 = await _fill(client, "fallback-2", subs=2, pids=2)
    await _offloaded(client)
    before = await _answers(client, "fallback-1", sent)
    before2 = await _answers(client, "fallback-2", sent2)
    assert metric(registry, "shuffled_deep_read_bytes_total") == 0

    # Every pack of fallback-1 gone from its location (evicted, or lost by hand).
    gone = [p for loc in settings.locations for p in pack_files(loc.path, "fallback-1")]
    assert len(gone) > 2
    for path in gone:
        path.unlink()
    assert await _answers(client, "fallback-1", sent) == before
    read = metric(registry, "shuffled_deep_read_bytes_total")
    assert read == _store(client).deep.stats.read_bytes > 0
    assert not any(p.exists() for p in gone)  # served from the cache, not put back
    assert await _answers(client, "fallback-1", sent) == before  # cached: read once
    assert metric(registry, "shuffled_deep_read_bytes_total") == read

    # A location out of service: its packs of fallback-2 come from the tier too.
    store = _store(client)
    store.locations[0].mark_unhealthy("test: disk failed")
    assert await _answers(client, "fallback-2", sent2) == before2
    assert metric(registry, "shuffled_deep_read_bytes_total") > read
    assert metric(registry, "shuffled_deep_errors_total") == 0


async def test_delete_and_expiry_leave_nothing_under_the_task_prefix(
        tier: dict[str, Any], start_daemon: Any) -> None:
    settings = tier["settings"]()
    client = await start_daemon(settings)
    await _fill(client, "gone-1")
    await _fill(client, "gone-2")
    await _offloaded(client)
    fs = tier["fs"]
    assert _objects(fs, f"{tier['base']}/gone-1") and _objects(fs, f"{tier['base']}/gone-2")
    # A pack read back first, so that the cache has something to remove too.
    for loc in settings.locations:
        for path in pack_files(loc.path, "gone-1"):
            path.unlink()
    resp = await client.get(f"{PREFIX}/tasks/gone-1/partition", params=_q(0))
    assert resp.status == 200
    assert any((loc.path / ".shuffled" / CACHE_DIR / "gone-1").exists()
               for loc in settings.locations)

    resp = await client.delete(f"{PREFIX}/tasks/gone-1")
    assert resp.status == 200
    assert _objects(fs, f"{tier['base']}/gone-1") == {}
    assert fs.get_file_info(pafs.FileSelector(f"{tier['base']}/gone-1", allow_not_found=True,
                                              recursive=True)) == []
    for loc in settings.locations:
        assert not (loc.path / ".shuffled" / CACHE_DIR / "gone-1").exists()
        assert not (loc.path / ".shuffled" / "deep" / "gone-1.json").exists()

    # Expiry takes the same path (Store.delete_task with the access count it saw).
    store = _store(client)
    entry = store.task("gone-2")
    assert entry is not None
    assert await store.delete_task("gone-2", if_accesses=entry.accesses) is not None
    assert fs.get_file_info(pafs.FileSelector(f"{tier['base']}/gone-2", allow_not_found=True,
                                              recursive=True)) == []
    assert _objects(fs, tier["base"]) == {}


async def test_deep_storage_is_off_by_default_and_needs_a_key(
        make_settings: Callable[..., Any], tmp_path: Path, start_daemon: Any) -> None:
    registry = CollectorRegistry()
    client = await start_daemon(make_settings(), registry=registry)
    assert _store(client).deep is None
    assert metric(registry, "shuffled_deep_offloaded_bytes_total") == 0
    with pytest.raises(ConfigError, match="deep_storage_key_file"):
        make_settings(deep_storage="s3://bucket/prefix")
    short = tmp_path / "short.key"
    short.write_text("too short")
    with pytest.raises(ConfigError, match="shorter than 32"):
        make_settings(deep_storage="s3://bucket/prefix", deep_storage_key_file=str(short))
    with pytest.raises(ConfigError, match="deep_storage"):
        make_settings(deep_storage="file:///tmp/x")


def _put(url: str, body: bytes | None = None, json_body: Any = None) -> int:
    import json
    import urllib.request

    data = body if json_body is None else json.dumps(json_body).encode()
    kind = "application/json" if body is None else "application/vnd.apache.arrow.stream"
    request = urllib.request.Request(url, data=data, method="PUT",
                                     headers={"Content-Type": kind})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return int(resp.status)


def test_a_daemon_killed_mid_offload_resumes_after_restart(tier: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """SIGKILL (no chance to stop cleanly) after the first pack reached the tier; the
    daemon restarted on the same locations finishes the copy under the same name."""
    from tests.helpers.procs import DaemonProcess, http_get, metric_value, wait_for

    locations = [tmp_path / "k0", tmp_path / "k1"]
    deep = ["--deep-storage", f"s3://{tier['base']}",
            "--deep-storage-key-file", str(tmp_path / "deep.key")]
    slow = DaemonProcess(locations, *deep, "--pack-max-bytes", "64KiB",
                         "--deep-storage-concurrency", "1", "--deep-storage-bandwidth", "200KB",
                         log_path=tmp_path / "first.log")
    url = slow.start()
    try:
        task = f"{url}{PREFIX}/tasks/killed-1"
        query = "&".join(f"{k}={v}" for k, v in DAY.items())
        for s in range(2):
            for p in range(4):
                assert _put(f"{task}/sub{s}/partition?{query}&partitionId={p}",
                            _arrow(_table(s * 10 + p, blob=100_000))) == 201
        assert _put(f"{task}/seal", json_body={"subTaskIds": ["sub0", "sub1"]}) == 200

        def copied() -> float:
            text = http_get(f"{url}/metrics")[2].decode()
            return metric_value(text, "shuffled_deep_offloaded_packs_total") or 0.0
        wait_for(lambda: copied() >= 1, "the first pack's copy", timeout=WAIT)
    finally:
        slow.kill()
    packs = sum(len(pack_files(loc, "killed-1")) for loc in locations)
    first = _objects(tier["fs"], f"{tier['base']}/killed-1")
    (instance,) = {n.split("/")[0] for n in first}
    assert f"{instance}/{manifest.MANIFEST_NAME}" not in first
    assert 1 <= len(first) < packs

    with DaemonProcess(locations, *deep, log_path=tmp_path / "second.log") as again:
        def done() -> bool:
            text = http_get(f"{again.url}/metrics")[2].decode()
            return metric_value(text, "shuffled_deep_offload_pending_tasks") == 0
        wait_for(done, "the resumed offload", timeout=WAIT)
        text = http_get(f"{again.url}/metrics")[2].decode()
        assert metric_value(text, "shuffled_deep_errors_total") == 0, again.log_tail()
    objects = _objects(tier["fs"], f"{tier['base']}/killed-1")
    assert {n.split("/")[0] for n in objects} == {instance}
    assert f"{instance}/{manifest.MANIFEST_NAME}" in objects, sorted(objects)
    key = crypt.task_key(tier["secret"], "killed-1")
    local = sorted(p.read_bytes() for loc in locations for p in pack_files(loc, "killed-1"))
    assert sorted(crypt.decrypt(key, "killed-1", f"killed-1/{n}", d)
                  for n, d in objects.items() if n.endswith(".pack")) == local


def test_a_daemon_without_deep_storage_never_loads_the_tier() -> None:
    """pyarrow.fs (S3) and cryptography cost ~11 MiB of RSS: only deep storage loads them."""
    code = ("import sys, shuffled.server.app, shuffled.cli\n"
            "print(sorted(m for m in ('pyarrow.fs', 'cryptography') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done

"""Process lifecycle and admission: SIGTERM drains, overload answers 503 + Retry-After."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from shuffled.crc import crc32c
from shuffled.protocol import format_crc32c
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, committed_bytes, data_size, files_under, pack_files,
    sample_table, stored_stream,
)
from tests.helpers.procs import host_port

ROOT = Path(__file__).parents[2]


def _status_of(url: str) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers)


def test_sigterm_finishes_in_flight_upload_refuses_new_and_exits_0(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "shuffled", "serve", "--port", "0", "--location",
         str(tmp_path / "loc"), "--free-space-reserve", "0", "--shutdown-timeout", "30",
         "--access-log", "false"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
    )
    try:
        line = proc.stdout.readline()  # bounded: the daemon prints it once bound, or exits
        assert line.startswith("shuffled listening on http://"), line + proc.stderr.read()
        base = line.split()[-1]
        host, port = host_port(base)
        body = arrow_bytes(sample_table(5000))
        half = len(body) // 2
        sock = socket.create_connection((host, port), timeout=30)
        path = f"{PREFIX}/tasks/sup/s1/partition?start=2018-01-01&end=2018-01-02&partitionId=0"
        sock.sendall(
            f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
            f"Content-Digest: {format_crc32c(crc32c(body))}\r\n"
            f"Content-Type: application/vnd.apache.arrow.stream\r\n\r\n".encode() + body[:half])
        # Wait (bounded) until the daemon has the upload in flight.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            status = urllib.request.urlopen(f"{base}/status", timeout=5).read()
            if b'"uploads": 1' in status:
                break
            time.sleep(0.02)  # poll interval of a bounded wait, not synchronisation
        else:
            raise AssertionError("upload never became in flight")
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            code, headers = _status_of(f"{base}{PREFIX}/tasks")
            if code == 503:
                assert headers["Retry-After"].isdigit()
                break
            time.sleep(0.02)
        else:
            raise AssertionError("draining daemon never answered 503")
        assert _status_of(f"{base}/status/health")[0] == 200
        sock.sendall(body[half:])
        reply = sock.recv(65536).decode()
        assert reply.startswith("HTTP/1.1 201"), reply
        sock.close()
        assert proc.wait(timeout=40) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    # Committed before the exit: one partial in the catalog, its pack holding exactly it.
    (row,) = catalog_rows(tmp_path / "loc", "sup")
    packs = pack_files(tmp_path / "loc")
    assert len(packs) == 1 and row[7] == len(body)
    assert data_size(packs[0]) == len(body) - 8  # the stream but its end-of-stream marker
    assert stored_stream(tmp_path / "loc", "sup", row) == body


async def test_uploads_beyond_the_limit_get_503_and_nothing_is_kept(start_daemon,
                                                                    make_settings) -> None:
    settings = make_settings(max_concurrent_uploads=2)
    client = await start_daemon(settings)
    body = arrow_bytes(sample_table(2000))
    gate = asyncio.Event()

    async def slow_body():
        yield body[:100]
        await gate.wait()
        yield body[100:]

    params = {**DAY, "partitionId": 0}
    slow = [asyncio.create_task(client.put(f"{PREFIX}/tasks/sup/slow{i}/partition",
                                           params=params, data=slow_body())) for i in range(2)]

    async def both_in_flight() -> None:
        while True:
            status = await (await client.get("/status")).json()
            if status["inFlight"]["uploads"] == 2:
                return
            await asyncio.sleep(0.01)

    await asyncio.wait_for(both_in_flight(), timeout=20)
    refused = await client.put(f"{PREFIX}/tasks/sup/extra/partition", params=params, data=body)
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert (await refused.json())["code"] == "overloaded"
    gate.set()
    for task in slow:
        assert (await asyncio.wait_for(task, 20)).status == 201
    accepted = await client.put(f"{PREFIX}/tasks/sup/extra/partition", params=params, data=body)
    assert accepted.status == 201
    names = sorted(r[0] for loc in settings.locations for r in catalog_rows(loc.path, "sup"))
    assert names == ["extra", "slow0", "slow1"]
    # The refused upload left no bytes: the packs hold exactly the three stored bodies.
    assert sum(data_size(p) for loc in settings.locations
               for p in files_under(loc.path)) == sum(
        committed_bytes(loc.path, "sup") for loc in settings.locations)


async def test_a_stalled_upload_is_abandoned_with_408_and_frees_its_slot(
        start_daemon, make_settings) -> None:
    settings = make_settings(max_concurrent_uploads=1, upload_idle_timeout=0.3)
    client = await start_daemon(settings)
    body = arrow_bytes(sample_table(2000))
    gate = asyncio.Event()

    async def stalled_body():
        yield body[:100]
        await gate.wait()  # never set before the daemon gives up
        yield body[100:]

    params = {**DAY, "partitionId": 0}
    stalled = await asyncio.wait_for(
        client.put(f"{PREFIX}/tasks/sup/stalled/partition", params=params, data=stalled_body()),
        timeout=20)
    assert stalled.status == 408
    assert (await stalled.json())["code"] == "request_timeout"
    gate.set()
    status = await (await client.get("/status")).json()
    assert status["inFlight"]["uploads"] == 0  # the only slot is free again
    accepted = await client.put(f"{PREFIX}/tasks/sup/next/partition", params=params, data=body)
    assert accepted.status == 201
    names = [r[0] for loc in settings.locations for r in catalog_rows(loc.path, "sup")]
    assert names == ["next"]  # nothing of the stalled upload...
    assert sum(data_size(p) for loc in settings.locations  # ...not even its bytes
               for p in files_under(loc.path)) == len(body) - 8  # (no end marker stored)
    assert not [p for loc in settings.locations for p in (loc.path / ".tmp").iterdir()]

"""Phase 2 learns the driver's verdict (issue 22).

The daemon's route (``PUT``/``GET .../tasks/{sup}/lost``): recorded, idempotent, bounded,
bad bodies refused. Then a real ingestion (Spark local, three real daemon processes on
loopback) whose daemon 0 is SIGKILLed by a merge task after its first batch, with
``shuffleRetrySeconds`` 120: the output equals DuckDB's rollup of the input, and the merge
tasks report the partitions they could not read within seconds of the kill (the driver
declared the daemon lost and told the survivors), not after 120 s.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shuffled.errors import Overloaded
from pyspark import cloudpickle

from shuffled.client import RetryPolicy, ShuffleClient, ShuffleUnavailable
from shuffled.spark.hooks import Hooks
from shuffled.spark.phase2.verdict import Verdict
from shuffled.storage.tasks.verdicts import Verdicts
from tests.helpers.ingestion import (  # noqa: F401  (spark: a fixture)
    assert_matches, base_spec, expected_rollup, free_port, generate, read_output, spark,
    write_parts,
)
from tests.helpers.procs import DaemonProcess, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hooks go to executors

PREFIX = "/druid/worker/v1/shuffle"
RETRY_SECONDS = 120
TARGET = 5.0  # seconds from the kill to the merge tasks moving on
MARGIN = 3.0  # a shared, loaded machine


# --- the daemon's route -----------------------------------------------------------------

async def test_lost_route_put_get_idempotent_and_bad_bodies(daemon: Any) -> None:
    path = f"{PREFIX}/tasks/sup1/lost"
    resp = await daemon.get(path)
    assert resp.status == 200 and await resp.json() == {"supervisorTaskId": "sup1", "lost": []}
    a, b = "http://127.0.0.1:4001", "http://127.0.0.1:4002"
    resp = await daemon.put(path, json={"lost": [a]})
    assert resp.status == 200
    assert await resp.json() == {"supervisorTaskId": "sup1", "lost": [a], "new": True}
    resp = await daemon.put(path, json={"lost": [a]})  # the same again: nothing new
    assert (await resp.json())["new"] is False
    resp = await daemon.put(path, json={"lost": [b, a]})
    assert await resp.json() == {"supervisorTaskId": "sup1", "lost": [a, b], "new": True}
    resp = await daemon.get(path)
    assert (await resp.json())["lost"] == [a, b]
    assert (await (await daemon.get(f"{PREFIX}/tasks/other/lost")).json())["lost"] == []
    assert (await daemon.get(f"{PREFIX}/tasks/sup1")).status == 404  # the task not created
    for body in (b"not json", b"[]", b'{"lost": "http://x"}', b'{"lost": [1]}',
                 b'{"lost": ["ftp://x"]}', b'{"lost": ["http://a b"]}', b"{}",
                 json.dumps({"lost": [f"http://h{i}" for i in range(1001)]}).encode()):
        resp = await daemon.put(path, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400, body
        assert (await resp.json())["code"] == "invalid_body"
    resp = await daemon.put(f"{PREFIX}/tasks/.bad/lost", json={"lost": [a]})
    assert resp.status == 400 and (await resp.json())["code"] == "invalid_id"
    assert (await (await daemon.get(path)).json())["lost"] == [a, b]  # refusals left it


async def test_lost_route_needs_the_token(start_daemon: Any, make_settings: Any,
                                          tmp_path: Path) -> None:
    client = await start_daemon(make_settings([str(tmp_path / "a")], auth_token="s3cret"))
    path = f"{PREFIX}/tasks/sup1/lost"
    assert (await client.put(path, json={"lost": ["http://x:1"]})).status == 401
    assert (await client.get(path)).status == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert (await client.put(path, json={"lost": ["http://x:1"]}, headers=auth)).status == 200
    resp = await client.get(path, headers=auth)
    assert (await resp.json())["lost"] == ["http://x:1"]


def test_verdicts_are_bounded_and_expire() -> None:
    """Bounded in bytes (a declaration past the budget is refused, no other task's verdict
    is forgotten for it) and in addresses per task; forgotten after the ttl."""
    now = [0.0]
    one = 200 + len("http://d0") + 60  # what a task with one such address costs
    v = Verdicts(ttl=10.0, max_bytes=3 * one + 2 * (len("http://e0") + 60), max_lost=4,
                 clock=lambda: now[0])
    for i in range(3):
        v.declare(f"t{i}", [f"http://d{i}"])
    with pytest.raises(Overloaded):
        v.declare("t3", ["http://d3"])
    assert len(v) == 3 and v.lost("t0") == {"http://d0"} and v.lost("t3") == frozenset()
    lost, new = v.declare("t2", [f"http://e{i}" for i in range(2)])
    assert len(lost) == 3 and new
    with pytest.raises(Overloaded):  # the bytes, before the per-task cap of 4
        v.declare("t2", [f"http://e{i}" for i in range(10)])
    now[0] = 10.5
    assert v.lost("t2") == frozenset() and len(v) == 2  # forgotten after the ttl
    lost, new = v.declare("t3", [f"http://f{i}" for i in range(10)])
    assert len(lost) == 4 and new  # the per-task cap
    assert v.bytes <= v.max_bytes


def test_a_read_gives_up_once_a_survivor_names_the_daemon(daemon_url: str) -> None:
    """The executor side alone: reads of a daemon that refuses connections stop when a
    survivor says it was declared lost, long before their retry budget."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    verdict = Verdict("sup1", [dead, daemon_url], set())
    policy = verdict.policy(RetryPolicy(attempts=1000, backoff=0.05, max_backoff=0.2,
                                        deadline=RETRY_SECONDS), dead)
    with ShuffleClient(daemon_url) as survivor:
        survivor.declare_lost("sup1", [dead])
    started = time.monotonic()
    with ShuffleClient(dead, retry=policy) as client, pytest.raises(ShuffleUnavailable) as err:
        client.list_tasks()
    assert time.monotonic() - started < 2.0
    assert "declared lost by the driver" in str(err.value)
    assert verdict.asked == 1  # asked once, on the first failure
    verdict.close()


def test_reads_that_succeed_never_ask(daemon_url: str) -> None:
    verdict = Verdict("sup1", [daemon_url, "http://127.0.0.1:1"], set())
    with ShuffleClient(daemon_url, retry=verdict.policy(RetryPolicy(), daemon_url)) as c:
        for _ in range(20):
            c.list_tasks()
    assert verdict.asked == 0


def test_the_monitor_declares_a_refusing_daemon_and_tells_the_survivors(
        daemon_url: str) -> None:
    from shuffled.spark.driver.monitor import Monitor

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monitor = Monitor("sup1", [daemon_url, dead], token=None, ca_file=None)
    started = time.monotonic()
    monitor.start()
    try:
        with ShuffleClient(daemon_url) as survivor:
            wait_for(lambda: survivor.lost_daemons("sup1") == [dead], "the verdict", 10.0,
                     interval=0.05)
        took = time.monotonic() - started
    finally:
        monitor.stop()
    assert took < 2.0 + 0.5 + 1.5  # a heartbeat period, the refused grace, a margin
    assert list(monitor.declared) == [dead] and monitor.declared_after[dead] >= 0.5


# --- a real ingestion ---------------------------------------------------------------------

def _append(path: str, record: dict[str, Any]) -> None:
    # One write on an O_APPEND file: lines from several worker processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


@dataclass
class KillInPhase2(Hooks):
    """SIGKILL daemons the test started (by pid) once a merge task has fetched a batch,
    recording when (once, across worker processes); record each Lost report."""

    pids: tuple[int, ...]
    log: str

    def phase2_fetched(self, batches: int) -> None:
        try:  # the first merge task to get here kills; the others find it done
            os.close(os.open(self.log + ".killed", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        for pid in self.pids:
            os.kill(pid, signal.SIGKILL)
        _append(self.log, {"kill": time.time()})

    def phase2_lost(self, partition: int, servers: tuple[str, ...], why: str) -> None:
        _append(self.log, {"lost": time.time(), "partition": partition,
                           "servers": list(servers), "why": why})


@pytest.fixture
def three_daemons(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    daemons = [DaemonProcess([tmp_path / f"d{i}"], "--port", str(free_port()),
                             log_path=tmp_path / f"d{i}.log") for i in range(3)]
    try:
        for d in daemons:
            d.start()
        yield daemons
    finally:
        for d in daemons:  # only the processes this fixture started, by pid
            if d.proc is not None:
                if d.proc.poll() is None:
                    d.stop()
                else:
                    d.proc.wait(timeout=30)


@pytest.mark.spark
@pytest.mark.parametrize(("budget", "reader"), [
    (1 << 16, "jvm"), (1 << 19, "jvm"),  # partials
    (1 << 19, "native"),  # numShards read natively: slabs (docs/slab.md)
], ids=["paged", "bulk", "slabs"])
def test_merge_tasks_move_on_within_seconds_of_a_sigkill(
        spark: Any, tmp_path: Path, three_daemons: list[DaemonProcess], budget: int,
        reader: str) -> None:
    from shuffled.spark import run_ingestion

    lines, good, _ = generate(12_000, seed=7)
    write_parts(lines, tmp_path / "input", parts=4)
    # Small in-memory bounds: each merge task reads its partitions in several batches, so
    # it reads from the victim after the kill: streamed in pages one partition at a time
    # (64 KiB), or a few partitions a bulk read (512 KiB).
    # Slabs are read 128 shards a batch: enough of them that a task reads in several.
    shards = 4 if reader == "jvm" else 400
    spec = base_spec(tmp_path / "input", {"type": "hashed", "numShards": shards},
                     maxRowsInMemory=1000, maxBytesInMemory=budget,
                     maxNumConcurrentSubTasks=4, totalNumMergeTasks=2,
                     shuffleRetrySeconds=RETRY_SECONDS)
    victim = three_daemons[0]
    log = str(tmp_path / "events.jsonl")
    hooks = KillInPhase2((victim.pid,), log)
    started = time.monotonic()
    result = run_ingestion(spec, shuffle_servers=[d.url for d in three_daemons],
                           output_dir=str(tmp_path / "out"), hooks=hooks, reader=reader)
    generation = result.report["phases"]["partialSegmentGeneration"]
    assert bool(generation["slabs"]) == (reader == "native")
    took = time.monotonic() - started
    assert victim.proc is not None and victim.proc.wait(timeout=30) == -signal.SIGKILL

    # (a) exact: row for row DuckDB's rollup of the input
    _, out = read_output(tmp_path / "out")
    assert_matches(out, expected_rollup(good))

    # (b) the merge tasks moved on within seconds of the kill, told by the driver's verdict
    events = [json.loads(x) for x in Path(log).read_text().splitlines()]
    killed = min(e["kill"] for e in events if "kill" in e)
    lost = [e for e in events if "lost" in e]
    assert lost, "no merge task read from the killed daemon"
    first = min(e["lost"] for e in lost) - killed
    last = max(e["lost"] for e in lost) - killed
    print(f"\nkill -> first Lost report {first:.2f} s, last {last:.2f} s; ingestion {took:.1f} s;"
          f" {len(lost)} Lost; {sorted({e['why'][:60] for e in lost})}")
    assert first < TARGET + MARGIN, (first, lost[:3])
    assert last < TARGET + MARGIN, (last, lost[-3:])
    assert all(e["servers"] == [victim.url] for e in lost)
    assert any("declared lost by the driver" in e["why"] for e in lost), lost[:3]
    rec = result.report["recovery"]
    assert list(rec["lostDaemons"]) == [victim.url]
    assert list(rec["declaredLost"]) == [victim.url]
    assert rec["partitionsRemerged"] >= 1
    assert [r["when"] for r in rec["rounds"]][:1] == ["during phase 2"]
    assert took < RETRY_SECONDS / 2  # nobody waited for the read budget

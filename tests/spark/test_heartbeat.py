"""The supervisor's heartbeat on a real daemon, and the phase-1 placement that fails over
past daemons that are gone (a closed port) or draining, on real daemons."""

from __future__ import annotations

from dataclasses import replace

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp.test_utils import TestClient

from shuffled.client import ShuffleClient
from shuffled.spark.records import Partial
from shuffled.protocol import API_PREFIX, Interval, PartialKey
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.server.state import STATE
from shuffled.spark.driver import recompute
from shuffled.spark.phase1.ring import AllDaemonsFailed, Placer, RetryPolicy, ring
from shuffled.spark.rows.rollup import to_ipc
from tests.helpers.clock import Clock

PREFIX = f"{API_PREFIX}/tasks"


async def test_heartbeat_refreshes_expiry_and_answers_while_draining(
        start_daemon: Callable[..., Any], make_settings: Callable[..., Any]) -> None:
    clock = Clock()
    daemon: TestClient = await start_daemon(make_settings(expiry_timeout=60), clock=clock)
    body = to_ipc(pa.table({"x": [1, 2, 3]}))
    key = PartialKey("sup", "s1", Interval(0, 86_400_000), 0)
    assert (await daemon.put(key.path(), params=key.query(), data=body)).status == 201
    first = await (await daemon.post(f"{PREFIX}/sup/heartbeat")).json()
    assert first["held"] and first["partials"] == 1 and first["bytes"] > 0
    assert not first["draining"] and first["instance"]
    state = daemon.server.app[STATE]
    # 50 s later a heartbeat: the task's expiry starts again, so a sweep at 100 s keeps it.
    clock.now += 50
    await daemon.post(f"{PREFIX}/sup/heartbeat")
    clock.now += 50
    assert state.sweeper is not None
    await state.sweeper.run_once()
    assert state.store.task("sup") is not None
    clock.now += 61  # no heartbeat for longer than the timeout: swept
    await state.sweeper.run_once()
    assert state.store.task("sup") is None
    # A task not held is not created by a heartbeat.
    none = await (await daemon.post(f"{PREFIX}/other/heartbeat")).json()
    assert not none["held"] and state.store.task("other") is None
    # Draining: every other request gets 503, the heartbeat says so.
    state.drain.draining = True
    try:
        beat = await daemon.post(f"{PREFIX}/sup/heartbeat")
        assert beat.status == 200 and (await beat.json())["draining"] is True
        assert (await daemon.get(f"{PREFIX}")).status == 503
    finally:
        state.drain.draining = False
    assert (await (await daemon.post(f"{PREFIX}/sup/heartbeat")).json())["instance"] == \
        first["instance"]


@pytest.fixture
def two(tmp_path: Path) -> Iterator[list[str]]:
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0) as a, \
            EmbeddedDaemon([tmp_path / "b"], free_space_reserve=0) as b:
        yield [a, b]


def _closed_port() -> str:
    with socket.socket() as s:  # bound, never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _flush(sup: str, sub: str) -> list[tuple[PartialKey, bytes]]:
    body = to_ipc(pa.table({"x": list(range(10))}))
    return [(PartialKey(sup, sub, Interval(0, 10), p), body) for p in range(3)]


FAST = RetryPolicy(attempts=2, backoff=0.05, max_backoff=0.1, deadline=2.0)


def test_placement_fails_over_past_a_dead_daemon_in_ring_order(two: list[str]) -> None:
    dead = _closed_port()
    servers = (dead, *two)
    assert ring(servers, 0) == servers and ring(servers, 4) == (two[0], two[1], dead)
    placer = Placer(servers, 0, 1, None, None, retry=FAST)
    try:
        placed = placer.put("sup", lambda: iter(_flush("sup", "p0-a1-f0")))
        assert placed.servers == (two[0],) and placed.failovers == 1
        assert placer.down == {dead} and "refused" in placer.errors[dead].lower()
        # The dead daemon is not asked again by this task: no second failover.
        again = placer.put("sup", lambda: iter(_flush("sup", "p0-a1-f1")))
        assert again.servers == (two[0],) and again.failovers == 0
    finally:
        placer.close()
    with ShuffleClient(two[0]) as c:
        assert c.task("sup")["files"] == 6  # type: ignore[index]


def test_replicas_land_on_distinct_daemons_and_all_gone_is_one_error(two: list[str]) -> None:
    placer = Placer(tuple(two), 1, 2, None, None, retry=FAST)
    try:
        placed = placer.put("rep", lambda: iter(_flush("rep", "p1-a2-f0")))
        assert placed.servers == (two[1], two[0]) and len(placed.answers) == 3
    finally:
        placer.close()
    for url in two:
        with ShuffleClient(url) as c:
            assert c.task("rep")["files"] == 3  # type: ignore[index]
    gone = Placer((_closed_port(), _closed_port()), 0, 1, None, None, retry=FAST)
    with pytest.raises(AllDaemonsFailed, match="no shuffle daemon took"):
        gone.put("x", lambda: iter(_flush("x", "p0-a0-f0")))


def test_recompute_replaces_exactly_the_lost_keys_of_the_lost_subtasks() -> None:
    def p(task: int, flush: int, start: int, part: int, *servers: str) -> Partial:
        return Partial(task=task, sub=f"p{task}-a{task + 10}-f{flush}", start=start,
                       end=start + 1, partition=part, server=servers[0],
                       replicas=tuple(servers), rows=1, bytes=1)

    partials = [p(0, 0, 0, 0, "A"), p(0, 0, 0, 1, "A"), p(0, 1, 0, 0, "B"),  # task 0
                p(1, 0, 0, 0, "B"), p(1, 0, 1, 0, "A", "C"),  # task 1: replicated on C
                p(2, 0, 1, 1, "C")]
    only = recompute.lost_keys(partials, {"A"})
    assert only == {0: frozenset({(0, 0), (0, 1)})}  # task 1's partial has a replica
    redone = [replace(p(0, 0, 0, 0, "B"), sub="p0-a99-f0"),
              replace(p(0, 0, 0, 1, "C"), sub="p0-a99-f0")]
    after = recompute.replace(partials, only, redone)
    # Task 0's flush 1 on B held key (0, 0) too: dropped, since the recompute has its rows.
    assert sorted((x.task, x.sub, x.start, x.partition) for x in after) == [
        (0, "p0-a99-f0", 0, 0), (0, "p0-a99-f0", 0, 1), (1, "p1-a11-f0", 0, 0),
        (1, "p1-a11-f0", 1, 0), (2, "p2-a12-f0", 1, 1)]
    assert recompute.lost_keys(partials, {"A"}, wanted={(0, 1, 1)}) == {0: frozenset({(0, 1)})}
    assert recompute.on_daemons(after)["C"] == {"p0-a99-f0", "p1-a11-f0", "p2-a12-f0"}


def test_a_recompute_keeps_exactly_the_rows_of_the_lost_keys() -> None:
    import numpy as np

    from shuffled.spark.phase1.tasks import only_keys as _only
    from shuffled.spark.rows.rollup import BUCKET, CHUNK

    rng = np.random.default_rng(3)
    n = 20_000
    chunks = rng.integers(0, 50, n) * 86_400_000 + 1_420_070_400_000
    parts = rng.integers(0, 3, n)
    keep = frozenset((int(c) * 86_400_000 + 1_420_070_400_000, p)
                     for c in range(0, 60, 2) for p in (0, 2))  # some chunks are absent
    table = pa.table({CHUNK: chunks, BUCKET: parts.astype(np.int32), "i": np.arange(n)})
    wanted = np.array([(int(c), int(p)) in keep for c, p in zip(chunks, parts)])
    got, _ = _only(table, None, keep)  # partitions in the __bucket column (JVM rows)
    assert got.column("i").to_pylist() == np.nonzero(wanted)[0].tolist()
    other = rng.integers(0, 4, n)  # partitions computed after the rollup (native rows)
    wanted = np.array([(int(c), int(p)) in keep for c, p in zip(chunks, other)])
    got, buckets = _only(table, other, keep)
    assert got.column("i").to_pylist() == np.nonzero(wanted)[0].tolist()
    assert buckets.tolist() == other[wanted].tolist()


def test_a_daemon_older_than_the_heartbeat_counts_as_alive() -> None:
    """A daemon of an earlier version answers the heartbeat's route 404 (as any unknown
    route): it answered, so it is alive, not lost. It stands in here as a loopback HTTP
    server answering every POST like that (an older release cannot be installed here)."""
    import http.server
    import json
    import threading

    from shuffled.spark.driver.monitor import Monitor

    class Old(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps({"error": "no such route", "code": "not_found"}).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Old)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    dead = _closed_port()
    try:
        monitor = Monitor("sup", [url, dead], token=None, ca_file=None)
        assert monitor.beat(url) and monitor.live[url].failing_since is None
        assert not monitor.beat(dead) and monitor.live[dead].refused
        assert list(monitor.verdict()) == [dead]  # the old one is alive, the closed port gone
    finally:
        server.shutdown()
        server.server_close()


def test_a_phase_quicker_than_a_tick_still_shows_its_progress_once() -> None:
    """A phase whose Spark jobs start and finish between two ticks of the progress thread
    is shown when it ends (JobContext.settle), once, before its summary line."""
    from shuffled.spark.driver.monitor import Monitor

    shown: list[str] = []
    now = ["determine partitions: 2/2 tasks done"]
    monitor = Monitor("sup", [], token=None, ca_file=None, progress=shown.append,
                      status=lambda: now[0])
    monitor.settle()
    monitor.settle()  # already shown: not again
    assert shown == ["determine partitions: 2/2 tasks done"]
    now[0] = "phase 1 (partial segments): 4/4 tasks done"
    monitor.settle()
    assert shown[-1] == now[0] and len(shown) == 2

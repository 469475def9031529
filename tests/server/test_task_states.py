"""Task states are durable and a delete is atomic (issue 34): a reader sees the whole task
or nothing, across expiry, restarts and a SIGKILL at any point of a DELETE, a seal or a
fail. Real daemons (``python -m shuffled serve`` for the crash loops) on loopback, the
real client, real files.
"""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import pyarrow as pa
import pytest

from shuffled.client import ShuffleClient
from shuffled.errors import Conflict
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import PREFIX, arrow_bytes, sample_table
from tests.helpers.clients import FAST
from tests.helpers.procs import DaemonProcess, host_port

DAY = 86_400_000
SUBS = [f"s{i}" for i in range(12)]
ROWS_EACH = 1000


def _key(sup: str) -> PartitionKey:
    return PartitionKey(sup, Interval(0, DAY), 0)


def _fill(url: str, sup: str) -> None:
    """12 subtasks of 1,000 rows each (single PUTs: placed round-robin over the
    locations), then the seal."""
    key = _key(sup)
    with ShuffleClient(url, retry=FAST) as c:
        for i, sub in enumerate(SUBS):
            c.put_partial(PartialKey(sup, sub, key.interval, 0),
                          arrow_bytes(sample_table(ROWS_EACH, seed=i)))
        c.seal(sup, SUBS)


def _read(url: str, sup: str) -> tuple[int, bool, str]:
    """Every page of the partition from token 0 without waiting: (rows, complete, state)."""
    rows, token = 0, 0
    with ShuffleClient(url, retry=FAST) as c:
        for _ in range(1000):
            page = c.read_page(_key(sup), token, max_bytes=1 << 20)
            if page.body:
                rows += pa.ipc.open_stream(page.body).read_all().num_rows
            if page.complete or page.next_token == token:
                return rows, page.complete, page.state
            token = page.next_token
    raise AssertionError("more than 1,000 pages")


def _whole_or_nothing(url: str, sup: str) -> tuple[int, bool, str]:
    rows, complete, state = _read(url, sup)
    assert (complete and rows == len(SUBS) * ROWS_EACH) or (not complete and rows in (0, len(SUBS) * ROWS_EACH)), \
        f"{sup}: complete={complete} with {rows} of {len(SUBS) * ROWS_EACH} rows (state {state})"
    if complete:
        assert state == "sealed"
    return rows, complete, state


def _send(url: str, method: str, path: str) -> socket.socket:
    """Send a request and do not wait for its answer (the daemon is killed meanwhile)."""
    host, port = host_port(url)
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(f"{method} {PREFIX}{path} HTTP/1.1\r\nHost: {host}\r\n"
                 f"Content-Length: 0\r\n\r\n".encode())
    return sock


def _daemon(tmp_path: Path) -> DaemonProcess:
    return DaemonProcess([tmp_path / "a", tmp_path / "b"], log_path=tmp_path / "daemon.log")


def test_a_failed_task_stays_failed_across_a_restart(tmp_path: Path) -> None:
    """A supervisor's fail verdict is durable: after a restart its reads are still
    "failed", never complete, and uploads are still refused (409)."""
    locations = [tmp_path / "a", tmp_path / "b"]
    with EmbeddedDaemon(locations, free_space_reserve=0) as url:
        _fill(url, "doomed")
        with ShuffleClient(url, retry=FAST) as c:
            c.fail("doomed")
    with EmbeddedDaemon(locations, free_space_reserve=0) as url:
        rows, complete, state = _read(url, "doomed")
        assert (rows, complete, state) == (0, False, "failed")
        with ShuffleClient(url, retry=FAST) as c:
            with pytest.raises(Conflict):
                c.put_partial(PartialKey("doomed", "late", Interval(0, DAY), 0),
                              arrow_bytes(sample_table(3)))
            with pytest.raises(Conflict):
                c.seal("doomed", SUBS)
            # DELETE ends it: the id may then start a new life
            c.delete_task("doomed")
    assert not any((loc / ".shuffled" / "failed" / "doomed.json").exists() for loc in locations)


def test_a_failed_task_stays_failed_past_its_expiry_while_read(tmp_path: Path) -> None:
    """The mark does not lapse at the expiry time while reads keep the task alive
    (``--expiry-timeout 1``; reads go on for 2.5 s, bounded)."""
    with EmbeddedDaemon([tmp_path / "a"], free_space_reserve=0, expiry_timeout=1.0,
                        max_age=1.0, sweep_period=0.2, failed_read_delay=0.05) as url:
        _fill(url, "doomed")
        with ShuffleClient(url, retry=FAST) as c:
            c.fail("doomed")
        until = time.monotonic() + 2.5
        reads = 0
        while time.monotonic() < until:
            rows, complete, state = _read(url, "doomed")
            assert not complete and rows == 0 and state == "failed", (rows, complete, state)
            reads += 1
        assert reads >= 5


def test_sigkill_during_a_delete_leaves_the_whole_task_or_nothing(tmp_path: Path) -> None:
    """SIGKILL 0-15 ms into a DELETE of a sealed task spread over two locations, then a
    restart: pages answer all 12,000 rows complete, or not complete and nothing. Six
    rounds at random points (seeded, printed on failure)."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    daemon = _daemon(tmp_path)
    daemon.start()
    try:
        for round_ in range(6):
            sup = f"del{round_}"
            _fill(daemon.url, sup)
            sock = _send(daemon.url, "DELETE", f"/tasks/{sup}")
            time.sleep(rng.uniform(0, 0.015))  # where in the DELETE the kill lands
            daemon.kill()
            sock.close()
            daemon.start()
            rows, complete, _ = _whole_or_nothing(daemon.url, sup)
            if rows:  # killed before the DELETE reached its tombstone: never begun
                with ShuffleClient(daemon.url, retry=FAST) as c:
                    c.delete_task(sup)
            # a DELETE that did not finish was finished at start: nothing of it is left
            for loc in daemon.locations:
                assert not (loc / sup).exists(), f"seed {seed}: {loc / sup} left"
                for kind in ("seals", "deleting"):
                    assert not (loc / ".shuffled" / kind / f"{sup}.json").exists(), \
                        f"seed {seed} round {round_}: a {kind} mark left"
    finally:
        daemon.stop()


def test_sigkill_during_a_fail_or_a_seal_leaves_a_consistent_state(tmp_path: Path) -> None:
    """SIGKILL at a random point of a seal, or of a fail right after a seal: after the
    restart a reader sees the whole sealed task, or a task that is not complete (and a
    fail that was answered is still a fail)."""
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    daemon = _daemon(tmp_path)
    daemon.start()
    try:
        for round_ in range(4):
            sup = f"seal{round_}"
            key = _key(sup)
            with ShuffleClient(daemon.url, retry=FAST) as c:
                for i, sub in enumerate(SUBS):
                    c.put_partial(PartialKey(sup, sub, key.interval, 0),
                                  arrow_bytes(sample_table(ROWS_EACH, seed=i)))
            sock = _send(daemon.url, "PUT", f"/tasks/{sup}/seal")  # no body: refused, but
            sock.close()  # ...a real seal follows
            with ShuffleClient(daemon.url, retry=FAST) as c:
                c.seal(sup, SUBS)
                if round_ % 2:
                    c.fail(sup)
                    answered = True
                else:
                    answered = False
            time.sleep(rng.uniform(0, 0.005))
            daemon.kill()
            daemon.start()
            rows, complete, state = _whole_or_nothing(daemon.url, sup)
            if answered:
                assert (rows, complete, state) == (0, False, "failed"), f"seed {seed}"
            else:
                assert (rows, complete, state) == (len(SUBS) * ROWS_EACH, True, "sealed")
    finally:
        daemon.stop()

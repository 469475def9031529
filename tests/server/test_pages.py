"""Paged partition reads, seals, long polls and failed tasks (Presto's data plane), against a
real daemon on loopback (on a background thread) with the real client."""

from __future__ import annotations

import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuffled.client import ShuffleClient
from shuffled.client.pages import NotComplete
from shuffled.errors import Conflict, TaskFailed
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server.embedded import EmbeddedDaemon
from tests.conftest import arrow_bytes, sample_table
from tests.helpers.clients import FAST
from tests.helpers.cutting_proxy import CuttingProxy

DAY = 86_400_000
KEY = PartitionKey("paged", Interval(0, DAY), 0)


def _partial(sub: str, rows: int, seed: int, batch_rows: int | None = None,
             dictionary: bool = False) -> tuple[PartialKey, bytes]:
    table = sample_table(rows, seed=seed)
    if dictionary:
        table = table.set_column(1, "dim", table.column("dim").dictionary_encode())
    return (PartialKey(KEY.supervisor_task_id, sub, KEY.interval, KEY.partition_id),
            arrow_bytes(table, batch_rows))


def _rows(tables: list[pa.Table]) -> list[tuple[Any, ...]]:
    out = []
    for t in tables:
        if "dim" in t.column_names and pa.types.is_dictionary(t.schema.field("dim").type):
            t = t.set_column(1, "dim", t.column("dim").cast(pa.string()))
        out.extend(zip(*(t.column(c).to_pylist() for c in ("__time", "dim", "count"))))
    return sorted(out, key=repr)


def _decode(pages: list[bytes]) -> list[pa.Table]:
    return [pa.ipc.open_stream(p).read_all() for p in pages]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("paged")
    with EmbeddedDaemon([base / "a", base / "b"], free_space_reserve=0, long_poll_max=10.0,
                        failed_read_delay=0.2) as url:
        yield url


@pytest.fixture(scope="module")
def stored(daemon: str) -> dict[str, Any]:
    """Five partials of many small batches (one with dictionaries), sealed with four."""
    items = [_partial(f"s{i}", 300 + 40 * i, i, batch_rows=25) for i in range(4)]
    items.append(_partial("s4", 200, 9, batch_rows=30, dictionary=True))
    items.append(_partial("zombie", 50, 99))  # a failed attempt's leftover: never sealed
    with ShuffleClient(daemon, retry=FAST) as c:
        c.put_partials(KEY.supervisor_task_id, items)
        c.seal(KEY.supervisor_task_id, [f"s{i}" for i in range(5)])
    return {"rows": _rows([pa.ipc.open_stream(body).read_all() for _, body in items[:5]])}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(max_bytes=st.integers(min_value=200, max_value=40_000))
def test_pages_hold_what_the_aggregate_get_holds(daemon: str, stored: dict[str, Any],
                                                 max_bytes: int) -> None:
    with ShuffleClient(daemon, retry=FAST) as c:
        pages = list(c.pages(KEY, max_bytes=max_bytes, poll=0.2, deadline=5))
    tables = _decode(pages)
    assert _rows(tables) == stored["rows"]  # every sealed row once, the zombie's never
    for page, table in zip(pages, tables, strict=True):
        # at most max_bytes, unless a single record batch is bigger by itself
        assert len(page) <= max_bytes or len(table.to_batches()) == 1


def test_a_repeated_token_gives_the_same_bytes(daemon: str, stored: dict[str, Any]) -> None:
    with ShuffleClient(daemon, retry=FAST) as c:
        first = c.read_page(KEY, 0, max_bytes=3000)
        again = c.read_page(KEY, 0, max_bytes=3000)
        second = c.read_page(KEY, first.next_token, max_bytes=3000)
    assert first.body == again.body and first.next_token == again.next_token
    assert first.next_token > first.token and second.next_token > second.token  # monotonic
    assert second.body and second.body != first.body
    assert first.pending_bytes > second.pending_bytes > 0
    assert first.state == "sealed" and not first.complete


def test_a_cut_answer_is_asked_again_with_the_same_token(daemon: str,
                                                         stored: dict[str, Any]) -> None:
    host, port = urllib.parse.urlsplit(daemon).netloc.split(":")
    with ShuffleClient(daemon, retry=FAST) as c:
        want = c.read_page(KEY, 0, max_bytes=20_000)
    proxy = CuttingProxy((host, int(port)), cut=len(want.body) // 2)
    try:
        with ShuffleClient(f"http://127.0.0.1:{proxy.port}", retry=FAST) as c:
            got = c.read_page(KEY, 0, max_bytes=20_000)
    finally:
        proxy.close()
    assert got.body == want.body
    assert len(proxy.heads) == 2 and b"token=0" in proxy.heads[1]


def test_complete_only_after_the_seal_and_the_zombie_is_left_out(daemon: str) -> None:
    key = PartitionKey("unsealed", KEY.interval, 0)
    with ShuffleClient(daemon, retry=FAST) as c:
        c.put_partials("unsealed", [(PartialKey("unsealed", s, key.interval, 0),
                                     arrow_bytes(sample_table(30, seed=n)))
                                    for n, s in enumerate(["a", "b", "zombie"])])
        page = c.read_page(key, 0, max_bytes=1 << 20)
        assert page.body and page.state == "running"
        end = c.read_page(key, page.next_token, max_bytes=1 << 20)
        assert not end.body and not end.complete  # up to date, but not complete: no seal
        with pytest.raises(NotComplete):
            list(c.pages(key, poll=0.1, deadline=0.3))
        c.seal("unsealed", ["a", "b"])
        assert c.seal("unsealed", ["b", "a"])["new"] is False  # a retry is fine
        with pytest.raises(Conflict):  # a committed subtask is never taken back
            c.seal("unsealed", ["a"])
        pages = list(c.pages(key, poll=0.1, deadline=5))
        assert sum(t.num_rows for t in _decode(pages)) == 60  # a and b, not the zombie
        assert c.task_state("unsealed")["state"] == "sealed"


def _waiters(registry: Any) -> float:
    return registry.get_sample_value("shuffled_long_poll_waiters") or 0.0


def test_long_poll_is_answered_early_by_a_commit(tmp_path: Path) -> None:
    key = PartitionKey("polled", KEY.interval, 0)
    embedded = EmbeddedDaemon([tmp_path / "l"], free_space_reserve=0, long_poll_max=20.0)
    with embedded as url:
        daemon = embedded.registry
        result: list[Any] = []

        def reader() -> None:
            with ShuffleClient(url, retry=FAST) as c:
                started = time.monotonic()
                page = c.read_page(key, 0, max_bytes=1 << 20, max_wait=15.0)
                result.append((page, time.monotonic() - started))

        thread = threading.Thread(target=reader)
        thread.start()
        deadline = time.monotonic() + 10
        while _waiters(daemon) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # bounded: until the reader is waiting inside the daemon
        assert _waiters(daemon) == 1
        with ShuffleClient(url, retry=FAST) as c:
            c.put_partial(PartialKey("polled", "s", key.interval, 0),
                          arrow_bytes(sample_table(10)))
        thread.join(timeout=20)
        page, elapsed = result[0]
        assert page.body and elapsed < 10  # woken by the commit, not by the 15 s maximum
        assert daemon.get_sample_value("shuffled_long_polls_total", {"outcome": "early"}) == 1


def test_long_poll_ends_at_its_maximum_wait(daemon: str) -> None:
    key = PartitionKey("quiet", KEY.interval, 0)
    with ShuffleClient(daemon, retry=FAST) as c:
        started = time.monotonic()
        page = c.read_page(key, 0, max_bytes=1 << 20, max_wait=0.5)
        elapsed = time.monotonic() - started
        state = c.task_state("quiet")
        started = time.monotonic()
        same = c.task_state("quiet", known=state["tag"], max_wait=0.4)
        polled = time.monotonic() - started
    assert not page.body and not page.complete and page.state == "none"
    assert 0.5 <= elapsed < 5
    assert same["tag"] == state["tag"] and 0.4 <= polled < 5


def test_a_failed_task_is_never_complete(daemon: str) -> None:
    key = PartitionKey("doomed", KEY.interval, 0)
    with ShuffleClient(daemon, retry=FAST) as c:
        c.put_partial(PartialKey("doomed", "s", key.interval, 0), arrow_bytes(sample_table(5)))
        c.seal("doomed", ["s"])
        c.fail("doomed")
        started = time.monotonic()
        page = c.read_page(key, 0, max_bytes=1 << 20)
        assert time.monotonic() - started >= 0.2  # the fixed delay: no hot loop
        assert not page.body and not page.complete and page.state == "failed"
        with pytest.raises(TaskFailed):
            list(c.pages(key))
        # a DELETE marks it failed too: read afterwards, it is "failed", not "empty"
        c.put_partial(PartialKey("gone", "s", key.interval, 0), arrow_bytes(sample_table(5)))
        c.seal("gone", ["s"])
        c.delete_task("gone")
        assert c.read_page(PartitionKey("gone", key.interval, 0)).state == "failed"
        with pytest.raises(Conflict):
            c.seal("gone", ["s"])


def test_the_seal_survives_a_restart(tmp_path: Path) -> None:
    locations = [tmp_path / "x", tmp_path / "y"]
    key = PartitionKey("kept", KEY.interval, 0)
    with EmbeddedDaemon(locations, free_space_reserve=0) as url:
        with ShuffleClient(url, retry=FAST) as c:
            c.put_partials("kept", [(PartialKey("kept", s, key.interval, 0),
                                     arrow_bytes(sample_table(8, seed=i)))
                                    for i, s in enumerate(["a", "b", "c"])])
            c.seal("kept", ["a", "c"])
        seal_files = sorted(p.name for loc in locations
                            for p in (loc / ".shuffled" / "seals").iterdir())
        assert seal_files == ["kept.json", "kept.json"]  # one per location
    with EmbeddedDaemon(locations, free_space_reserve=0) as url:
        with ShuffleClient(url, retry=FAST) as c:
            assert c.task_state("kept")["state"] == "sealed"
            pages = list(c.pages(key, poll=0.1, deadline=5))
            assert sum(t.num_rows for t in _decode(pages)) == 16
            c.delete_task("kept")
    assert not any((loc / ".shuffled" / "seals" / "kept.json").exists() for loc in locations)


async def test_reads_stop_below_a_commit_still_in_flight(start_daemon: Any,
                                                          settings: Any) -> None:
    """Group commits of two locations land in any order: a page never serves a partial
    while one with a lower generation is still being committed (it could appear after the
    reader's token had passed it). Held in flight here by hand, on a real daemon."""
    from shuffled.server.state import STATE
    from tests.conftest import PREFIX

    daemon = await start_daemon(settings)  # in this loop: its store is at hand
    key = PartitionKey("horizon", KEY.interval, 0)
    for i, sub in enumerate(["a", "b"]):
        resp = await daemon.put(f"{PREFIX}/tasks/horizon/{sub}/partition", params=key.query(),
                                data=arrow_bytes(sample_table(10, seed=i)))
        assert resp.status == 201
    assert (await daemon.put(f"{PREFIX}/tasks/horizon/seal",
                             json={"subTaskIds": ["a", "b"]})).status == 200
    store = daemon.server.app[STATE].store
    lowest = min(m.generation for m in store.partition(key))
    url = f"{PREFIX}/tasks/horizon/partition/pages"
    store.generations.hold([lowest - 1])  # an earlier partial's commit, not landed yet
    held = await daemon.get(url, params={**key.query(), "token": "0"})
    assert await held.read() == b"" and held.headers["X-Shuffled-Complete"] == "false"
    assert held.headers["X-Shuffled-Page-Next-Token"] == "0"
    store.generations.land([lowest - 1])
    page = await daemon.get(url, params={**key.query(), "token": "0"})
    assert await page.read() and page.headers["X-Shuffled-Complete"] == "true"

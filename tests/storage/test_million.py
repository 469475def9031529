"""A million partial segments held: the daemon restarts on them, lists them page by page
and serves them, in bounded memory (``make soak``; a 20,000-partial version runs in
``make test``). Timings are for bench/scale.py; this checks behaviour and the memory bound.

The locations are built directly in storage format 2 (packs + catalog) the way the daemon
writes them, since a million uploads would take minutes: 1,000 distinct small Arrow streams
in a pack, and a catalog row per partial pointing at one of them.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.protocol import Interval, PartialKey
from shuffled.storage.ondisk import arrowfile, layout, packs
from shuffled.storage.catalog import Catalog
from tests.conftest import PREFIX, arrow_bytes, sample_table
from tests.helpers.procs import DaemonProcess, http_get

DAY_MS = 86_400_000
RSS_LIMIT = 300 << 20  # docs/design.md section 8: 1M partials held, daemon RSS < 300 MiB


def build(root: Path, sup: str, count: int, subs: int) -> list[bytes]:
    """A format-3 location holding ``count`` partials of ``sup``: ``subs`` subtasks per
    partition, day partitions; returns the distinct bodies (row i uses body i % 1000),
    each stored whole but its end-of-stream marker (schema message in front of its body)."""
    root.mkdir(parents=True)
    layout.write_format(root, fsync=False)
    bodies = [arrow_bytes(sample_table(2 + i % 5, seed=i)) for i in range(1000)]
    pack = packs.create(root, 0, sup, 1, fsync=False)
    spans = []
    for body in bodies:
        spans.append((pack.size, len(body), arrowfile.inspect_bytes(body)))
        pack.write([memoryview(body)[:-8]])
    pack.close()
    crcs = [crc32c(b) for b in bodies]
    catalog = Catalog(root, fsync=False)
    catalog.open()

    def rows():  # type: ignore[no-untyped-def]
        for i in range(count):
            part, sub = divmod(i, subs)
            offset, size, facts = spans[i % 1000]
            yield (sup, part * DAY_MS, (part + 1) * DAY_MS, 0, f"s{sub:05d}", i + 1, 1,
                   offset + facts.schema_len, size, facts.rows, crcs[i % 1000],
                   facts.schema_len, facts.schema_crc, facts.body_crc, 0, 1.0, offset)
    catalog.insert_many(rows())
    catalog.close()
    return bodies


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def scale_check(tmp_path: Path, count: int, subs: int) -> None:
    sup = "big"
    bodies = build(tmp_path / "loc", sup, count, subs)
    daemon = DaemonProcess([tmp_path / "loc"], log_path=tmp_path / "daemon.log")
    daemon.start()
    try:
        with ShuffleClient(daemon.url) as client:
            summary = client.list_tasks()["tasks"][0]
            assert summary["files"] == count and summary["partitions"] == count // subs
            # The first page and the next, in key order, each a bounded answer.
            with urllib.request.urlopen(f"{daemon.url}{PREFIX}/tasks/{sup}?limit=100",
                                        timeout=30) as resp:
                first = json.load(resp)
            subs_seen = [s["subTaskId"] for p in first["partitions"] for s in p["subTasks"]]
            assert len(subs_seen) == 100 and first["nextCursor"]
            assert subs_seen[: min(subs, 100)] == [f"s{i:05d}" for i in range(min(subs, 100))]
            # Unpaged listing of so many is refused with a clear pointer to paging.
            status, _, answer = http_get(f"{daemon.url}{PREFIX}/tasks/{sup}", timeout=30)
            assert status == 400 and json.loads(answer)["field"] == "limit"
            # Partials anywhere in the task are served byte for byte.
            for i in (0, 1, count // 2, count - 1):
                part, sub = divmod(i, subs)
                key = PartialKey(sup, f"s{sub:05d}", Interval(part * DAY_MS, (part + 1) * DAY_MS), 0)
                assert client.get_partial(key) == bodies[i % 1000]
        assert rss(daemon.pid) < RSS_LIMIT, f"daemon RSS {rss(daemon.pid) >> 20} MiB"
    finally:
        assert daemon.stop() == 0


def test_twenty_thousand_partials_restart_list_serve(tmp_path: Path) -> None:
    scale_check(tmp_path, 20_000, 50)


@pytest.mark.slow
def test_a_million_partials_restart_list_serve(tmp_path: Path) -> None:
    started = time.monotonic()
    scale_check(tmp_path, int(os.environ.get("SHUFFLED_MILLION", "1000000")), 100)
    assert time.monotonic() - started < 600  # bounded, not a timing claim

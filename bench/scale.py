"""Comparison 6: a daemon holding 100k and 1M partial segments: restart, paged listing,
memory.

The partials are laid out in storage format 2 the way the daemon writes them (packs of
1,000 distinct validated streams, a catalog row per partial) rather than uploaded one by
one, so setting up a million takes seconds. They belong to one supervisor task
(partitions of ``SUBTASKS`` subtasks each). Restart = time to ready minus that of an empty
location (interpreter start-up and imports). Targets (DESIGN.md section 8): 1M partials
held in < 300 MiB RSS, ready in < 5 s, first page of ``GET /tasks/{sup}`` in < 50 ms.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench import client
from bench.context import Ctx
from bench.daemon import Daemon
from bench.data import arrow_stream
from bench.stats import Result, absolute, compare, median
from shuffled.crc import crc32c
from shuffled.protocol import Interval
from shuffled.storage import arrowfile, layout, packs
from shuffled.storage.catalog import Catalog

SUP = "bench-scale"
SUBTASKS = 100
GETS = 5  # latency samples per count
DISTINCT = 1000  # distinct bodies written to the pack; partial i points at one of them
# (a restart in between cuts the pack after the last body referenced: count what is left)
INTERVAL = Interval.parse("2018-01-01T00:00:00.000Z", "2018-01-02T00:00:00.000Z")


def populate(root: Path, first: int, count: int) -> None:
    """Record partial segments number ``first`` to ``count - 1`` of task ``SUP`` in the
    location ``root`` (partial i is subtask i % SUBTASKS of partition i // SUBTASKS)."""
    if first == 0:
        root.mkdir(parents=True, exist_ok=True)
        layout.write_format(root, fsync=False)
        pack = packs.create(root, 0, SUP, 1, fsync=False)
        for i in range(DISTINCT):
            pack.write([memoryview(arrow_stream(512, seed=i))])
        pack.close()
    spans = _spans(layout.pack_path(root, SUP, 1).read_bytes())
    catalog = Catalog(root, fsync=False)
    catalog.open()
    try:
        catalog.insert_many(
            (SUP, INTERVAL.start + (i // SUBTASKS) * 86_400_000,
             INTERVAL.end + (i // SUBTASKS) * 86_400_000, 0, f"sub{i % SUBTASKS:06d}", i + 1, 1,
             *spans[i % len(spans)], 0, 1.0)
            for i in range(first, count))
    finally:
        catalog.close()


def _spans(data: bytes) -> list[tuple[int, ...]]:
    """(offset, size, rows, crc, schema_len, schema_crc, body_crc) of each stream in a pack
    of streams written back to back."""
    out, at = [], 0
    while at < len(data):
        size = _stream_len(data, at)
        view = memoryview(data)[at: at + size]
        facts = arrowfile.inspect_bytes(view)
        out.append((at, size, facts.rows, crc32c(view), facts.schema_len, facts.schema_crc,
                    facts.body_crc))
        at += size
    return out


def _stream_len(data: bytes, at: int) -> int:
    """Length of the Arrow IPC stream starting at ``at`` (up to its end-of-stream marker)."""
    import pyarrow as pa

    reader = pa.BufferReader(pa.py_buffer(memoryview(data)[at:]))
    stream = pa.ipc.open_stream(reader)
    for _ in stream:
        pass
    return reader.tell()


def _startups(location: Path, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        d = Daemon(location)
        d.start()
        out.append(d.started_seconds)
        d.stop()
    return out


def run(ctx: Ctx) -> list[Result]:
    """Restart time, first-page latency and RSS at each count; the targets at the largest."""
    s = ctx.sizes
    base = ctx.scratch("scale")
    empty = median(_startups(base / "empty", s.scale_samples))
    figures: dict[int, dict[str, float]] = {}
    loc, done = base / "loc", 0
    for count in sorted(s.scale_counts):
        populate(loc, done, count)
        done = count
        starts = _startups(loc, s.scale_samples - 1)
        with ctx.daemon(f"scale_{count}", loc) as d:
            starts.append(d.started_seconds)
            first = f"{d.task_url(SUP)}?limit=100"
            page = [client.get([first]).seconds for _ in range(GETS)]
            one = d.partial_url(SUP, "sub000000", INTERVAL.start_iso, INTERVAL.end_iso, 0)
            partial = [client.get([one]).seconds for _ in range(GETS)]
        figures[count] = {"startup_s": median(starts),
                          "restart_s": max(median(starts) - empty, 1e-3),
                          "first_page_s": median(page), "partial_get_s": median(partial),
                          "peak_rss_mib": ctx.peaks[f"scale_{count}"]}
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False, timeout=600)
    small, large = min(s.scale_counts), max(s.scale_counts)
    f, g = figures[large], figures[small]
    common = {"counts": list(s.scale_counts), "figures": figures, "empty_startup_s": empty,
              "cpus": os.cpu_count()}
    k = lambda n: f"{n // 1000}k" if n >= 1000 else str(n)  # noqa: E731
    return [
        absolute("scale_rss", f"6. daemon peak RSS, {k(large)} partials held",
                 f["peak_rss_mib"], "MiB", "<", 300, **common),
        absolute("scale_restart", f"6. restart until ready, {k(large)} partials held",
                 f["restart_s"], "s", "<", 5),
        absolute("scale_first_page", f"6. first page of GET /tasks/{{id}} (100), "
                 f"{k(large)} partials", f["first_page_s"] * 1000, "ms", "<", 50),
        compare("scale_restart_growth", f"6. restart, {k(large)} vs {k(small)} partials",
                f["restart_s"], g["restart_s"], "s", None, None),
        compare("scale_partial_get", f"6. per-partial GET latency, {k(large)} vs {k(small)} "
                f"partials", f["partial_get_s"], g["partial_get_s"], "s", None, None),
    ]

"""Comparison 6: start-up index rebuild and ``GET /tasks/{id}`` with 10k and 100k partials.

The partial segments are laid out on disk by the daemon's own storage code (one validated
template, committed under each key with :func:`shuffled.storage.writer.commit`, fsync off)
rather than uploaded one by one, so setting up 100k takes seconds; the larger count is
the smaller one plus more. All of them belong to one supervisor task (partitions of
``SUBTASKS`` subtasks each): its listing is the largest answer there is. Rebuild time = time to ready minus that of an empty
location (interpreter start-up and imports); both run with a warm dentry/inode cache.
Growth should be no worse than linear: ratio (100k / 10k) <= the count ratio (10x).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench import client
from bench.context import Ctx
from bench.daemon import Daemon
from bench.data import arrow_stream
from bench.stats import Result, compare, median
from shuffled.protocol import Interval, PartialKey
from shuffled.storage import Location, writer

SUP = "bench-scale"
SUBTASKS = 100
GETS = 5  # latency samples per count
INTERVAL = Interval.parse("2018-01-01T00:00:00.000Z", "2018-01-02T00:00:00.000Z")


def populate(root: Path, first: int, count: int) -> None:
    """Commit partial segments number ``first`` to ``count - 1`` of task ``SUP`` into the
    location ``root`` (partial i is subtask i % SUBTASKS of partition i // SUBTASKS)."""
    loc = Location(0, root, None, 0)
    loc.open()
    try:
        template = writer.TempPartial(loc, None, fsync=False)
        template.write(arrow_stream(2048, seed=6))
        written = template.finish(None)
        body = written.tmp.read_bytes()
        for i in range(first, count):
            key = PartialKey(SUP, f"sub{i % SUBTASKS:06d}", INTERVAL, i // SUBTASKS)
            tmp = loc.tmp_dir / f"scale-{i}.part"
            with open(tmp, "wb") as fh:
                fh.write(body)
            writer.commit(writer.Written(tmp, written.size, written.crc, written.facts), loc,
                          key, i + 1, fsync=False)
        written.tmp.unlink()
    finally:
        loc.close()


def _startups(location: Path, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        d = Daemon(location)
        d.start()
        out.append(d.started_seconds)
        d.stop()
    return out


def run(ctx: Ctx) -> list[Result]:
    """Rebuild time and task-listing latency at each count; ratios largest / smallest."""
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
            listing = [client.get([d.task_url(SUP)]).seconds for _ in range(GETS)]
            one = d.partial_url(SUP, "sub000000", INTERVAL.start_iso, INTERVAL.end_iso, 0)
            partial = [client.get([one]).seconds for _ in range(GETS)]
        figures[count] = {"startup_s": median(starts), "rebuild_s": max(median(starts) - empty, 1e-3),
                          "task_get_s": median(listing), "partial_get_s": median(partial),
                          "peak_rss_mib": ctx.peaks[f"scale_{count}"]}
    # rm is much faster than shutil.rmtree on 100k-file trees
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False, timeout=600)
    small, large = min(s.scale_counts), max(s.scale_counts)
    growth = large / small
    f, g = figures[large], figures[small]
    common = {"counts": list(s.scale_counts), "figures": figures, "empty_startup_s": empty,
              "growth": growth, "cpus": os.cpu_count()}
    k = lambda n: f"{n // 1000}k" if n >= 1000 else str(n)  # noqa: E731
    return [
        compare("scale_rebuild", f"6. start-up index rebuild, {k(large)} vs {k(small)} partials",
                f["rebuild_s"], g["rebuild_s"], "s", "<=", growth, **common),
        compare("scale_task_get", f"6. GET /tasks/{{id}} latency, {k(large)} vs {k(small)} partials",
                f["task_get_s"], g["task_get_s"], "s", "<=", growth, **common),
        compare("scale_rss", f"6. daemon peak RSS, {k(large)} vs {k(small)} partials indexed",
                f["peak_rss_mib"], g["peak_rss_mib"], "MiB", None, None, **common),
        compare("scale_partial_get", f"6. per-partial GET latency, {k(large)} vs {k(small)} partials",
                f["partial_get_s"], g["partial_get_s"], "s", None, None, **common),
    ]

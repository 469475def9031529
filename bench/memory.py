"""Comparison 4: the daemon's peak RSS (VmHWM) is flat in partition size and < 150 MiB.

For each partition size a fresh daemon takes ``memory_partials`` partial segments of
``size / memory_partials`` bytes (``put_parallel`` uploads in flight), then serves the
partition as 4 concurrent aggregate GETs and as per-partial GETs over 16 connections;
VmHWM is read from /proc when it is done. ``overall`` is the peak over every daemon of
comparisons 1-4 (comparison 6 reports its own: the index grows with the partial count).
The detail splits the peak into heap (RssAnon) and mapped file pages (RssFile: shared
libraries, and partial segments mapped while an upload is validated), polled every 5 ms.
"""

from __future__ import annotations

import shutil

from bench import client
from bench.context import MiB, Ctx
from bench.data import END, START, total, write_partials
from bench.fixtures import partial_urls, upload
from bench.stats import Result, absolute, compare

LIMIT_MIB = 150.0


def _label(size: int) -> str:
    return f"{size >> 30} GiB" if size >= 1 << 30 else f"{size >> 20} MiB"


def run(ctx: Ctx) -> list[Result]:
    """One row per partition size (< 150 MiB) and one for flatness (largest / smallest)."""
    s = ctx.sizes
    peaks: dict[int, float] = {}
    details: dict[int, dict[str, object]] = {}
    for i, size in enumerate(s.memory_sizes):
        base = ctx.scratch(f"memory-{i}")
        files = write_partials(base / "data", s.memory_partials, size // s.memory_partials,
                               seed=10 + i)
        payload = total(files)
        label = f"memory_{_label(size).replace(' ', '')}"
        with ctx.daemon(label, base / "loc") as d:
            idle = d.tree.peak_rss_mib()
            upload(d, "bench-memory", files, parallel=s.put_parallel)
            after_put = d.tree.peak_rss_mib()
            agg = d.partition_url("bench-memory", START, END, 0)
            client.get([agg] * 4, parallel=4)
            client.get(partial_urls(d, "bench-memory", files), parallel=16,
                       expect_bytes=payload)
        peaks[size] = ctx.peaks[label]
        details[size] = {"bytes": payload, "partials": len(files), "idle_mib": idle,
                         "after_put_mib": after_put, "peak_mib": peaks[size],
                         "polled_peaks_mib": ctx.split.get(label)}
        # the data is not needed any more: keep the disk footprint of the run small
        shutil.rmtree(base, ignore_errors=True)
    out = [absolute(f"memory_rss_{_label(z).replace(' ', '')}",
                    f"4. daemon peak RSS, partition of {_label(z)}", peaks[z], "MiB", "<",
                    LIMIT_MIB, **details[z]) for z in s.memory_sizes]
    small, large = min(s.memory_sizes), max(s.memory_sizes)
    out.append(compare("memory_flat", f"4. peak RSS {_label(large)} vs {_label(small)} partition",
                       peaks[large], peaks[small], "MiB", "<=", 1.25,
                       partition_growth=large / small))
    return out


def overall(ctx: Ctx) -> Result:
    """Peak RSS over every daemon of comparisons 1-4 in this run."""
    peaks = {k: v for k, v in ctx.peaks.items() if not k.startswith("scale")}
    worst = max(peaks.values()) if peaks else float("nan")
    which = max(peaks, key=lambda k: peaks[k]) if peaks else None
    return absolute("memory_peak_rss", "4. daemon peak RSS over runs 1-4", worst, "MiB",
                    "<", LIMIT_MIB, worst_run=which, peaks=peaks,
                    polled_peaks_mib={k: ctx.split.get(k) for k in peaks},
                    step_peaks_mib={k: ctx.steps.get(k) for k in peaks})

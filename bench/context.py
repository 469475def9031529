"""Fixed bounds of a run (full or ``--quick``) and the per-run context comparisons share."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.daemon import Daemon
from bench.peers import Nginx
from bench.procs import RssPoller

MiB = 1 << 20
KiB = 1 << 10


@dataclass(frozen=True)
class Sizes:
    """Every bound of a run: sizes, counts, repeats. Nothing is open-ended."""

    repeats: int = 5  # alternations per side (medians over these)
    large: int = 256 * MiB  # comparison 1 and 3
    large_rounds: int = 4  # GETs of the large file per sample (CPU clock ticks are 10 ms)
    small_count: int = 1000  # comparison 2 and 3
    small_size: int = 64 * KiB
    small_parallel: int = 32  # connections for the many small GETs
    put_parallel: int = 4  # uploads in flight for the many small PUTs
    memory_partials: int = 16  # comparison 4: partials per partition, two partition sizes
    memory_sizes: tuple[int, ...] = (64 * MiB, 1024 * MiB)
    e2e_rows: int = 10_000_000  # comparison 5
    # Even: the e2e worker alternates its sides (A B C, then C B A), so with an odd count
    # one side ran right after Spark's in two of the measured rounds and another in one.
    # A run after Spark's 30-45 s finds PySpark's idle Python workers gone (killed after a
    # minute idle): comparison 7 read 5.2/5.6 s after Spark against 4.2 s, DuckDB 4.0
    # against 3.4 (docs/benchmarks.md, nineteenth session). With four, each follows it
    # twice.
    e2e_repeats: int = 4
    druid_rows: int = 3_000_000  # comparison 7: rows over ``druid_days`` day chunks
    druid_days: int = 3652
    scale_partials: int = 1_000_000  # comparison 6: partials held by one daemon
    scale_early: int = 50_000  # comparison 6: the restart measured on the way (<= 1 s)
    scale_batch: int = 10_000  # partials per bulk upload while filling it
    scale_threads: int = 3  # client threads filling it
    scale_fill_seconds: float = 900.0  # the fill stops here (the count reached is reported)
    scale_samples: int = 3  # restarts measured
    merge_rows: int = 4_800_000  # comparison 8: one partition's rows (~220 MiB in Arrow)
    merge_budget: int = 64 * MiB  # and the merge task's memory budget


FULL = Sizes()
QUICK = Sizes(repeats=2, large=16 * MiB, large_rounds=1, small_count=100, small_size=16 * KiB,
              small_parallel=8, put_parallel=4, memory_partials=4,
              memory_sizes=(4 * MiB, 16 * MiB), e2e_rows=200_000, e2e_repeats=1,
              druid_rows=20_000, druid_days=60,
              scale_partials=20_000, scale_early=5_000, scale_batch=2_000, scale_fill_seconds=60.0,
              scale_samples=2, merge_rows=600_000, merge_budget=64 * MiB)


@dataclass
class Ctx:
    """What a comparison gets: its bounds, a scratch area, and the daemons' memory peaks."""

    sizes: Sizes
    workdir: Path
    quick: bool = False
    peaks: dict[str, float] = field(default_factory=dict)  # daemon label -> VmHWM MiB
    split: dict[str, dict[str, float]] = field(default_factory=dict)  # label -> RssAnon/File
    notes: list[str] = field(default_factory=list)
    steps: dict[str, dict[str, float]] = field(default_factory=dict)  # label -> step peaks
    spark_conf: tuple[str, ...] = ()  # KEY=VALUE settings for both sides of comparison 5

    def scratch(self, name: str) -> Path:
        """A fresh directory under the run's work dir (removed by the caller's cleanup)."""
        path = self.workdir / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    @contextmanager
    def daemon(self, label: str, location: Path, *, fsync: bool = True,
               extra: tuple[str, ...] = ()) -> Iterator[Daemon]:
        """A shuffled daemon for the block; its peak RSS is recorded under ``label``."""
        d = Daemon(location, fsync=fsync, extra=extra)
        d.start()
        assert d.proc is not None
        poller = RssPoller(d.proc.pid).start()
        try:
            yield d
        finally:
            self.split[label] = poller.stop()
            if d.proc is not None:
                peak = d.tree.peak_rss_mib()
                d.mark("rest")
                self.peaks[label] = max([peak, *d.steps.values()])
                self.steps[label] = d.steps
            d.stop()

    @contextmanager
    def nginx(self, prefix: Path) -> Iterator[Nginx]:
        """nginx serving ``prefix/root`` for the block."""
        with Nginx(prefix) as n:
            yield n

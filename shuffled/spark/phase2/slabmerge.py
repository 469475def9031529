"""Phase 2 over slabs (docs/slab.md, issue 36): each shard of the late plan is a key range
``[key_from, key_to)`` of its chunk, read from every daemon holding slabs of that chunk
(the sealed subtasks' rows of that range) and merged with perfect rollup as a partition is
(:func:`.merge.merge_partitions`; one too big for the budget merged within it,
:func:`.spill.merge_bounded`). A task reads its shards in batches, one ``read_shards``
request per daemon per batch (a shard a request cost 2.4x the partials' phase 2 at 20,000
shards), one batch ahead of the merging, as the partials path does (:mod:`.merge`).

A daemon's answer says how many slabs of the sealed subtasks it holds for the task: fewer
than phase 1 stored there means it lost some (a restart without its location), and the
shard is reported :class:`~shuffled.spark.records.Lost` rather than merged short; the
driver then makes those slabs again and merges the shard once more
(:mod:`shuffled.spark.driver.late_recompute`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from shuffled.client import ShuffleClient, daemon_failed
from shuffled.protocol import Interval
from shuffled.slab.keys import KEY_COLUMN, key_ints, split_range
from shuffled.spark.phase2.durable import sync_files
from shuffled.spark.phase2.keycut import cut_many
from shuffled.spark.phase2.merge import (
    Repeats, SegmentSink, _segment_table, _write, encoded, merge_partitions, read_ahead,
    runs_comparable,
)
from shuffled.spark.phase2.plan import Phase2Config
from shuffled.spark.phase2.publish import segment_name
from shuffled.spark.phase2.spill import WORK_FACTOR, merge_bounded, rolled_up
from shuffled.spark.phase2.verdict import Verdict
from shuffled.spark.records import Lost, Segment, dump
from shuffled.spark.rows.memory import peak_rss, reset_peak_rss, rss
from shuffled.spark.rows.rollup import Layout

BATCH_SHARDS = 128  # shards read (one request per daemon) and merged together
BATCH_ROWS = 500_000  # about this many rows a batch, by the plan's estimates


@dataclass(frozen=True)
class Shard:
    """One output partition of the late plan: a key range of a chunk, and the daemons
    holding the chunk's slabs."""

    start: int
    end: int
    partition: int
    key_from: bytes | None
    key_to: bytes | None
    servers: tuple[str, ...]
    estimate: int = 0  # rolled-up rows the plan expects (for balancing the tasks)
    # False with numShards: an empty partition is no segment, as with partials (a chunk's
    # partitions are the ones its rows fell in); the late plan's shards are each one.
    written_empty: bool = True
    # Bytes of its shipped rows as Arrow holds them, estimated (0: unknown), and the width
    # of its fixed-width keys (0: not fixed, range keys): a hashed shard past the memory
    # budget's share is read in pages, narrower ranges of its keys (:func:`_paged`).
    nbytes: int = 0
    key_width: int = 0


def balance(shards: list[Shard], tasks: int) -> list[list[Shard]]:
    """Spread shards over ``tasks`` merge tasks, largest first onto the lightest task, a
    chunk's shards together (in runs of at most a quarter of a task's share): they are
    read as one key range (:func:`runs`), each slab batch of the chunk once. Spread
    shard by shard, the two shards of a day chunk went to different tasks about half the
    time, and each task read (and trimmed) the chunk's whole batches."""
    tasks = max(1, min(tasks, len(shards)))
    total = sum(max(s.estimate, 1) for s in shards)
    cap = max(1, total // (4 * tasks))
    units: list[tuple[int, list[Shard]]] = []  # (estimated rows, consecutive shards)
    for s in sorted(shards, key=lambda x: (x.start, x.partition)):
        rows = max(s.estimate, 1)
        if units and units[-1][1][-1].start == s.start and units[-1][0] + rows <= cap:
            units[-1] = (units[-1][0] + rows, [*units[-1][1], s])
        else:
            units.append((rows, [s]))
    tasks = min(tasks, len(units))
    groups: list[list[Shard]] = [[] for _ in range(tasks)]
    loads = [0] * tasks
    for rows, unit in sorted(units, key=lambda u: (-u[0], u[1][0].start, u[1][0].partition)):
        i = loads.index(min(loads))
        groups[i].extend(unit)
        loads[i] += rows
    for g in groups:
        g.sort(key=lambda x: (x.start, x.partition))
    return groups


class ShortRead(Exception):
    """A daemon could not serve a shard whole: it did not answer, or holds other slabs of
    the sealed subtasks than phase 1 stored there (``server``, ``why``)."""

    def __init__(self, server: str, why: str, missing: bool = False) -> None:
        super().__init__(why)
        # missing: it answered without slabs committed there (its data is gone), rather
        # than not answering (it may be restarting)
        self.server, self.why, self.missing = server, why, missing


def shard_batches(shards: Iterable[Shard], count: int = BATCH_SHARDS,
                  rows: int = BATCH_ROWS) -> Iterator[list[Shard]]:
    """Consecutive shards in batches of at most ``count`` and about ``rows`` estimated
    rows (a shard estimated over it alone)."""
    batch: list[Shard] = []
    held = 0
    for s in shards:
        if batch and (len(batch) >= count or held + s.estimate > rows):
            yield batch
            batch, held = [], 0
        batch.append(s)
        held += s.estimate
    if batch:
        yield batch


Fetched = tuple[list[pa.Table], int, int]  # a shard's tables (one per daemon), rows, bytes


def runs(batch: Sequence[Shard]) -> list[list[int]]:
    """Consecutive shards of ``batch`` that make one key range of one chunk on the same
    daemons (a chunk's shards, in order): each run is read as one range and cut after."""
    out: list[list[int]] = []
    for n, s in enumerate(batch):
        if out:
            p = batch[out[-1][-1]]
            if (p.start, p.end, p.servers) == (s.start, s.end, s.servers) and \
                    p.key_to is not None and p.key_to == s.key_from:
                out[-1].append(n)
                continue
        out.append([n])
    return out


def _pieces(tables: Sequence[pa.Table], runs: Sequence[Sequence[Shard]],
            ) -> list[list[pa.Table | None]]:
    """Each table (a run's rows as read, with ``__key``: the edge batches whole) in its
    run's shards, the rows outside the run's range dropped: all slices (:func:`cut_many`,
    the runs of one read at once)."""
    out: list[list[pa.Table | None]] = [[t] for t in tables]
    todo: list[int] = []
    edges_of: list[list[bytes]] = []
    for n, (table, run) in enumerate(zip(tables, runs, strict=True)):
        lo, hi = run[0].key_from, run[-1].key_to
        edges = [e for e in (lo, *(s.key_from for s in run[1:]), hi) if e is not None]
        if KEY_COLUMN in table.column_names and edges:
            todo.append(n)
            edges_of.append(edges)
    for n, parts in zip(todo, cut_many([tables[n] for n in todo], edges_of), strict=True):
        lo, hi = runs[n][0].key_from, runs[n][-1].key_to
        out[n] = parts[(lo is not None):len(parts) - (hi is not None)]
    return out


def fetch_shards(client: Callable[[str], ShuffleClient], supervisor_task_id: str,
                 batch: Sequence[Shard], slabs_on: dict[str, int],
                 without: Mapping[str, frozenset[str]] | None = None,
                 ) -> list[Fetched | ShortRead]:
    """Every shard of ``batch`` from every daemon holding its chunk: one ``read_shards``
    per daemon for the lot, a chunk's consecutive shards asked as one key range and cut
    here (:func:`runs`, :func:`cut`: each slab batch of the chunk decoded once, not once
    per shard it overlaps). A daemon that does not answer, or answers holding another
    count of the sealed subtasks' slabs than phase 1 stored there, makes each of the
    batch's shards it holds :class:`ShortRead`. ``without``: per daemon, the sealed
    subtasks it is not read for (read from another copy, or superseded by a re-run)."""
    asked: dict[str, list[list[int]]] = {}
    for run in runs(batch):
        for server in batch[run[0]].servers:
            asked.setdefault(server, []).append(run)
    out: list[Fetched | ShortRead] = [([], 0, 0) for _ in batch]
    for server, items in asked.items():
        try:
            got = client(server).read_shards(
                supervisor_task_id,
                [(Interval(batch[r[0]].start, batch[r[0]].end), batch[r[0]].key_from,
                  batch[r[-1]].key_to) for r in items],
                (without or {}).get(server, frozenset()), keys=True)
        except Exception as exc:
            if not daemon_failed(exc):
                raise
            short = ShortRead(server, getattr(exc, "message", None) or repr(exc))
            for r in items:
                for n in r:
                    if not isinstance(out[n], ShortRead):
                        out[n] = short
            continue
        held: list[tuple[list[int], pa.Table]] = []
        for r, read in zip(items, got, strict=True):
            if read.slabs != slabs_on.get(server, 0):
                short = ShortRead(server, f"holds {read.slabs} slabs of the sealed subtasks; "
                                  f"phase 1 stored {slabs_on.get(server, 0)} there",
                                  missing=True)
                for n in r:
                    out[n] = short
                continue
            if read.table is not None and read.rows:
                held.append((r, read.table))
        cuts = _pieces([t for _, t in held], [[batch[n] for n in r] for r, _ in held])
        for (r, table), parts in zip(held, cuts, strict=True):
            # Buffer sizes, not nbytes: nbytes looks for buffers shared between a read's
            # hundreds of chunks, 17 ms on 800 of them (160 of the fetch thread's 535
            # samples in a numShards run's py-spy); a read's buffers are its own.
            per_row = table.get_total_buffer_size() / max(table.num_rows, 1)
            for n, t in zip(r, parts, strict=True):
                slot = out[n]
                if isinstance(slot, ShortRead) or t is None or not t.num_rows:
                    continue
                tables, rows, size = slot
                tables.append(t)
                out[n] = (tables, rows + t.num_rows, size + int(per_row * t.num_rows))
    return out


def make_phase2_slabs(cfg: Phase2Config, slabs_on: dict[str, int],
                      without: Mapping[str, frozenset[str]] | None = None,
                      ) -> Callable[[Iterable[Shard]], Iterator[str]]:
    """The ``mapPartitions`` function of phase 2 over slabs (input: :class:`Shard`;
    output: JSON lines). ``slabs_on``: the slabs each daemon is read for; ``without``:
    per daemon, the sealed subtasks it is not read for."""

    def run(shards: Iterable[Shard]) -> Iterator[str]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        attempt = ctx.taskAttemptId() if ctx else 0
        cfg.hooks.task_started()  # no release of earlier tasks' pages: phase1.tasks.run_task
        reset_peak_rss()
        baseline = rss()
        clients: dict[str, ShuffleClient] = {}
        written: list[str] = []
        # A read that fails asks a survivor whether the driver declared that daemon lost,
        # and gives up at once if so (as the partials' merge tasks do, :mod:`.verdict`):
        # the shard is reported Lost in seconds, not after shuffleRetrySeconds.
        verdict = Verdict(cfg.supervisor_task_id, cfg.servers, set(cfg.lost),
                          token=cfg.token, ca_file=cfg.ca_file)

        def client(server: str) -> ShuffleClient:
            c = clients.get(server)
            if c is None:
                c = clients[server] = ShuffleClient(
                    server, token=cfg.token, ca_file=cfg.ca_file,
                    retry=verdict.policy(cfg.retry_of(server), server))
            return c

        def finish(t: pa.Table) -> pa.Table:
            return _segment_table(t, cfg.multi_value, cfg.layout.hidden)

        def segment(s: Shard, path: str, rows_in: int, rows: int, size: int, fetched: int,
                    fetch_s: float, merge_s: float, write_s: float, peak: int | None = None,
                    **extra: Any) -> str:
            written.append(path)
            return dump(Segment(
                start=s.start, end=s.end, partition=s.partition, rows=rows, rows_in=rows_in,
                bytes=size, path=path, attempt=attempt, bytes_fetched=fetched,
                fetch_ms=fetch_s * 1000, merge_ms=merge_s * 1000, write_ms=write_s * 1000,
                ms=int((fetch_s + merge_s + write_s) * 1000),
                peak_rss=peak_rss() if peak is None else peak, rss_at_start=baseline,
                **extra))

        def path_of(s: Shard) -> str:
            return os.path.join(cfg.segment_dir, segment_name(s.start, s.end, s.partition,
                                                              attempt))

        batch: list[tuple[Shard, list[pa.Table], int, int, float]] = []

        def merge_batch() -> Iterator[str]:
            if not batch:
                return
            started = time.monotonic()
            parts = [t if t else [cfg.layout.schema().empty_table()] for _, t, _, _, _ in batch]
            merged = _merged(parts, cfg.layout, finish)
            merge_s = (time.monotonic() - started) / len(batch)
            peak = peak_rss()  # once a batch, as the partials' phase 2 (/proc reads)
            w = time.monotonic()
            files = encoded(merged, cfg)
            encode_s = (time.monotonic() - w) / len(batch)
            for (s, _, rows_in, fetched, fetch_s), out, data in zip(batch, merged, files,
                                                                   strict=True):
                if not out.num_rows and not s.written_empty:
                    yield _no_segment(s, rows_in, fetched, attempt)
                    continue
                w = time.monotonic() - encode_s
                path = path_of(s)
                size = _write(out, path, cfg, data)
                yield segment(s, path, rows_in, out.num_rows, size, fetched, fetch_s, merge_s,
                              time.monotonic() - w, peak)
            batch.clear()

        def prefetched() -> Iterator[tuple[list[Shard], list[Fetched | ShortRead], float]]:
            def fetch(b: list[Shard]) -> tuple[list[Shard], list[Fetched | ShortRead], float]:
                started = time.monotonic()
                got = fetch_shards(client, cfg.supervisor_task_id, b, slabs_on, without)
                return b, got, time.monotonic() - started

            return read_ahead(pool, fetch, shard_batches(small))

        todo = list(shards)
        small = [s for s in todo if pages(cfg, s) <= 1]

        # One thread reads (it alone uses the clients), so that reading overlaps merging
        # and writing (HTTP, IPC reading, Acero and Parquet release the GIL).
        pool = ThreadPoolExecutor(1, thread_name_prefix="phase2-slab-fetch")
        try:
            for n, (fetched_batch, fetched, fetch_all) in enumerate(prefetched(), 1):
                cfg.hooks.phase2_fetched(n)  # fault injection in tests (shuffled.spark.hooks)
                fetch_s = fetch_all / len(fetched_batch)
                for s, got in zip(fetched_batch, fetched, strict=True):
                    if isinstance(got, ShortRead):
                        yield _lost(cfg, s, got, attempt)
                        continue
                    tables, rows_in, size = got
                    if cfg.memory_budget and size > cfg.memory_budget // WORK_FACTOR:
                        yield from _streamed(cfg, s, tables, rows_in, size, fetch_s,
                                             path_of(s), segment)
                        continue
                    batch.append((s, tables, rows_in, size, fetch_s))
                yield from merge_batch()
            for s in todo:  # read in pages, each within the budget, merged as they come
                if pages(cfg, s) > 1:
                    yield from _paged(cfg, s, pages(cfg, s), client, slabs_on, without,
                                      path_of(s), segment, attempt)
            if written:
                sync_files(written, [cfg.segment_dir])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            for c in clients.values():
                c.close()
            verdict.close()

    return run


def _merged(parts: list[list[pa.Table]], layout: Layout,
            finish: Callable[[pa.Table], pa.Table]) -> list[pa.Table]:
    """:func:`.merge.merge_partitions` of a batch's shards (their tables as read, with
    ``__key``, which it drops in selecting the layout's columns). A shard holds each
    slab's run rolled up on its own, so a key repeats only across slabs, and rarely: the
    shards are sorted, and only the runs of equal keys the sort puts side by side are
    grouped (:attr:`.merge.Repeats.RARE`). That needs keys that compare as the group-by
    does (no floats, no lists). Otherwise the shards whose ``__key`` hashes all differ
    are only sorted (a group key's rows share its hash, :func:`_distinct`), and the
    others grouped. (Proving hashed shards distinct first cost more than finding runs.)"""
    if runs_comparable(layout):
        return merge_partitions(parts, layout, finish, Repeats.RARE)
    alone = _distinct(parts)
    out: list[pa.Table | None] = [None] * len(parts)
    for flag, repeats in ((True, Repeats.NONE), (False, Repeats.ANY)):
        at = [n for n, a in enumerate(alone) if a is flag]
        if at:
            for n, t in zip(at, merge_partitions([parts[n] for n in at], layout, finish,
                                                 repeats), strict=True):
                out[n] = t
    return [t for t in out if t is not None]


def _keyless(table: pa.Table) -> pa.Table:
    return table.drop_columns([KEY_COLUMN]) if KEY_COLUMN in table.column_names else table


def _distinct(parts: Sequence[Sequence[pa.Table]]) -> list[bool]:
    """Per part (a shard's tables, each with its fixed-width ``__key``: 4-byte hash or
    8-byte partition and hash), whether no two of its rows share a hash; False for a part
    without such keys (range keys, or none: a batch's shards are keyed alike, so range keys
    anywhere make every part False). The keys of the whole batch are read as integers at
    once: a ``key_ints`` per table was 85 of comparison 7's phase-2 samples."""
    keyed = np.array([bool(tables) and all(KEY_COLUMN in t.column_names for t in tables)
                      for tables in parts], bool)
    numbers = np.flatnonzero(keyed)
    chunks = [c for n in numbers.tolist() for t in parts[n] for c in t.column(KEY_COLUMN).chunks]
    if not chunks:  # no rows to share a hash
        return keyed.tolist()
    got = (key_ints(pa.chunked_array(chunks, pa.binary()))
           if all(c.type == pa.binary() for c in chunks) else None)
    if got is None:  # range keys
        return [False] * len(parts)
    part = np.repeat(numbers.astype(np.uint64),
                     [sum(t.num_rows for t in parts[n]) for n in numbers.tolist()])
    # Each table is a slab's run of the shard, in key order: a stable sort (timsort)
    # merges the runs (0.72 against 1.72 ms for 2,000 runs of 26 rows).
    every = np.sort((part << np.uint64(32)) | (got[0] & np.uint64(0xFFFFFFFF)), kind="stable")
    twice = every[1:][every[1:] == every[:-1]] >> np.uint64(32)
    keyed[np.unique(twice).astype(np.int64)] = False
    return keyed.tolist()


def _no_segment(s: Shard, rows_in: int, fetched: int, attempt: int) -> str:
    """An empty numShards partition's record: no file (path ""), read for the rows check
    and dropped before the publish (:func:`shuffled.spark.driver.late.phase2`)."""
    return dump(Segment(start=s.start, end=s.end, partition=s.partition, rows=0,
                        rows_in=rows_in, bytes=0, path="", attempt=attempt,
                        bytes_fetched=fetched))


def _lost(cfg: Phase2Config, s: Shard, got: ShortRead, attempt: int) -> str:
    """The Lost record of a shard a daemon could not serve whole: not a failure of the
    task, the driver makes what was lost again and merges the shard once more."""
    why = f"{got.server}: {got.why}"
    cfg.hooks.phase2_lost(s.partition, (got.server,), why)
    return dump(Lost(start=s.start, end=s.end, partition=s.partition, attempt=attempt,
                     lost=(got.server,), missing=(got.server,) if got.missing else (),
                     why=why))


def pages(cfg: Phase2Config, s: Shard) -> int:
    """In how many key ranges ``s`` is read: 1 unless its rows, estimated, pass the
    budget's share for one piece and its keys are fixed-width (hashed); then enough that
    each range is about :attr:`Phase2Config.page_bytes`."""
    if not (cfg.memory_budget and s.key_width and s.nbytes > cfg.memory_budget // WORK_FACTOR):
        return 1
    return -(-s.nbytes // cfg.page_bytes)


def _paged(cfg: Phase2Config, s: Shard, count: int, client: Callable[[str], ShuffleClient],
           slabs_on: dict[str, int], without: Mapping[str, frozenset[str]] | None,
           path: str, segment: Callable[..., str], attempt: int) -> Iterator[str]:
    """A shard too big to hold within the budget (numShards 1 on a large chunk, say): read
    as ``count`` narrower key ranges of it one after another, each from every daemon
    holding the chunk, their rows merged within the budget as they come (a range holds
    whole rolled-up keys: a key's hash decides its range) and written as the sorted rows
    come; the partials' paged reads' counterpart. Each range is rolled up as it comes,
    since no key is in two of them, and the bounded merge only sorts what that leaves:
    comparison 5's shards (2.1M rows fetched, 590k out) spilled every row fetched,
    twice, before (docs/benchmarks.md). A daemon that cannot serve a range makes
    the shard :class:`Lost`, and what was written of it is removed."""
    started = time.monotonic()
    rows_in, fetched, fetch_s = 0, 0, 0.0
    short: list[ShortRead] = []

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal rows_in, fetched, fetch_s
        for lo, hi in split_range(s.key_from, s.key_to, count, s.key_width):
            began = time.monotonic()
            got = fetch_shards(client, cfg.supervisor_task_id, [replace(s, key_from=lo,
                                                                         key_to=hi)],
                               slabs_on, without)[0]
            fetch_s += time.monotonic() - began
            if isinstance(got, ShortRead):
                short.append(got)
                return
            tables, rows, size = got
            rows_in += rows
            fetched += size
            if tables:
                page = rolled_up(tables, cfg.layout)  # selects the layout's columns
                del tables
                yield from page.to_batches()

    with SegmentSink(cfg, path) as sink:
        stats = merge_bounded(batches(), cfg.layout, cfg.memory_budget, sink, cfg.spill_dir,
                              distinct=True)
    if short or (not sink.rows and not s.written_empty):
        os.unlink(path)
    if short:
        yield _lost(cfg, s, short[0], attempt)
        return
    if not sink.rows and not s.written_empty:
        yield _no_segment(s, rows_in, fetched, attempt)
        return
    merge_s = time.monotonic() - started - fetch_s
    yield segment(s, path, rows_in, sink.rows, os.path.getsize(path), fetched, fetch_s,
                  merge_s, 0.0, pages=count, spill_files=stats.files,
                  spill_bytes=stats.bytes)


def _streamed(cfg: Phase2Config, s: Shard, tables: list[pa.Table], rows_in: int, size: int,
              fetch_s: float, path: str, segment: Callable[..., str]) -> Iterator[str]:
    """A shard bigger than the budget's share: merged by range splitting, written as the
    sorted rows come (phase2.spill)."""
    started = time.monotonic()

    def batches() -> Iterator[pa.RecordBatch]:
        while tables:
            yield from _keyless(tables.pop()).to_batches()

    with SegmentSink(cfg, path) as sink:
        stats = merge_bounded(batches(), cfg.layout, cfg.memory_budget, sink, cfg.spill_dir)
    yield segment(s, path, rows_in, sink.rows, os.path.getsize(path), size, fetch_s,
                  time.monotonic() - started, 0.0, spill_files=stats.files,
                  spill_bytes=stats.bytes)

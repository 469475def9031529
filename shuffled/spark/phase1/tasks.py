"""Phase 1 on the executors: roll up locally, send each (interval, partition) partial segment.

Rows reach a task one of two ways: a Spark 4 Python data source sink (:mod:`.sink`)
hands JVM rows to Python as Arrow batches carrying their partition (``__bucket``); or, for
Parquet input, the task reads its row groups itself (:mod:`shuffled.spark.phase1.native.reader`, no JVM hand-off) and
computes the partition after its rollup. Each flush sends its partials with ONE streamed
bulk upload (docs/bulk-upload.md), on the task's upload thread while the task goes on
reading and rolling up the next rows (one flush on the wire at a time; the task's result
is returned only once every upload is answered). Each Spark task is one subtask. Its id is
``p<sparkPartition>-a<taskAttemptId>-f<flush>``: ``taskAttemptId`` is unique per attempt (retries and speculative copies included), so two
attempts never overwrite each other. The task RETURNS the list of partials it uploaded as
its commit message; Spark's commit coordinator lets exactly one attempt per partition
commit and hands only those messages to the driver-side ``commit``, so the driver's list
names exactly the committed attempts (docs/exactly-once.md).

Memory per task is bounded, and the rollup combines as much as that bound allows (the seed's
"combiner"): raw rows are buffered up to ``max_rows`` (maxRowsInMemory) and rolled up
together; rolled-up rows are kept, across buffers, up to a quarter of ``max_bytes``
(maxBytesInMemory; a combine of them peaks at about three times their size), then
compacted, and flushed as additional partial segments (new flush number) only if still
more than half that. So a task whose distinct keys fit ships each key once, as one node's
full rollup of its input would. A flush takes only the time chunks the input has moved
past when the reader says how far that is (:mod:`shuffled.spark.phase1.native.timeorder`), so time-ordered input ships
each chunk once per task. On input that does not fold (Trino's adaptive partial
aggregation) held tables stop being compacted, and once a flush's combine shows that keys
do not fold across buffers either, held tables go out side by side and raw rows pass
ungrouped. A flush being uploaded is held until its answer.
This module runs on executors: it imports shuffled.client/protocol, the native reader,
pyarrow and pyspark's data source API.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import groupby
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.protocol import Interval, PartialKey
from shuffled.slab.build import Slab
from shuffled.spark.records import Partial, Record, SlabSent, TaskStats, dump
from shuffled.spark.spec.granularity import bucket_end
from shuffled.spark.phase1.native.reader import NativeInput, Split, read_split
from shuffled.spark.phase1.native.text.blocks import ByteMeter
from shuffled.spark.phase1.partials import EOS, Encoder, encode_flush
from shuffled.spark.phase1.ring import Placer
from shuffled.spark.phase1.slabs import ROW_HASH, KeySample, cut_slab, with_lead, with_row_hashes
from shuffled.spark.phase1.config import Phase1Config
from shuffled.spark.phase1.native.timeorder import AT_ONCE, TimeOrdered
from shuffled.spark.rows.multivalue import has_multi
from shuffled.spark.rows.memory import peak_rss, reset_peak_rss, rss
from shuffled.spark.rows.rollup import (
    BAD, BUCKET, CHUNK, LEAD, WITH_ERROR, combine, rollup_input,
)


#: The native reader's partitioning of a table's rows (``native.Bucketer`` for hashed,
#: ``native_range.RangeBucketer`` for range partitions): one partition per row.
Bucketing = Callable[[pa.Table], np.ndarray]

#: A full raw buffer whose rollup keeps at least this share of its rows does not fold
#: (Trino's adaptive partial aggregation uses the same ratio).
UNFOLDABLE = 0.8
#: Once input does not fold, one full raw buffer in this many is rolled up to check it again.
RECHECK = 8
#: A combine of held tables keeping at least this share of their rows folded nothing worth
#: its cost: later flushes ship held tables side by side, and raw rows pass ungrouped.
SCATTERED = 0.95


#: Told of each slab stored: its statistics section (Arrow IPC bytes), its daemon and its
#: sample of distinct range keys. The driver's closure merges them per chunk (the late
#: plan, phase2.shardplan).
OnSlab = Callable[[Slab, str, KeySample | None], None]


class _Task:
    def __init__(self, cfg: Phase1Config, bucketer: Bucketing | None = None,
                 watermark: Callable[[], int | None] | None = None,
                 on_slab: OnSlab | None = None) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        index = ctx.partitionId() if ctx else 0
        self.partition = cfg.partition_ids[index] if cfg.partition_ids else index
        self.attempt = ctx.taskAttemptId() if ctx else 0
        self.attempt_number = ctx.attemptNumber() if ctx else 0
        self.cfg = cfg
        self.keep = cfg.only_keys.get(self.partition, frozenset()) if cfg.only_keys else None
        self.placer = Placer(cfg.servers, self.partition, cfg.replicas, cfg.token, cfg.ca_file)
        self.server = self.placer.order[0]
        self.raw: list[pa.Table] = []
        self.raw_rows = 0
        self.raw_bytes = 0
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.unfoldable = False  # keys do not fold: held tables are no longer combined
        self.buffers = 0  # full raw buffers rolled up (or passed through)
        self.scattered = False  # the last combine of held tables kept nearly every row
        self.flushes = 0
        self.uploads: list[Partial] = []
        self.slabs: list[SlabSent] = []
        self.on_slab = on_slab
        self.stats = {"rows_in": 0, "processed": 0, "processed_with_error": 0,
                      "unparseable": 0, "thrown_away": 0,
                      "bytes_processed": 0, "bytes_shuffled": 0, "bytes_before_compression": 0,
                      "rows_shipped": 0, "bytes_replicated": 0, "replication_ms": 0,
                      "failovers": 0}
        self.bad: list[dict[str, Any]] = []
        self.multi: set[str] = set()  # dimensions seen holding a multi-value
        # JVM rows carry their partition (__bucket); native rows get it after the rollup.
        self.bucketer = bucketer
        # How far the input has moved in time (timeorder.TimeOrdered): None flushes all.
        self.watermark = watermark
        self.extra = [CHUNK] if bucketer else [CHUNK, BUCKET]
        # Slabs of a range key on string dimensions: the rollup orders its groups by their
        # values after the chunk, the slab's order, so the cut need not sort them again
        # (slabs.row_keys; a key holding another type is ordered by its text there).
        keying, strings = cfg.slabs, {d for d, t in cfg.layout.dims if t == "string"}
        self.order_by: tuple[str, ...] = (
            tuple(keying.columns) if keying is not None and keying.kind != "hashed"
            and set(keying.columns) <= strings else ())
        self.encoder = Encoder(cfg.layout.schema(), cfg.compression)
        # Uploads run here, one at a time, while the task reads and rolls up on.
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="phase1-upload")
        self._uploading: Future[None] | None = None

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        self.stats["rows_in"] += batch.num_rows
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        flags = table.column(BAD)
        erred = 0
        if flags.null_count != len(flags):
            erred = self._count_bad(flags)
            # Rows with a column's parse error are ingested (that value null), as Druid's
            # processedWithError rows are; thrown-away and unparseable ones are not.
            table = table.filter(pc.or_kleene(pc.is_null(flags),
                                              pc.starts_with(flags, WITH_ERROR)))
        table = table.drop_columns([BAD])
        self.stats["processed"] += table.num_rows - erred
        if table.num_rows == 0:
            return
        # Roll up in large slices: per-batch rollup of mostly-distinct keys would only add
        # work. A batch larger than maxRowsInMemory or the raw share of maxBytesInMemory is
        # taken a slice at a time (the bounds).
        per_row = max(1, table.nbytes // table.num_rows)
        step = max(1, min(self.cfg.max_rows, self.cfg.raw_limit // per_row))
        for lo in range(0, table.num_rows, step):
            piece = table.slice(lo, step) if table.num_rows > step else table
            self.raw.append(piece)
            self.raw_rows += piece.num_rows
            self.raw_bytes += piece.num_rows * per_row
            if self.raw_rows >= self.cfg.max_rows or self.raw_bytes >= self.cfg.raw_limit:
                self._rollup_raw()

    def _rollup_raw(self) -> None:
        self._rollup_raw_only()
        if self.unfoldable and self._pending_bytes() > self.cfg.pending_limit // 2:
            # Keys that do not fold within a buffer will not fold across buffers either:
            # combining held tables would only copy them (3x their size at the peak, the
            # largest allocation of a phase-1 task on such input). Ship them as they are.
            self.flush_past()
        elif len(self.pending) > 1 and self._pending_bytes() > self.cfg.pending_limit:
            # One rolled-up table has nothing left to combine: only merge several.
            merged = self._pending_table()
            self.pending, self.pending_rows = [merged], merged.num_rows
            if merged.nbytes > self.cfg.pending_limit // 2:
                self.flush_past()

    def flush_past(self) -> None:
        """Flush the time chunks the input has moved past, keeping the others to combine
        with the rows still to come, so that time-ordered input ships each chunk once per
        task; all of it without a watermark, or when what would be kept is over a quarter of
        the limit (input out of time order; and each flush ships at least a quarter)."""
        mark = self.watermark() if self.watermark is not None else None
        if mark is None:
            self.flush()
            return
        self._rollup_raw_only()
        masks = [pc.less(t.column(CHUNK), mark) for t in self.pending]
        gone = [int(pc.sum(m).as_py() or 0) for m in masks]
        # What would be kept, estimated before anything is copied.
        kept_bytes = sum(t.nbytes * (t.num_rows - n) // max(t.num_rows, 1)
                         for t, n in zip(self.pending, gone, strict=True))
        if not any(gone) or kept_bytes > self.cfg.pending_limit // 4:
            self.flush()
            return
        past = [t.filter(m) for t, m, n in zip(self.pending, masks, gone, strict=True) if n]
        kept = [t.filter(pc.invert(m)) for t, m, n in zip(self.pending, masks, gone, strict=True)
                if n < t.num_rows]
        del masks
        self.pending, self.pending_rows = past, sum(t.num_rows for t in past)
        self.flush()
        self.pending, self.pending_rows = kept, sum(t.num_rows for t in kept)

    def _pending_bytes(self) -> int:
        return sum(t.nbytes for t in self.pending)

    def _pending_table(self) -> pa.Table:
        if len(self.pending) == 1:
            return self.pending[0]
        led = [LEAD in t.column_names for t in self.pending]
        if any(led) and not all(led):  # the lead is an order, never needed: drop it
            self.pending = [t.drop_columns([LEAD]) if LEAD in t.column_names else t
                            for t in self.pending]
        return combine(pa.concat_tables(self.pending), self.cfg.layout,
                       self.extra + [LEAD] * all(led), dictionaries=True,
                       order_by=self.order_by)

    def _rollup_raw_only(self) -> None:
        if self.raw:
            full = self.raw_rows >= self.cfg.max_rows or self.raw_bytes >= self.cfg.raw_limit
            # Trino's adaptive partial aggregation: once a full buffer keeps nearly every
            # row, the combiner stops combining held tables; once a flush's combine showed
            # that keys do not fold across buffers either (``scattered``), it passes rows
            # through ungrouped, rolling up one full buffer in RECHECK to see whether the
            # input folds again (sketches are always grouped: a sketch per row is dear).
            self.buffers += full
            group = (not (self.unfoldable and self.scattered) or bool(self.cfg.layout.sketches)
                     or self.buffers % RECHECK == 0)
            # String dimensions stay dictionary-encoded (row groups read natively carry
            # their own dictionaries; grouping unifies them) until the partials are cut.
            raw = pa.concat_tables(self.raw)
            # Slabs of a hashed key: the rollup orders its groups as the slab will
            # (slabs.with_lead), so the cut need not sort them again.
            led = with_lead(raw, self.cfg.slabs, self.cfg.layout)
            rolled = rollup_input(raw if led is None else led, self.cfg.layout,
                                  self.extra + [LEAD] * (led is not None),
                                  dictionaries=True, group=group, order_by=self.order_by)
            del raw, led
            if full and group:
                self.unfoldable = rolled.num_rows >= UNFOLDABLE * self.raw_rows
            self.raw, self.raw_rows, self.raw_bytes = [], 0, 0
            self.pending.append(rolled)
            self.pending_rows += rolled.num_rows

    def _count_bad(self, flags: pa.ChunkedArray) -> int:
        """Count thrown-away ('T'), unparseable ('U') and processed-with-error ('E') rows;
        keep the first few of the last two (Druid's saved parse exceptions). Returns the
        processed-with-error count."""
        flagged = pc.drop_null(flags)
        thrown = int(pc.sum(pc.equal(flagged, "T")).as_py() or 0)
        erred = int(pc.sum(pc.starts_with(flagged, WITH_ERROR)).as_py() or 0)
        self.stats["thrown_away"] += thrown
        self.stats["processed_with_error"] += erred
        self.stats["unparseable"] += len(flagged) - thrown - erred
        room = self.cfg.max_saved_bad - len(self.bad)
        if room <= 0 or len(flagged) == thrown:
            return erred
        events = flagged.filter(pc.not_equal(flagged, "T")).slice(0, room)
        for v in events.to_pylist():
            flag, file, line, reason, raw = (v.split("\t", 4) + ["", "", "", ""])[:5]
            self.bad.append({"file": file, "line": int(line) if line else None,
                             "message": reason, "raw": raw,
                             "errorType": "processedWithError" if flag == WITH_ERROR
                             else "unparseable"})
        return erred

    def flush(self) -> None:
        """Send what is held as one bulk upload (after the previous one is answered)."""
        self._rollup_raw_only()
        if not self.pending:
            return
        # Held tables are combined as the flush goes out (keys that do not fold within a
        # buffer may fold across buffers: 10M rows of comparison 5 fold to 2.4M that way),
        # unless an earlier flush's combine kept nearly every row: then they go out side
        # by side (the partials are cut by (chunk, partition) anyway), a combine in RECHECK
        # checking again (it was a third of a Druid-shaped task's rollup time).
        many = len(self.pending) > 1
        side_by_side = (many and self.scattered and self.flushes % RECHECK != 0
                        and all(t.schema.equals(self.pending[0].schema) for t in self.pending))
        if side_by_side:
            table = pa.concat_tables(self.pending)
        else:
            table = self._pending_table()
            if many:
                self.scattered = table.num_rows >= SCATTERED * self.pending_rows
        self.pending, self.pending_rows = [], 0
        if self.cfg.slabs is not None:  # before waiting: the upload under way goes on
            table = with_row_hashes(table, self.cfg.slabs, self.cfg.layout)
        sub = f"p{self.partition}-a{self.attempt}-f{self.flushes}"
        self.flushes += 1
        self.wait_uploaded()  # one flush on the wire at a time: memory stays bounded
        # Handed over in a list the upload empties: the work item's arguments would keep
        # the table alive until the upload ends, beside its encoded bytes.
        self._uploading = self._uploader.submit(self._upload, [table], sub)
        del table

    def wait_uploaded(self) -> None:
        """Wait for the upload under way, raising what it raised."""
        if self._uploading is not None:
            uploading, self._uploading = self._uploading, None
            uploading.result()

    def close(self) -> None:
        self._uploader.shutdown(wait=True, cancel_futures=True)
        self.placer.close()

    def _upload(self, holder: list[pa.Table], sub: str) -> None:
        """On the upload thread: partition, cut and send one flush's partials to its
        daemons (the placer fails over past unusable ones, docs/failover.md)."""
        table = holder.pop()
        self.multi.update(d for d in self.cfg.multi_value
                          if d not in self.multi and has_multi(table.column(d)))
        if self.cfg.slabs is not None:
            self._upload_slab(table)
            return
        buckets = self.bucketer(table) if self.bucketer is not None else None
        if self.keep is not None:  # a recompute: only the keys that were lost
            table, buckets = only_keys(table, buckets, self.keep)
        sup, gran = self.cfg.supervisor_task_id, self.cfg.segment_granularity
        raw = self.encoder.raw_bytes
        flush = encode_flush(table, self.cfg.layout, buckets, self.encoder)
        del table, buckets  # the encoded flush is what is held while it is on the wire
        made: list[tuple[PartialKey, int, int]] = []  # key, rows, stream bytes
        sent = len(flush.schema)  # on the wire: the schema message once, then the bodies

        def partials() -> list[tuple[PartialKey, memoryview]]:
            # Taken by the bulk upload (again after a failover). A list, not a generator:
            # the bodies are views of the encoded flush, ready at once, so the upload
            # gathers them into large chunks instead of sending each the moment it is made
            # (one HTTP chunk per partial for the daemon to parse).
            return [(PartialKey(sup, sub, Interval(chunk, bucket_end(chunk, gran)), bucket), body)
                    for chunk, bucket, rows, body in flush.bodies()]

        for chunk, bucket, rows, body in flush.bodies():
            key = PartialKey(sup, sub, Interval(chunk, bucket_end(chunk, gran)), bucket)
            made.append((key, rows, len(flush.schema) + len(body) + len(EOS)))
            sent += len(body)
        placed = self.placer.put(sup, partials, schema=flush.schema)
        self.stats["bytes_before_compression"] += self.encoder.raw_bytes - raw
        self.stats["bytes_shuffled"] += sent
        replicated = sent * (len(placed.servers) - 1)
        self.stats["bytes_replicated"] += replicated
        self.stats["replication_ms"] += placed.replica_ms
        self.stats["failovers"] += placed.failovers
        for (key, rows, size), answer in zip(made, placed.answers, strict=True):
            self.stats["rows_shipped"] += rows
            crc = answer.get("crc32c")
            self.uploads.append(Partial(
                task=self.partition, server=placed.servers[0], replicas=tuple(placed.servers),
                sub=sub, start=key.interval.start, end=key.interval.end,
                partition=key.partition_id, rows=rows, bytes=size,
                crc32c=crc if isinstance(crc, str) else None))
            self.cfg.hooks.phase1_uploaded(self.partition, self.attempt_number, len(self.uploads))


    def _upload_slab(self, table: pa.Table) -> None:
        """On the upload thread: one flush as slabs (its shards are chosen after phase 1,
        docs/slab.md), on the first daemon of the task's ring that takes them: one slab
        per :data:`SLAB_CHUNKS` time chunks, so that a slab's statistics (2 KiB of
        registers and a sample a chunk) stay within what a daemon takes (16 MiB)."""
        for piece in by_chunks(table, SLAB_CHUNKS):
            self._put_slab(piece)

    def _put_slab(self, table: pa.Table) -> None:
        assert self.cfg.slabs is not None
        sub = f"p{self.partition}-a{self.attempt}"
        slab_id = len(self.slabs)
        slab, sample = cut_slab(table, self.cfg.layout, self.cfg.slabs,
                                self.cfg.segment_granularity, sub_task_id=sub, slab_id=slab_id,
                                attempt=self.attempt_number, compression=self.cfg.compression)
        rows = table.num_rows
        span = pc.min_max(table.column(CHUNK)).as_py() if rows else {"min": None, "max": None}
        self.stats["bytes_before_compression"] += table.nbytes - sum(
            table.column(c).nbytes for c in (LEAD, ROW_HASH) if c in table.column_names)
        del table
        placed = self.placer.put_slab(self.cfg.supervisor_task_id, slab)
        server = placed.servers[0]
        self.stats["bytes_shuffled"] += slab.size
        self.stats["failovers"] += placed.failovers
        self.stats["bytes_replicated"] += slab.size * (len(placed.servers) - 1)
        self.stats["replication_ms"] += placed.replica_ms
        self.stats["rows_shipped"] += rows
        self.slabs.append(SlabSent(task=self.partition, server=server, sub=sub, slab=slab_id,
                                   attempt=self.attempt_number, rows=rows, bytes=slab.size,
                                   chunks=slab.chunks,
                                   replicas=placed.servers if len(placed.servers) > 1 else (),
                                   first_chunk=span["min"], last_chunk=span["max"]))
        if self.on_slab is not None:
            self.on_slab(slab, server, sample)
        self.cfg.hooks.phase1_uploaded(self.partition, self.attempt_number, len(self.slabs))


#: Time chunks a slab holds at most: its statistics are up to 2 KiB of registers a chunk
#: (and, until the key sample was written empty, up to 256 range keys), and a daemon takes
#: 16 MiB of them (20.8 MB for 10,000 day chunks were refused).
SLAB_CHUNKS = 1024


def by_chunks(table: pa.Table, most: int) -> Iterator[pa.Table]:
    """``table``'s rows in pieces of at most ``most`` time chunks (``table`` itself when it
    holds no more). Rows in chunk order, as a flush's usually are, go as slices: a
    filter copied every column of comparison 7's flushes (3,652 day chunks) before
    ``cut_slab`` copied them again, and ``np.unique`` sorted the chunks to count them."""
    chunks = table.column(CHUNK).to_numpy()
    if len(chunks) and bool((chunks[1:] >= chunks[:-1]).all()):
        firsts = np.concatenate([[0], np.flatnonzero(chunks[1:] != chunks[:-1]) + 1])
        if len(firsts) <= most:
            yield table
            return
        ends = [*firsts[most::most].tolist(), len(chunks)]
        for start, end in zip(firsts[::most].tolist(), ends, strict=True):
            yield table.slice(start, end - start)
        return
    distinct = np.unique(chunks)
    if len(distinct) <= most:
        yield table
        return
    for lo in range(0, len(distinct), most):
        first = distinct[lo]
        mask = chunks >= first
        if lo + most < len(distinct):
            mask &= chunks < distinct[lo + most]
        yield table.filter(pa.array(mask))


def run_native_task(cfg: Phase1Config, native: NativeInput, splits: Iterator[Split],
                    on_slab: OnSlab | None = None) -> list[str]:
    """Run one phase-1 subtask reading its Parquet splits itself (see :mod:`shuffled.spark.phase1.native.reader`)."""
    columns = list(dict.fromkeys([native.ts_column, *(d for d, _ in native.dims),
                                  *(m[2] for m in native.metrics)]))
    # Consecutive row groups of one file are read through one opened file (one footer read).
    per_file = [Split(path, tuple(g for s in group for g in s.row_groups),
                      sum(s.nbytes for s in group), group[0].dictionary)
                for path, group in ((p, list(g)) for p, g in groupby(splits, key=lambda s: s.path))]
    # Read side by side in time order (timeorder), so that the combiner can flush the time
    # chunks every file has moved past instead of a slice of every chunk per flush.
    # Each file read at once holds its reader and a batch: the budget says how many.
    at_once = min(AT_ONCE, cfg.max_bytes // (64 << 20)) if cfg.max_bytes else AT_ONCE
    meter = ByteMeter()  # text input: the bytes read (Parquet's: counted by the driver)
    tables = TimeOrdered([read_split(s, native, columns, meter) for s in per_file], at_once)
    return run_task(cfg, iter(tables), native.bucketer, lambda: tables.watermark, meter,
                    on_slab)


def run_task(cfg: Phase1Config, batches: Iterator[pa.RecordBatch | pa.Table],
             bucketer: Bucketing | None = None,
             watermark: Callable[[], int | None] | None = None,
             meter: ByteMeter | None = None, on_slab: OnSlab | None = None) -> list[str]:
    """Run one phase-1 subtask over its input batches; returns its JSON result lines.
    ``watermark`` says below which time chunk the input has moved (see
    :mod:`shuffled.spark.phase1.native.timeorder`)."""
    started = time.monotonic()
    # Pages earlier tasks of this worker freed stay with its allocator (docs/ingestion.md,
    # the merge budget): handing them back first made this task fault them in again, and
    # on a VM whose host reclaims free pages a fresh 2 MiB page costs ~3.7 ms
    # (docs/benchmarks.md).
    cfg.hooks.task_started()
    reset_peak_rss()
    baseline = rss()
    task = _Task(cfg, bucketer, watermark, on_slab)
    try:
        for batch in batches:
            task.add(batch)
        task.flush()
        task.wait_uploaded()
    finally:
        task.close()
    if meter is not None:
        task.stats["bytes_processed"] = meter.bytes
    stats = TaskStats(partition=task.partition, attempt=task.attempt,
                      attempt_number=task.attempt_number, server=task.server,
                      servers_down=tuple(sorted(task.placer.down)),
                      ms=int((time.monotonic() - started) * 1000), bad=tuple(task.bad),
                      peak_rss=peak_rss(), rss_at_start=baseline,
                      multi_value=tuple(sorted(task.multi)), **task.stats)
    records: list[Record] = [*task.uploads, *task.slabs, stats]
    return [dump(u) for u in records]


def run_rows_task(cfg: Phase1Config, rows: Iterable[Any], schema: pa.Schema,
                  batch_rows: int = 20_000) -> list[str]:
    """:func:`run_task` over Spark Rows (``DataFrame.rdd``): how a recompute re-runs one
    JVM-read subtask alone (``SparkContext.runJob`` on chosen partitions), where the data
    source sink would run them all."""

    def batches() -> Iterator[pa.RecordBatch]:
        chunk: list[dict[str, Any]] = []
        for row in rows:
            chunk.append(row.asDict())
            if len(chunk) >= batch_rows:
                yield pa.RecordBatch.from_pylist(chunk, schema=schema)
                chunk = []
        if chunk:
            yield pa.RecordBatch.from_pylist(chunk, schema=schema)

    return run_task(cfg, batches())


# A recompute's filter (docs/failover.md): a re-run subtask uploads only the rows of the
# (time chunk, partition) keys that were lost, nothing that survived.
def only_keys(table: pa.Table, buckets: Any, keep: frozenset[tuple[int, int]],
              ) -> tuple[pa.Table, Any]:
    """The rows of ``table`` whose (chunk, partition) is in ``keep`` (vectorised: a
    recompute may keep thousands of keys of millions of rows)."""
    chunks = table.column(CHUNK).to_numpy()
    of = np.asarray(buckets if buckets is not None else table.column(BUCKET).to_numpy())
    kept_chunks = np.array(sorted({c for c, _ in keep}), dtype=chunks.dtype)
    width = int(max(int(of.max(initial=0)), max(b for _, b in keep))) + 1 if keep else 1
    # (chunk, partition) as one integer: the chunk's rank among the kept chunks, times width.
    rank = np.searchsorted(kept_chunks, chunks)
    known = (rank < len(kept_chunks)) & (kept_chunks[np.minimum(rank, len(kept_chunks) - 1)]
                                          == chunks) if len(kept_chunks) else np.zeros(
                                              len(chunks), dtype=bool)
    codes = rank.astype(np.int64) * width + of.astype(np.int64)
    wanted = np.array([int(np.searchsorted(kept_chunks, c)) * width + b for c, b in keep],
                      dtype=np.int64)
    mask = known & np.isin(codes, wanted)
    return table.filter(pa.array(mask)), (of[mask] if buckets is not None else None)

"""A phase-1 flush as a slab (docs/slab.md, issue 36): written without knowing the shard
count, its rows ordered by (time chunk, key) so that any key range chosen after phase 1 is
a contiguous run of each slab.

The key of a row:

- hashed: Spark's ``hash()`` of the partition columns (the partition dimensions, or
  ``__time`` and every dimension), as a uint32: the hash today's hashed shardSpec takes
  ``pmod`` of (:mod:`.spark_compat.murmur3`), stored as 4 big-endian bytes;
- hashed with ``numShards`` (the plan known up front): that ``pmod``, the row's partition
  (as :class:`.native.reader.Bucketer` computes it), then the hash, as 8 big-endian bytes:
  partition ``i`` is the key range ``[i << 32, (i + 1) << 32)``, and a partition too big
  for phase 2's memory budget is read in narrower ranges of its hash (pages). Batches are
  cut as for the other keys (a chunk's partitions share batches: a merge task reads a
  chunk's shards as one range and cuts it, :mod:`..phase2.slabmerge`);
- range / single_dim: the partition dimensions' tuple, order-preserving bytes
  (:func:`shuffled.slab.keys.tuple_keys`), nulls first as in today's range partitioning.

Each slab's statistics (rows, an HLL of the rolled-up keys, a sample of range keys per
chunk) are what the late plan (:mod:`shuffled.spark.phase2.shardplan`) is made from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.slab import keys as slab_keys
from shuffled.slab import sketch
from shuffled.slab.build import BATCH_ROWS, Slab, batch_starts, build, chunk_bounds
from shuffled.slab.keys import KEY_COLUMN
from shuffled.slab.wire import KeyKind
from shuffled.spark.phase1.config import Keying
from shuffled.spark.phase1.partials import COMPRESS_MIN_BYTES
from shuffled.spark.phase1.spark_compat.murmur3 import spark_hash
from shuffled.spark.rows.rollup import CHUNK, LEAD, Layout
from shuffled.spark.spec.granularity import bucket_end


def _ordered(col: pa.Array | pa.ChunkedArray, take: pa.Array | None) -> pa.Array:
    """``col`` in the order ``take`` gives (None: as it is), dictionary-decoded."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if take is not None:
        arr = arr.take(take)
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def hash_values(table: pa.Table, columns: tuple[str, ...]) -> np.ndarray:
    """The uint32 key of every row: Spark's ``hash(columns)``'s 32 bits."""
    return spark_hash([table.column(c) for c in columns]).astype(np.int32).view(np.uint32)


def _partition_of(h: np.ndarray, keying: Keying) -> np.ndarray:
    """Each uint32 hash's partition: with ``numShards`` the pmod of the signed hash, as
    pmod_hash computes it; else 0 (the key is the hash alone)."""
    if not keying.num_shards:
        return np.zeros(len(h), np.int64)
    return np.mod(h.view(np.int32).astype(np.int64), keying.num_shards)


def with_lead(table: pa.Table, keying: Keying | None, layout: Layout) -> pa.Table | None:
    """``table`` (rows before the rollup, or rolled up) with :data:`LEAD`, each row's
    (partition << 32 | hash) of a hashed slab key, for the rollup to order its groups by
    (:func:`.grouping.group`): the groups then come out in the slab's order, and
    :func:`cut_slab` neither hashes, sorts nor takes (the sort and the take were a third
    of comparison 5's upload thread). None when the key is not hashed, or a hashed
    column is not in its slab type yet (its hash would differ after the rollup's cast).

    Plain string columns of the key come back dictionary-encoded: the hash takes each
    distinct value's bytes once from a dictionary, and the rollup groups by one anyway
    (:func:`.grouping.dictionary_of` keeps it). Encoded twice, JSON input's rows (plain
    strings) cost the Druid shape's rollup 15% more."""
    if keying is None or keying.kind != "hashed" or LEAD in table.column_names:
        return None
    schema = layout.schema()
    types = dict(zip(schema.names, schema.types, strict=True))
    for c in keying.columns:
        if c not in table.column_names or c not in types:
            return None
        t = table.schema.field(c).type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if t != types[c]:
            return None
        if pa.types.is_string(t) and not pa.types.is_dictionary(table.schema.field(c).type):
            at = table.schema.get_field_index(c)
            table = table.set_column(at, c, pc.dictionary_encode(
                table.column(c).combine_chunks()))
    h = hash_values(table, keying.columns)
    lead = (_partition_of(h, keying).astype(np.uint64) << np.uint64(32)) | h.astype(np.uint64)
    return table.append_column(LEAD, pa.array(lead, pa.uint64()))


#: A flush's rows' 64-bit hashes of the rolled-up key (:func:`.sketch.row_hashes`), made on
#: the task's main thread (:func:`with_row_hashes`) for the upload thread's statistics.
ROW_HASH = "__row_hash"


def with_row_hashes(table: pa.Table, keying: Keying, layout: Layout) -> pa.Table:
    """``table`` (a flush's rolled-up rows) with :data:`ROW_HASH` where :func:`cut_slab`
    would hash its rows on the upload thread: range keys. A range task's upload thread
    (the cut, sketch and send of each flush) was its busier thread by ~40% (py-spy, the
    Druid shape: 1,217 samples against the main thread's 846), and the last flush's cut
    runs alone after the main thread is done; hashed keys hash on the main thread already
    (:func:`with_lead`)."""
    if keying.kind == "hashed" or ROW_HASH in table.column_names:
        return table
    hashes = sketch.row_hashes([table.column(k) for k in layout.keys])
    return table.append_column(ROW_HASH, pa.array(hashes, pa.uint64()))


def _in_order(chunks: np.ndarray, lead: np.ndarray) -> bool:
    """Whether rows are sorted by (chunk, lead) already."""
    if len(chunks) < 2:
        return True
    later = chunks[1:] > chunks[:-1]
    return bool(np.all(later | ((chunks[1:] == chunks[:-1]) & (lead[1:] >= lead[:-1]))))


def row_keys(table: pa.Table, keying: Keying) -> tuple[pa.Array, np.ndarray | None]:
    """Each row's key bytes, in that order, and the order grouping rows by (chunk, key)
    (None: the rows are in it). A hashed key is read from :data:`LEAD` where the rollup
    carried it (:func:`with_lead`). The keys are made in the slab's order, not taken into
    it: a second take of a range slab's keys copied its widest column once more."""
    chunks = table.column(CHUNK).to_numpy()
    if keying.kind == "hashed":
        if LEAD in table.column_names:
            lead = table.column(LEAD).combine_chunks().to_numpy(zero_copy_only=False)
            h = (lead & np.uint64(0xFFFFFFFF)).astype(np.uint32)
            part = (lead >> np.uint64(32)).astype(np.int64)
            order = None if _in_order(chunks, lead) else \
                chunk_order(chunks, part, keying.num_shards or 1, h)
        else:
            h = hash_values(table, keying.columns)
            part = _partition_of(h, keying)
            order = chunk_order(chunks, part, keying.num_shards or 1, h)
        if order is not None:
            h, part = h[order], part[order]
        keys = (slab_keys.partition_hash_keys(part, h) if keying.num_shards
                else slab_keys.hash_keys(h))
        return keys, order
    distinct, row, rank = slab_keys.distinct_tuple_keys(
        [table.column(c) for c in keying.columns])
    ranks = rank[row]
    # The rollup grouped the rows in this order where it sorted them (tasks' order_by).
    order = None if _in_order(chunks, ranks) else chunk_order(chunks, ranks, max(len(rank), 1))
    return distinct.take(pa.array(row if order is None else row[order])), order


def chunk_order(chunks: np.ndarray, major: np.ndarray, count: int,
                minor: np.ndarray | None = None) -> np.ndarray:
    """The order of rows by (chunk, ``major`` (ints below ``count``), ``minor`` (uint32)),
    as ``np.lexsort((minor, major, chunks))`` gives it, sorting one uint64 per row where
    the three fit in one: the chunks numbered in order, ``major`` and ``minor`` beside.
    Three lexsort passes were a fifth of a phase-1 task's slab upload (82 ms a slab of
    375,000 rows); the rolled-up rows come chunk by chunk, a run a stable sort takes as it
    is (9 ms)."""
    if not len(chunks):
        return np.zeros(0, np.int64)
    if bool((chunks[1:] >= chunks[:-1]).all()):
        number = np.concatenate([[0], np.cumsum(chunks[1:] != chunks[:-1])])
    else:
        number = chunk_numbers(chunks)
    low = 32 if minor is not None else 0
    width = max(int(count) - 1, 0).bit_length()
    if int(number.max()).bit_length() + width + low > 64:
        return np.lexsort((minor, major, chunks)) if minor is not None else \
            np.lexsort((major, chunks))
    key = ((number.astype(np.uint64) << np.uint64(width)) | major.astype(np.uint64))
    if minor is not None:
        key = (key << np.uint64(low)) | minor.astype(np.uint64)
    return np.argsort(key, kind="stable")


def chunk_numbers(chunks: np.ndarray) -> np.ndarray:
    """Small non-negative integers in the order of the chunk starts ``chunks`` (in any
    order): each start's distance from the first, in steps of the starts' greatest common
    divisor (a day, an hour ...), found from the starts of runs of equal chunks; their
    ranks where that spans more than 2^32 steps. A flush whose held tables went out side
    by side is a few chunk-ordered runs: ranking it by ``np.unique`` sorted it (28 ms a
    slab of 420,000 rows, against 0.5)."""
    first = np.concatenate([[0], np.flatnonzero(chunks[1:] != chunks[:-1]) + 1])
    starts = chunks[first]
    lo = int(starts.min())
    step = int(np.gcd.reduce(starts - lo)) or 1
    if (int(starts.max()) - lo) // step < (1 << 32):
        return (chunks - lo) // step
    return np.unique(chunks, return_inverse=True)[1].ravel()


def chunk_ends(chunk_start: np.ndarray, granularity: str) -> np.ndarray:
    """Each row's chunk end (computed once per distinct chunk; rows in chunk order, as a
    slab's are, find their chunks without sorting)."""
    if not len(chunk_start):
        return chunk_start.copy()
    if bool((chunk_start[1:] >= chunk_start[:-1]).all()):
        bounds = chunk_bounds(chunk_start)
        uniq = chunk_start[bounds[:-1]]
        inverse = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    else:
        uniq, inverse = np.unique(chunk_start, return_inverse=True)
    ends = np.array([bucket_end(int(c), granularity) for c in uniq.tolist()], dtype=np.int64)
    return ends[inverse]


#: Distinct rolled-up rows a slab's key sample keeps per chunk (range keys only).
SAMPLE = 4096


@dataclass(frozen=True)
class KeySample:
    """Per chunk, the rows of the ``SAMPLE`` smallest rolled-up-key hashes (a bottom-k
    sample: merged over slabs by keeping the smallest hashes again, it is a uniform sample
    of the chunk's DISTINCT rolled-up rows, each once however many subtasks shipped it),
    with their range keys. A reservoir of rows as shipped (the slab's statistics carried
    one, now written empty) over-weighs keys that many subtasks hold (they fold in phase
    2): measured, a tail shard came out 1.05x over maxRowsPerSegment with it."""

    chunks: np.ndarray  # int64 chunk start per sampled row
    hashes: np.ndarray  # uint64
    keys: pa.Array  # binary
    in_key_order: bool = False  # rows sorted by (chunk, key) already, as the slab's are
    rate: float = 1.0  # only rows whose hash is below this share of 2^64 were eligible


def bottom_k(chunks: np.ndarray, hashes: np.ndarray, keys: pa.Array, k: int = SAMPLE, *,
             in_key_order: bool = False) -> KeySample:
    """The rows of the ``k`` smallest ``hashes`` in each chunk (vectorised). Given rows in
    (chunk, key) order (``in_key_order``, as a slab's are) and no chunk over ``k`` rows,
    all are kept as they are, and the sample says it is in that order: on the Druid shape
    a slab's day holds ~100 rows, and ranking them by hash here, then by key again for the
    plan (:func:`..phase2.shardplan.from_stats`), was all waste."""
    if in_key_order and len(chunks):
        starts = np.flatnonzero(np.concatenate([[True], chunks[1:] != chunks[:-1]]))
        sizes = np.diff(np.append(starts, len(chunks)))
        if int(sizes.max()) <= k:
            return KeySample(chunks, hashes, keys, in_key_order=True)
    order = np.lexsort((hashes, chunks))
    c = chunks[order]
    first = np.flatnonzero(np.concatenate([[True], c[1:] != c[:-1]])) if len(c) else \
        np.zeros(0, np.int64)
    rank = np.arange(len(c)) - np.repeat(first, np.diff(np.append(first, len(c))))
    pick = order[rank < k]
    return KeySample(chunks[pick], hashes[pick], keys.take(pa.array(pick)))


def rate_sample(chunks: np.ndarray, hashes: np.ndarray, keys: pa.Array,
                rate: float = 1.0) -> KeySample:
    """:func:`bottom_k` of the rows (in the slab's (chunk, key) order) whose hash is below
    ``rate`` of the hash space: a sample every slab draws alike (a row's hash decides), so
    the union over slabs is a uniform sample of the chunk's distinct rolled-up rows at that
    rate, about ``rate`` x its rows. targetRowsPerSegment needs only a few dozen keys a
    shard (:data:`shuffled.spark.phase2.shardplan.KEYS_PER_SHARD`): comparison 12's day
    chunks (~820 rows, under the 4,096 kept) sent every key through Spark's shuffle."""
    if rate < 1.0:
        keep = hashes < sketch.rate_threshold(rate)
        chunks, hashes = chunks[keep], hashes[keep]
        keys = keys.filter(pa.array(keep))
    return replace(bottom_k(chunks, hashes, keys, in_key_order=True), rate=min(rate, 1.0))


def cut_slab(table: pa.Table, layout: Layout, keying: Keying, granularity: str, *,
             sub_task_id: str, slab_id: int, attempt: int, compression: str = "none",
             batch_rows: int = BATCH_ROWS) -> tuple[Slab, KeySample | None]:
    """``table`` (rolled-up rows: ``__chunk`` and the layout's columns, strings maybe
    dictionary-encoded) as one slab: the layout's columns in their plain types and
    ``__key``, in (chunk, key) order; and for range keys its :class:`KeySample`."""
    keys, order = row_keys(table, keying)
    take = pa.array(order) if order is not None else None
    schema = layout.schema()
    # Dictionary-encoded strings are taken as their indices, then decoded once: decoding
    # first copied every string twice (20 -> 5 ms a column of 613,000 rows).
    columns = [_ordered(table.column(f.name), take) for f in schema]
    columns = [c if c.type == f.type else c.cast(f.type, safe=False)
               for c, f in zip(columns, schema, strict=True)]
    data = pa.Table.from_arrays([*columns, keys],
                                schema=schema.append(pa.field(KEY_COLUMN, pa.binary())))
    chunk_start = table.column(CHUNK).to_numpy().astype(np.int64)
    # The HLL's row hash from the input's own columns (dictionaries hash each value once)
    # in table order, then put in the slab's. With numShards no estimate decides the plan:
    # no HLL (:func:`shuffled.spark.phase2.shardplan.from_stats`).
    hashes = (None if keying.num_shards else
              table.column(ROW_HASH).to_numpy() if ROW_HASH in table.column_names else
              sketch.row_hashes([table.column(k) for k in layout.keys]))
    if order is not None:
        chunk_start = chunk_start[order]
        hashes = hashes[order] if hashes is not None else None
    # As for partials (docs/ingestion.md): batches averaging under 64 KiB go uncompressed,
    # LZ4 costing ten times their encoding for a few hundred bytes each. A slab has a batch
    # per chunk at least: counted by rows alone, comparison 7's 100-row day batches were
    # compressed (a third of a slab's upload CPU, and phase 2 decompressed them again).
    batches = max(1, len(batch_starts(chunk_bounds(chunk_start), batch_rows)))
    options = (pa.ipc.IpcWriteOptions(compression=compression)
               if compression != "none" and data.nbytes >= COMPRESS_MIN_BYTES * batches
               else None)
    sample = (rate_sample(chunk_start, hashes, data.column(KEY_COLUMN).combine_chunks(),
                          keying.sample_rate)
              if keying.kind != "hashed" and hashes is not None else None)
    return build(data, chunk_start, chunk_ends(chunk_start, granularity),
                 kind=KeyKind.HASH if keying.kind == "hashed" else KeyKind.TUPLE,
                 sub_task_id=sub_task_id, slab_id=slab_id, attempt=attempt,
                 rollup_hashes=hashes, batch_rows=batch_rows,
                 options=options), sample

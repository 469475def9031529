"""A shard's rows from the slabs of a sealed task: batches chosen from the task's index in
one vectorised pass (chunk, key range), runs of whole batches sent as file ranges, the
batches at a shard's edges trimmed to its keys (at most two per slab and shard).

A task's index is the concatenation of its slabs' index sections (each a few KiB), built
on the first read after the seal and kept until the task changes (:class:`TaskIndex`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa

from shuffled.crc import crc32c
from shuffled.errors import Conflict, CorruptData
from shuffled.slab import wire
from shuffled.slab.wire import KEY_COLUMN
from shuffled.storage.ondisk.slabrows import SlabRow


@dataclass(frozen=True)
class SlabFile:
    path: Path
    data_at: int
    schema_len: int  # the data section's schema message (its first batch's offset)


@dataclass
class TaskIndex:
    files: list[SlabFile]
    index: pa.Table  # the slabs' index rows, and "slab": the position in ``files``
    slabs: int  # slabs of the sealed subtasks held (zero-batch ones too)
    rows: int
    chunk_start: np.ndarray  # the index's columns as numpy, for the binary search
    chunk_end: np.ndarray
    _schemas: dict[int, tuple[bytes, pa.Schema]] = field(default_factory=dict)


def newest_attempts(rows: list[tuple[Path, SlabRow]]) -> list[tuple[Path, SlabRow]]:
    """Per (subtask, slab) the highest attempt: a flush sent again replaces its slab."""
    best: dict[tuple[str, int], tuple[Path, SlabRow]] = {}
    for path, row in rows:
        key = (row.sub, row.slab)
        if key not in best or best[key][1].attempt < row.attempt:
            best[key] = (path, row)
    return [best[k] for k in sorted(best)]


def build(rows: list[tuple[Path, SlabRow]]) -> TaskIndex:
    """The index of ``rows`` (each with its file's path); blocking (decodes the BLOBs)."""
    kept = newest_attempts(rows)
    tables: list[pa.Table] = []
    out_files: list[SlabFile] = []
    for path, row in kept:
        idx = pa.ipc.open_stream(pa.py_buffer(row.idx)).read_all()
        if not idx.num_rows:
            continue
        first = int(idx.column("offset")[0].as_py())
        pos = len(out_files)
        out_files.append(SlabFile(path, row.data_at, first))
        tables.append(idx.append_column("slab", pa.array(np.full(idx.num_rows, pos, np.int32))))
    schema = wire.INDEX_SCHEMA.append(pa.field("slab", pa.int32()))
    index = pa.concat_tables(tables) if tables else schema.empty_table()
    # By chunk, then slab and offset: a chunk's batches are one run of rows, found by a
    # binary search (a read of 1,000 shards is 1,000 searches, not 1,000 scans).
    index = index.sort_by([("chunk_start", "ascending"), ("chunk_end", "ascending"),
                           ("slab", "ascending"), ("offset", "ascending")]).combine_chunks()
    return TaskIndex(out_files, index, len(kept), sum(r.rows for _, r in kept),
                     index["chunk_start"].to_numpy(), index["chunk_end"].to_numpy())


@dataclass
class ShardRead:
    """What to send: bytes and (file, offset, length) ranges; files to close after."""

    parts: list[bytes | tuple[IO[bytes], int, int]]
    length: int
    rows: int
    files: list[IO[bytes]]

    def close(self) -> None:
        for f in self.files:
            f.close()


Wanted = tuple[int, int, bytes | None, bytes | None]  # a shard: chunk start, end, key range


def select(ti: TaskIndex, start: int, end: int, key_from: bytes | None,
           key_to: bytes | None) -> tuple[np.ndarray, np.ndarray]:
    """Positions in the task's index of the shard's batches (in slab and offset order),
    and which of them are whole (every key inside the range)."""
    picked, _, whole = select_many(ti, [(start, end, key_from, key_to)])
    return picked, whole


def select_many(ti: TaskIndex, shards: list[Wanted],
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`select` of every shard in one vectorised pass over the index: the picked
    positions (by shard, then in index order), the shard each belongs to, and whether
    each is whole. A batch is in a shard whose chunk it is in (start and end) and whose
    key range its keys ``[key_lo, key_hi]`` meet; unknown keys (null) meet no bound."""
    import pyarrow.compute as pc  # here: the daemon pays for it once slabs are read

    n = len(shards)
    starts = np.array([sh[0] for sh in shards], np.int64)
    ends = np.array([sh[1] for sh in shards], np.int64)
    lo = np.searchsorted(ti.chunk_start, starts, "left")
    counts = np.searchsorted(ti.chunk_start, starts, "right") - lo
    owner = np.repeat(np.arange(n), counts)
    pos = (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
           + np.repeat(lo, counts)).astype(np.int64)
    mask = ti.chunk_end[pos] == ends[owner]
    whole = np.ones(len(pos), bool)
    # (bound, the key that must meet it for the batch to be in, for it to be whole)
    for at, meets, inside, compare in ((2, "key_hi", "key_lo", pc.greater_equal),
                                       (3, "key_lo", "key_hi", pc.less)):
        bounds = [sh[at] for sh in shards]
        if all(b is None for b in bounds) or not len(pos):
            continue
        edge = pa.array(bounds, pa.binary()).take(pa.array(owner))
        free = np.asarray(pc.is_null(edge), dtype=bool)
        for column, out in ((meets, mask), (inside, whole)):
            keys = ti.index[column].take(pa.array(pos))
            out &= np.asarray(pc.fill_null(compare(keys, edge), False), dtype=bool) | free
    return pos[mask], owner[mask], whole[mask]


def _pread(f: IO[bytes], offset: int, length: int) -> bytes:
    data = os.pread(f.fileno(), length, offset)
    if len(data) != length:
        raise OSError(5, f"slab file {f.name} is shorter than its index says")
    return data


def _schema(ti: TaskIndex, pos: int, f: IO[bytes]) -> tuple[bytes, pa.Schema]:
    held = ti._schemas.get(pos)
    if held is None:
        sf = ti.files[pos]
        raw = _pread(f, sf.data_at, sf.schema_len)
        held = ti._schemas[pos] = (raw, pa.ipc.read_schema(pa.py_buffer(raw)))
    return held


def read(ti: TaskIndex, start: int, end: int, key_from: bytes | None,
         key_to: bytes | None, opened: dict[int, IO[bytes]] | None = None,
         trim: bool = True) -> ShardRead:
    """The shard's stream as parts; blocking (opens files, trims edge batches). With
    ``opened`` the files are shared with other reads (the caller closes them). Without
    ``trim`` the edge batches go whole too (sendfile; the reader drops the rows outside
    the range by their ``__key``): a day chunk cut into a few shards is mostly edges, and
    decoding, filtering and encoding each in the daemon cost more than the bytes saved."""
    picked, whole = select(ti, start, end, key_from, key_to)
    if not trim:
        whole = np.ones(len(picked), bool)
    shared = opened is not None
    opened = {} if opened is None else opened
    t = ti.index
    slab_of = t["slab"].to_numpy()[picked] if len(picked) else np.zeros(0, np.int32)
    offsets = t["offset"].to_numpy()[picked] if len(picked) else np.zeros(0, np.int64)
    lengths = t["length"].to_numpy()[picked] if len(picked) else np.zeros(0, np.int64)
    rows = t["rows"].to_numpy()[picked] if len(picked) else np.zeros(0, np.int64)
    crcs = t["crc32c"].to_numpy()[picked] if len(picked) else np.zeros(0, np.uint32)
    out = ShardRead([], 0, 0, [])
    try:
        out_schema: tuple[bytes, pa.Schema] | None = None
        # Runs: consecutive picked batches of one slab, contiguous and whole.
        run_start = 0
        n = len(picked)
        i = 0
        while i < n:
            pos = int(slab_of[i])
            f = opened.get(pos)
            if f is None:
                f = opened[pos] = open(ti.files[pos].path, "rb")
                if not shared:
                    out.files.append(f)
            raw_schema, schema = _schema(ti, pos, f)
            if out_schema is None:
                out_schema = (raw_schema, schema)
                out.parts.append(raw_schema)
                out.length += len(raw_schema)
            same_schema = raw_schema == out_schema[0]
            data_at = ti.files[pos].data_at
            if whole[i] and same_schema:
                run_start = i
                while (i + 1 < n and whole[i + 1] and slab_of[i + 1] == pos
                       and offsets[i + 1] == offsets[i] + lengths[i]):
                    i += 1
                off = int(offsets[run_start])
                length = int(offsets[i] + lengths[i]) - off
                out.parts.append((f, data_at + off, length))
                out.length += length
                out.rows += int(rows[run_start: i + 1].sum())
                i += 1
                continue
            message = _pread(f, data_at + int(offsets[i]), int(lengths[i]))
            if crc32c(message) != int(crcs[i]):
                raise CorruptData(f"{ti.files[pos].path}: a batch at {int(offsets[i])} fails "
                                  "its CRC32C (the disk changed it since it was written)")
            batch = pa.ipc.read_record_batch(pa.py_buffer(message), schema)
            if not whole[i]:
                import pyarrow.compute as pc

                key = batch.column(KEY_COLUMN)
                keep = pa.array(np.ones(batch.num_rows, bool))
                if key_from is not None:
                    keep = pc.and_(keep, pc.greater_equal(key, pa.scalar(key_from, pa.binary())))
                if key_to is not None:
                    keep = pc.and_(keep, pc.less(key, pa.scalar(key_to, pa.binary())))
                batch = batch.filter(keep)
            if not same_schema:
                try:
                    batch = pa.Table.from_batches([batch]).cast(out_schema[1]).to_batches()[0] \
                        if batch.num_rows else pa.RecordBatch.from_pylist([], out_schema[1])
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                    raise Conflict(f"the slabs of this task have schemas that do not convert "
                                   f"to one another: {exc}") from exc
            if batch.num_rows:
                data = batch.serialize().to_pybytes()
                out.parts.append(data)
                out.length += len(data)
                out.rows += batch.num_rows
            i += 1
        if out.parts:
            out.parts.append(wire.EOS)
            out.length += len(wire.EOS)
        return out
    except BaseException:
        out.close()
        raise


def read_many(ti: TaskIndex, shards: list[Wanted],
              opened: dict[int, IO[bytes]], trim: bool = True) -> list[ShardRead]:
    """:func:`read` of each shard, the files opened once (in ``opened``). Untrimmed (what
    phase 2 asks) every shard is planned at once (:func:`_whole_reads`)."""
    if not trim:
        return _whole_reads(ti, shards, opened)
    return [read(ti, *shard, opened=opened, trim=trim) for shard in shards]


def _whole_reads(ti: TaskIndex, shards: list[Wanted],
                 opened: dict[int, IO[bytes]]) -> list[ShardRead]:
    """:func:`read` of each shard untrimmed, their batches chosen in one vectorised pass
    over the index (:func:`select_many`) and cut into runs of one slab's
    contiguous batches together: a :func:`select` and a loop a shard were 209 of the
    daemon's samples over comparison 7's runs (3,652 day chunks a task, a read each).
    The same parts as :func:`read`; a shard whose slabs' schemas differ is read by it."""
    n = len(shards)
    if not n:
        return []
    pos, owner, _ = select_many(ti, shards)
    t = ti.index
    slab_of = t["slab"].to_numpy()[pos]
    offsets = t["offset"].to_numpy()[pos]
    lengths = t["length"].to_numpy()[pos]
    rows = t["rows"].to_numpy()[pos]
    # Each picked slab's file and schema message, once.
    heads: dict[int, bytes] = {}
    for slab in np.unique(slab_of).tolist():
        f = opened.get(slab)
        if f is None:
            f = opened[slab] = open(ti.files[slab].path, "rb")
        heads[slab] = _schema(ti, slab, f)[0]
    # Runs: consecutive picked batches of one shard and one slab, contiguous in its file.
    m = len(pos)
    new_run = np.ones(m, bool)
    if m:
        new_run[1:] = ((owner[1:] != owner[:-1]) | (slab_of[1:] != slab_of[:-1])
                       | (offsets[1:] != offsets[:-1] + lengths[:-1]))
    run_at = np.flatnonzero(new_run)
    run_end = np.append(run_at[1:], m) if m else run_at  # (no batch: no run)
    run_rows = np.add.reduceat(rows, run_at) if m else np.zeros(0, np.int64)
    out = [ShardRead([], 0, 0, []) for _ in range(n)]
    mixed: set[int] = set()
    for a, b, r in zip(run_at.tolist(), run_end.tolist(), run_rows.tolist(), strict=True):
        shard, slab = int(owner[a]), int(slab_of[a])
        got = out[shard]
        if shard in mixed:
            continue
        if not got.parts:
            got.parts.append(heads[slab])
            got.length += len(heads[slab])
        elif heads[slab] != got.parts[0]:  # its batches must be cast: read it alone
            mixed.add(shard)
            continue
        off = int(offsets[a])
        length = int(offsets[b - 1] + lengths[b - 1]) - off
        got.parts.append((opened[slab], ti.files[slab].data_at + off, length))
        got.length += length
        got.rows += r
    for shard, got in enumerate(out):
        if shard in mixed:
            out[shard] = read(ti, *shards[shard], opened=opened, trim=False)
        elif got.parts:
            got.parts.append(wire.EOS)
            got.length += len(wire.EOS)
    return out

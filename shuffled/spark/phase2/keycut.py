"""A run of one chunk's shards, read from a daemon as one key range, cut into its shards
here (:mod:`.slabmerge` reads the runs): each record batch is a run of one slab, sorted by
its ``__key``, so a shard's rows of a batch are one slice, and how many rows of each batch
lie below each edge says where. The rows are counted for many runs at once, as integers
for fixed-width keys (hashed) and by one Arrow comparison an edge position for others
(range tuples)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shuffled.slab.keys import KEY_COLUMN, key_ints


def cut(table: pa.Table, edges: Sequence[bytes]) -> list[pa.Table | None]:
    """``table``'s rows (a range read with ``__key``, each record batch sorted by it: a run
    of one slab) in the ``len(edges) + 1`` key ranges ``edges`` cut, ``__key`` kept (the
    merge reads the hashes in it, :func:`_distinct`; None: no rows): one comparison a
    batch and edge, the pieces zero-copy slices."""
    return cut_many([table], [edges])[0]


def cut_many(tables: Sequence[pa.Table], edges_of: Sequence[Sequence[bytes]],
             ) -> list[list[pa.Table | None]]:
    """:func:`cut` of each table by its own edges, the keys of them all counted in one pass
    a group (:func:`_below` for fixed-width keys, :func:`_below_bytes` for others): cut a
    run at a time, numShards' day chunks (one run each) made the counting most of phase
    2's fetch thread."""
    batches_of = [t.to_batches() for t in tables]  # (it leaves out empty chunks)
    counts: list[list[list[int]]] = []
    for a, b in _groups(tables, edges_of):
        keys_of = [[rb.column(KEY_COLUMN) for rb in bs] for bs in batches_of[a:b]]
        got = _below(keys_of, edges_of[a:b])
        counts.extend(got if got is not None else _below_bytes(keys_of, edges_of[a:b]))
    out = []
    for batches, edges, below_of in zip(batches_of, edges_of, counts, strict=True):
        pieces: list[list[pa.RecordBatch]] = [[] for _ in range(len(edges) + 1)]
        for rb, below in zip(batches, below_of, strict=True):
            at = [0, *below, rb.num_rows]
            for i in range(len(edges) + 1):
                if at[i + 1] > at[i]:
                    pieces[i].append(rb.slice(at[i], at[i + 1] - at[i]))
        out.append([pa.Table.from_batches(p) if p else None for p in pieces])
    return out


#: Rows x edges :func:`_below` compares at once, at most (booleans: 16 MiB), unless one
#: table alone has more.
BELOW_CELLS = 1 << 24


def _groups(tables: Sequence[pa.Table], edges_of: Sequence[Sequence[bytes]],
            ) -> Iterator[tuple[int, int]]:
    """Consecutive ranges of ``tables`` whose rows times their most edges stay within
    :data:`BELOW_CELLS`: one run with many shards would otherwise widen every row's
    comparisons."""
    a, rows, widest = 0, 0, 0
    for n, (table, edges) in enumerate(zip(tables, edges_of, strict=True)):
        if n > a and (rows + table.num_rows) * max(widest, len(edges)) > BELOW_CELLS:
            yield a, n
            a, rows, widest = n, 0, 0
        rows += table.num_rows
        widest = max(widest, len(edges))
    if a < len(tables):
        yield a, len(tables)


def _below(keys_of: Sequence[Sequence[pa.Array]], edges_of: Sequence[Sequence[bytes]],
           ) -> list[list[list[int]]] | None:
    """Per table (its record batches' keys), per batch, how many of its rows have a key
    below each of the table's edges, for fixed-width keys (hashed: 4 or 8 bytes) computed
    for every batch of every table at once as integers; None when the keys or edges are
    not all one width."""
    widths = {len(e) for edges in edges_of for e in edges}
    if len(widths) != 1 or (width := widths.pop()) not in (4, 8):
        return None

    def below(keys: pa.ChunkedArray, owner: np.ndarray, widest: int) -> np.ndarray | None:
        got = key_ints(keys)
        if got is None or got[1] != width:
            return None
        limits = np.zeros((len(keys_of), widest), np.uint64)  # columns past a table's edges
        for n, edges in enumerate(edges_of):                 # are never read
            limits[n, :len(edges)] = [int.from_bytes(e, "big") for e in edges]
        return got[0][:, None] < limits[owner]
    return _counted(keys_of, edges_of, below)


def _below_bytes(keys_of: Sequence[Sequence[pa.Array]], edges_of: Sequence[Sequence[bytes]],
                 ) -> list[list[list[int]]]:
    """:func:`_below` for keys of any width (range tuples): for each edge position, one
    comparison of every row's key with its table's edge at that position. A comparison
    per batch and edge was ~a tenth of a range spec's phase-2 CPU (3,652 day chunks:
    ~15,000 batches a run, each one call)."""
    def below(keys: pa.ChunkedArray, owner: np.ndarray, widest: int) -> np.ndarray:
        out = np.empty((len(keys), widest), bool)
        rows_edge = pa.array(owner)
        for j in range(widest):
            edge = pa.array([e[j] if j < len(e) else None for e in edges_of], pa.binary())
            got = pc.fill_null(pc.less(keys, edge.take(rows_edge)), False)  # null: no edge j
            out[:, j] = np.asarray(got.combine_chunks() if isinstance(got, pa.ChunkedArray)
                                   else got, dtype=bool)
        return out
    counted = _counted(keys_of, edges_of, below)
    assert counted is not None  # (below never declines)
    return counted


def _counted(keys_of: Sequence[Sequence[pa.Array]], edges_of: Sequence[Sequence[bytes]],
             below: Callable[[pa.ChunkedArray, np.ndarray, int], np.ndarray | None],
             ) -> list[list[list[int]]] | None:
    """Per table, per batch, the rows below each edge: ``below`` tells for every row of
    every batch (their keys as one array, each row's table) whether its key is below each
    of its table's edges (rows x most edges), or declines (None)."""
    per_table = [len(keys) for keys in keys_of]
    batches = [k for keys in keys_of for k in keys]
    sizes = np.array([len(k) for k in batches], np.int64)
    widest = max((len(e) for e in edges_of), default=0)
    out = np.zeros((len(batches), widest), np.int64)
    nonempty = sizes > 0
    if widest and nonempty.any():
        owner = np.repeat(np.repeat(np.arange(len(keys_of)), per_table), sizes)
        flags = below(pa.chunked_array(batches, pa.binary()), owner, widest)
        if flags is None:
            return None
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out[nonempty] = np.add.reduceat(flags, starts[nonempty], axis=0)
    ends = np.cumsum(per_table)
    return [out[end - k: end, :len(edges)].tolist()
            for k, end, edges in zip(per_table, ends.tolist(), edges_of, strict=True)]

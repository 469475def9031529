"""An untrimmed read of many shards (what phase 2 asks) planned at once
(``shards.read_many(trim=False)``) answers each shard with the same parts as reading it
alone (``shards.read``): its schema message, the same file ranges, rows and length, the
end-of-stream marker; and for every key kind, chunk, range and empty shard. Both choose
batches by ``shards.select_many``, whose rule the rows check in test_slab_daemon.py
(every row in exactly the shard whose range holds its key)."""

from __future__ import annotations

from pathlib import Path
from typing import IO

import numpy as np
import pyarrow as pa
import pytest

from shuffled.slab.wire import KeyKind
from shuffled.storage.slabs import shards
from tests.helpers.slabs import HOUR, make_slab, rows_table


def _index(tmp_path: Path, kind: KeyKind, tables: list[pa.Table],
           batch_rows: int) -> shards.TaskIndex:
    """A task's index over slab files written as the daemon stores them (the slab's bytes
    as sent), built as shards.build does from the catalog's rows."""
    files, indexes = [], []
    for n, table in enumerate(tables):
        slab = make_slab(table, sub=f"s{n}", kind=kind, batch_rows=batch_rows)
        path = tmp_path / f"s{n}.slab"
        path.write_bytes(b"".join(bytes(p) for p in slab.parts()))
        idx = pa.ipc.open_stream(pa.py_buffer(slab.index)).read_all()
        data_at = len(slab.head) + len(slab.index) + len(slab.stats)
        files.append(shards.SlabFile(path, data_at, int(idx.column("offset")[0].as_py())))
        indexes.append(idx.append_column("slab", pa.array(np.full(idx.num_rows, n, np.int32))))
    index = pa.concat_tables(indexes).sort_by(
        [("chunk_start", "ascending"), ("chunk_end", "ascending"), ("slab", "ascending"),
         ("offset", "ascending")]).combine_chunks()
    return shards.TaskIndex(files, index, len(tables), sum(t.num_rows for t in tables),
                            index["chunk_start"].to_numpy(), index["chunk_end"].to_numpy())


def _seen(read: shards.ShardRead) -> list[object]:
    return [p if isinstance(p, bytes) else (Path(p[0].name).name, p[1], p[2])
            for p in read.parts] + [read.length, read.rows]


def _at_once_and_alone(ti: shards.TaskIndex, wanted: list[tuple[int, int, bytes | None,
                                                                  bytes | None]],
                       ) -> list[shards.ShardRead]:
    """The shards read at once, checked part by part against each read alone (its files
    opened apart); the reads at once."""
    opened: dict[int, IO[bytes]] = {}
    alone_opened: dict[int, IO[bytes]] = {}
    try:
        many = shards.read_many(ti, wanted, opened, trim=False)
        alone = [shards.read(ti, *w, opened=alone_opened, trim=False) for w in wanted]
        assert [_seen(r) for r in many] == [_seen(r) for r in alone]
        return many
    finally:
        for f in [*opened.values(), *alone_opened.values()]:
            f.close()


@pytest.mark.parametrize("kind", [KeyKind.HASH, KeyKind.TUPLE, KeyKind.NONE])
def test_shards_read_at_once_are_the_shards_read_alone(tmp_path: Path, kind: KeyKind) -> None:
    rng = np.random.default_rng(int(kind))
    tables = [rows_table(int(rng.integers(1, 3_000)), seed=s, chunks=4) for s in range(4)]
    ti = _index(tmp_path, kind, tables, batch_rows=64)
    keys = sorted({k for k in ti.index["key_lo"].to_pylist() + ti.index["key_hi"].to_pylist()
                   if k is not None})
    wanted: list[tuple[int, int, bytes | None, bytes | None]] = []
    for c in range(5):  # chunk 4 holds nothing
        wanted.append((c * HOUR, (c + 1) * HOUR, None, None))
        wanted.append((c * HOUR, (c + 2) * HOUR, None, None))  # another end: no batch
        for _ in range(12):
            lo, hi = sorted(rng.choice(len(keys), 2).tolist()) if keys else (0, 0)
            edges = [None if not keys or rng.random() < 0.2 else keys[lo],
                     None if not keys or rng.random() < 0.2 else keys[hi]]
            if keys and rng.random() < 0.3:  # a key between the batches' bounds
                edges[0] = keys[lo] + b"\x00"
            wanted.append((c * HOUR, (c + 1) * HOUR, edges[0], edges[1]))
    many = _at_once_and_alone(ti, wanted)
    assert sum(many[i].rows for i in range(0, len(wanted), 14)) == \
        sum(t.num_rows for t in tables)  # each chunk whole: every row once
    assert all(not r.files for r in many)  # the caller's files, closed by it
    # A request none of whose shards holds a batch (an empty chunk, another end).
    nothing = _at_once_and_alone(ti, [(4 * HOUR, 5 * HOUR, None, None),
                                      (0, 2 * HOUR, None, None)])
    assert [(r.parts, r.length, r.rows) for r in nothing] == [([], 0, 0)] * 2


def test_a_shard_over_slabs_of_two_schemas_is_read_alone(tmp_path: Path) -> None:
    """Slabs whose schemas differ (a metric typed int32 by one subtask) have their batches
    cast to the shard's first schema, as a read alone does; the others still go whole."""
    first = rows_table(500, seed=1, chunks=2)
    other = rows_table(700, seed=2, chunks=2)
    other = other.set_column(3, "count", other["count"].cast(pa.int32()))
    ti = _index(tmp_path, KeyKind.HASH, [first, other, rows_table(300, seed=3, chunks=2)],
                batch_rows=64)
    wanted = [(c * HOUR, (c + 1) * HOUR, None, None) for c in range(2)]
    many = _at_once_and_alone(ti, wanted)
    assert sum(r.rows for r in many) == 1_500
    assert any(isinstance(p, bytes) and len(p) > 100 for p in many[0].parts[1:-1])

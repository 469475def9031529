"""Phase 2's batched shard reads over two real daemons (docs/slab.md, "The plan": a shard is
its chunk's rows in a key range, read from every daemon holding the chunk's slabs): every
input row comes back once, in its chunk and range, with ONE request per daemon per batch;
a daemon holding other slabs than phase 1 stored there, or gone, makes exactly the shards
it holds short (the driver then fails the ingestion naming it), never merged short."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.slab import keys, sketch
from shuffled.slab.wire import KeyKind
from shuffled.spark.phase2.slabmerge import Shard, ShortRead, fetch_shards, shard_batches
from tests.helpers.ingestion import start_daemon
from tests.helpers.slabs import HOUR, make_slab, rows_table

SUP = "fetch"
CHUNKS = 4
EDGES = [None, *((k << 30).to_bytes(4, "big") for k in range(1, 4)), None]  # 4 hash ranges


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[list[Any], list[pa.Table]]]:
    """Two daemons; daemon 0 holds two subtasks' slabs, daemon 1 one; sealed."""
    started = [start_daemon(tmp_path / f"loc{i}") for i in range(2)]
    parts = [rows_table(1500, chunks=CHUNKS, seed=s) for s in range(3)]
    for i, (part, at) in enumerate(zip(parts, (0, 1, 0), strict=True)):
        with ShuffleClient(started[at].url) as c:
            c.put_slab(SUP, make_slab(part, sub=f"s{i}", kind=KeyKind.HASH))
    with ShuffleClient(started[0].url) as c:
        c.seal(SUP, ["s0", "s2"])
    with ShuffleClient(started[1].url) as c:
        c.seal(SUP, ["s1"])
    yield started, parts
    for d in started:
        d.stop()


class Counting:
    """The task's clients, counting each daemon's batched reads."""

    def __init__(self, retry: RetryPolicy | None = None) -> None:
        self.clients: dict[str, ShuffleClient] = {}
        self.calls: dict[str, int] = {}
        self.retry = retry

    def __call__(self, server: str) -> Any:
        counting = self

        class Client:
            def read_shards(self, sup: str, shards: Any, *args: Any, **how: Any) -> Any:
                counting.calls[server] = counting.calls.get(server, 0) + 1
                c = counting.clients.get(server)
                if c is None:
                    kw = {"retry": counting.retry} if counting.retry else {}
                    c = counting.clients[server] = ShuffleClient(server, **kw)
                return c.read_shards(sup, shards, *args, **how)

        return Client()

    def close(self) -> None:
        for c in self.clients.values():
            c.close()


def _shards(servers: tuple[str, ...]) -> list[Shard]:
    return [Shard(c * HOUR, (c + 1) * HOUR, i, lo, hi, servers, 100)
            for c in range(CHUNKS) for i, (lo, hi) in enumerate(zip(EDGES[:-1], EDGES[1:]))]


def make_slab_hashes(t: pa.Table) -> Any:
    """The key each row got in :func:`make_slab` (the hash of ``dim``)."""
    return np.asarray(sketch.row_hashes([t["dim"]]) >> np.uint64(32), dtype=np.uint32)


def _rows(t: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(zip(*(t[c].to_pylist() for c in ("__time", "dim", "user", "count"))))


def test_every_row_once_with_one_request_per_daemon(two: Any) -> None:
    daemons, parts = two
    servers = tuple(d.url for d in daemons)
    shards = _shards(servers)
    batch = next(shard_batches(shards))
    assert batch == shards  # 16 shards of 100 estimated rows: one batch
    client = Counting()
    try:
        got = fetch_shards(client, SUP, batch, {servers[0]: 2, servers[1]: 1})
    finally:
        client.close()
    assert client.calls == {servers[0]: 1, servers[1]: 1}
    everything = pa.concat_tables(parts)
    key = keys.hash_keys(make_slab_hashes(everything))
    for s, fetched in zip(batch, got, strict=True):
        assert not isinstance(fetched, ShortRead), fetched
        tables, rows, _ = fetched
        t = everything.filter(pc.and_(pc.equal(pc.divide(everything["__time"], HOUR),
                                               s.start // HOUR), _in_range(key, s)))
        assert rows == t.num_rows > 0  # each range holds rows of both daemons: a real split
        assert len(tables) == 2
        assert _rows(pa.concat_tables([x.select(t.column_names) for x in tables])) == _rows(t)


def test_a_run_within_the_batches_keeps_only_its_range(two: Any) -> None:
    """Shards bounded on both sides (numShards' bounds are all given): the daemon sends
    the edge batches whole (256 rows each, keys across the bounds) and the reader keeps
    each shard's range exactly, as one run of two shards and as one shard alone."""
    daemons, parts = two
    servers = tuple(d.url for d in daemons)
    inner = [s for s in _shards(servers) if s.key_from is not None and s.key_to is not None]
    alone = [inner[0]]  # chunk 0's second range, asked alone
    client = Counting()
    try:
        got = [*fetch_shards(client, SUP, inner, {servers[0]: 2, servers[1]: 1}),
               *fetch_shards(client, SUP, alone, {servers[0]: 2, servers[1]: 1})]
    finally:
        client.close()
    everything = pa.concat_tables(parts)
    key = keys.hash_keys(make_slab_hashes(everything))
    for s, fetched in zip([*inner, *alone], got, strict=True):
        assert not isinstance(fetched, ShortRead), fetched
        tables, rows, _ = fetched
        t = everything.filter(pc.and_(pc.equal(pc.divide(everything["__time"], HOUR),
                                               s.start // HOUR), _in_range(key, s)))
        assert rows == t.num_rows > 0
        assert _rows(pa.concat_tables([x.select(t.column_names) for x in tables])) == _rows(t)


def _in_range(key: pa.Array, s: Shard) -> pa.Array:
    keep = pc.is_valid(key)
    if s.key_from is not None:
        keep = pc.and_(keep, pc.greater_equal(key, pa.scalar(s.key_from, key.type)))
    if s.key_to is not None:
        keep = pc.and_(keep, pc.less(key, pa.scalar(s.key_to, key.type)))
    return keep


def test_a_daemon_missing_slabs_makes_only_its_shards_short(two: Any) -> None:
    daemons, _ = two
    a, b = (d.url for d in daemons)
    # Chunks 0-1 read from both daemons, chunks 2-3 from daemon 1 alone (as a plan whose
    # chunks have slabs on one daemon only); phase 1 "stored" 3 slabs on daemon 0: it
    # answers 2, so every shard it is asked for is short, naming it.
    shards = [s if s.start < 2 * HOUR else Shard(s.start, s.end, s.partition, s.key_from,
                                                    s.key_to, (b,), s.estimate)
              for s in _shards((a, b))]
    client = Counting()
    try:
        got = fetch_shards(client, SUP, shards, {a: 3, b: 1})
    finally:
        client.close()
    for s, fetched in zip(shards, got, strict=True):
        if a in s.servers:
            assert isinstance(fetched, ShortRead) and fetched.server == a
            assert "holds 2 slabs" in fetched.why and "stored 3" in fetched.why
        else:
            assert not isinstance(fetched, ShortRead)


def test_a_gone_daemon_makes_its_shards_short_within_the_retry_budget(two: Any) -> None:
    daemons, _ = two
    a, b = (d.url for d in daemons)
    daemons[1].stop()
    client = Counting(RetryPolicy(attempts=2, backoff=0.05, max_backoff=0.1, deadline=2.0))
    shards = _shards((a, b))
    try:
        got = fetch_shards(client, SUP, shards, {a: 2, b: 1})
    finally:
        client.close()
    assert all(isinstance(f, ShortRead) and f.server == b for f in got)


@pytest.mark.parametrize("width", [4, 8, 0], ids=["hash", "partition-hash", "tuple"])
def test_cut_puts_each_row_in_the_range_of_its_key(width: int) -> None:
    """keycut.cut (a run of a chunk's shards read as one range, cut here): every row in
    exactly the piece whose [edge, next edge) holds its key, batches sorted by key each,
    for fixed-width keys (counted as integers) and range tuples (compared as bytes)."""
    import numpy as np

    from shuffled.slab.keys import KEY_COLUMN
    from shuffled.spark.phase2.keycut import cut

    rng = np.random.default_rng(width)
    batches = []
    for n in [0, 5, 300, 1, 77]:
        ints = np.sort(rng.integers(0, 1 << 16, n)).astype(np.uint64) << np.uint64(
            8 * max(width, 4) - 16)
        keys = ([int(v).to_bytes(width, "big") for v in ints] if width
                else [b"\x01" + bytes(str(int(v)).zfill(12), "ascii") for v in ints])
        batches.append(pa.record_batch({"v": pa.array(rng.integers(0, 9, n)),
                                        KEY_COLUMN: pa.array(keys, pa.binary())}))
    table = pa.Table.from_batches(batches)
    every = sorted(table.column(KEY_COLUMN).to_pylist())
    edges = sorted({every[i] for i in (10, 100, 200)})
    pieces = cut(table, edges)
    bounds = [None, *edges, None]
    assert sum(p.num_rows for p in pieces if p is not None) == table.num_rows
    for piece, lo, hi in zip(pieces, bounds[:-1], bounds[1:]):
        if piece is None:
            continue
        keys = piece.column(KEY_COLUMN).to_pylist()  # kept: the merge reads its hashes
        assert all((lo is None or k >= lo) and (hi is None or k < hi) for k in keys)
    # the same rows as filtering by key, piece by piece
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        want = [r["v"] for b in batches for r in b.to_pylist()
                if (lo is None or r[KEY_COLUMN] >= lo) and (hi is None or r[KEY_COLUMN] < hi)]
        got = pieces[i].column("v").to_pylist() if pieces[i] is not None else []
        assert got == want


@pytest.mark.parametrize("cells", [None, 50], ids=["one-pass", "in-groups"])
@pytest.mark.parametrize("width", [4, 8, 0, -1],
                         ids=["hash", "partition-hash", "tuple", "tuple-of-any-length"])
def test_cut_many_cuts_each_table_by_its_own_edges(width: int, cells: int | None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """keycut.cut_many (every run of one read cut at once, the keys counted in one pass,
    or in groups within BELOW_CELLS): each table's rows in exactly the piece
    of ITS edges that holds the key, whatever the other tables' edges, batch counts and
    sizes (empty tables too)."""
    import numpy as np

    from shuffled.slab.keys import KEY_COLUMN
    from shuffled.spark.phase2 import keycut
    from shuffled.spark.phase2.keycut import cut_many

    if cells is not None:
        monkeypatch.setattr(keycut, "BELOW_CELLS", cells)

    rng = np.random.default_rng(40 + width)

    def key(v: int) -> bytes:
        if width < 0:  # as range tuples are: of any length, ordered as bytes
            return b"\x01" + str(v).encode() + b"\x00\x00"
        return int(v).to_bytes(width, "big") if width else b"\x01" + str(v).zfill(12).encode()

    tables, edges_of = [], []
    for sizes, nedges in [([0, 5, 300], 3), ([], 1), ([40], 1), ([1, 77, 0, 9], 5), ([0], 2)]:
        batches = []
        for n in sizes:
            ints = sorted(rng.integers(0, 1 << 16, n).tolist(), key=key)  # a batch: by key
            batches.append(pa.record_batch({"v": pa.array(rng.integers(0, 9, n)),
                                            KEY_COLUMN: pa.array([key(v) for v in ints],
                                                                 pa.binary())}))
        schema = pa.schema([("v", pa.int64()), (KEY_COLUMN, pa.binary())])
        tables.append(pa.Table.from_batches(batches, schema))
        edges_of.append(sorted({key(int(v)) for v in rng.integers(0, 1 << 16, nedges)}))
    got = cut_many(tables, edges_of)
    for table, edges, pieces in zip(tables, edges_of, got, strict=True):
        assert len(pieces) == len(edges) + 1
        bounds = [None, *edges, None]
        rows = [r for b in table.to_batches() for r in b.to_pylist()]
        for piece, lo, hi in zip(pieces, bounds[:-1], bounds[1:], strict=True):
            want = [r["v"] for r in rows if (lo is None or r[KEY_COLUMN] >= lo)
                    and (hi is None or r[KEY_COLUMN] < hi)]
            assert (piece.column("v").to_pylist() if piece is not None else []) == want


def test_the_counting_groups_stay_within_their_cells() -> None:
    """keycut._groups: consecutive tables whose rows times their most edges stay within
    BELOW_CELLS, a table over it alone; every table in exactly one group, in order."""
    from shuffled.spark.phase2.keycut import BELOW_CELLS, _groups

    rows = [10, 0, BELOW_CELLS // 4, 3, BELOW_CELLS * 2, 7, 7]
    edges = [[b"k"] * e for e in (1, 9, 4, 2, 1, 300, 1)]
    tables = [pa.table({"v": pa.nulls(n)}) for n in rows]  # type null: no buffers
    groups = list(_groups(tables, edges))
    assert [i for a, b in groups for i in range(a, b)] == list(range(len(tables)))
    for a, b in groups:
        cells = sum(rows[a:b]) * max(len(e) for e in edges[a:b])
        assert cells <= BELOW_CELLS or b == a + 1

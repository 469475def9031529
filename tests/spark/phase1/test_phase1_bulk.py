"""Phase 1's fast path against the straightforward one it replaced, and its bulk upload.

- the sort-based group-by (:mod:`shuffled.spark.rows.grouping`) equals Acero's hash group-by,
  nulls, NaN, float32 and dictionary-encoded keys included;
- the vectorised split + encoding (:mod:`shuffled.spark.phase1.partials`) gives the partials that
  ``split_by`` + ``to_ipc`` (sort, take, ``new_stream`` per partial) gave, each a stream
  that ``new_stream`` would write for it, with the layout's one schema message;
- Spark's hash of dictionary-encoded strings equals that of the plain strings;
- a phase-1 task sends everything in one bulk upload per flush, reports what the daemon
  stored, and an injected failure still leaves stored partials behind.
"""

from __future__ import annotations

import dataclasses

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import shuffled.spark.phase1.partials as partials_mod
import shuffled.spark.rows.rollup as rollup_mod
from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from shuffled.spark.phase1 import tasks
from shuffled.spark.rows import grouping
from shuffled.spark.phase1.partials import Encoder, split_partials
from shuffled.spark.phase1.tasks import Phase1Config, run_task
from shuffled.spark.rows.rollup import (BAD, BUCKET, CHUNK, TIME, Layout, cast_to_layout, group_acero, combine,
                                   from_ipc, rollup_input, split_by, to_ipc)
from shuffled.spark.phase1.spark_compat.murmur3 import spark_hash
from tests.helpers.hooks import FailAttempts
from tests.helpers.ingestion import start_daemon

DAY, HOUR = 86_400_000, 3_600_000
LAYOUT = Layout((("a", "string"), ("b", "string"), ("c", "long")),
                (("cnt", "count", "sum", "long", None), ("s", "sum", "sum", "long", "__m0"),
                 ("mx", "max", "max", "double", "__m1"), ("mn", "min", "min", "double", "__m1"),
                 ("f", "sum", "sum", "float", "__m2"), ("fmin", "min", "min", "float", "__m2")))


def _strings(rng: np.random.Generator, n: int, k: int, nulls: float) -> pa.Array:
    values = pa.array([f"v{i}\u00e9" * (i % 3 + 1) for i in rng.integers(0, k, n)])
    return pc.if_else(pa.array(rng.random(n) < nulls), pa.nulls(n, pa.string()), values)


def raw_table(n: int, seed: int = 5, chunks: int = 5) -> pa.Table:
    """Random phase-1 input: chunk, bucket, time, two string dims (one dictionary-encoded,
    with nulls), a long dim with nulls, long/double (NaN, nulls)/float32 metric inputs."""
    rng = np.random.default_rng(seed)
    chunk = rng.integers(0, chunks, n) * DAY
    m1 = pa.array(rng.standard_normal(n) * 1e6, mask=rng.random(n) < 0.2)
    return pa.table({
        CHUNK: chunk, BUCKET: pa.array(rng.integers(0, 3, n), pa.int32()),
        TIME: chunk + rng.integers(0, 3, n) * HOUR,
        "a": _strings(rng, n, 4, 0.1), "b": _strings(rng, n, 30, 0.05).dictionary_encode(),
        "c": pa.array(rng.integers(-3, 3, n), mask=rng.random(n) < 0.1),
        "__m0": pa.array(rng.integers(0, 100, n), mask=rng.random(n) < 0.2),
        "__m1": pc.if_else(pa.array(rng.random(n) < 0.05), pa.scalar(float("nan")), m1),
        "__m2": pa.array(rng.standard_normal(n).astype(np.float32), mask=rng.random(n) < 0.5),
    })


def _acero_rollup(table: pa.Table, extra: list[str]) -> pa.Table:
    aggs: list[tuple[str | list[str], str]] = [
        ([], "count_all") if a == "count" else (src or "", a) for _, a, _, _, src in LAYOUT.metrics]
    grouped = group_acero(table.unify_dictionaries(), extra + LAYOUT.keys, aggs,
                           [m[0] for m in LAYOUT.metrics])
    return cast_to_layout(grouped, LAYOUT, extra)


def _canonical(table: pa.Table, keys: list[str]) -> list[tuple[Any, ...]]:
    plain = table.cast(pa.schema([pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type)
                                  else f for f in table.schema]))
    rows = plain.sort_by([(k, "ascending") for k in keys]).to_pylist()
    # NaN != NaN: compare it as a marker.
    return [tuple("NaN" if isinstance(v, float) and v != v else v for v in r.values()) for r in rows]


@pytest.fixture
def sorted_grouping(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table goes through :mod:`.grouping`, however small."""
    monkeypatch.setattr(rollup_mod, "SMALL", 0)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 20_000])
@pytest.mark.parametrize("extra", [[CHUNK], [CHUNK, BUCKET]])
def test_sorted_group_by_equals_acero(sorted_grouping: None, n: int, extra: list[str]) -> None:
    table = raw_table(n, seed=n)
    keys = extra + LAYOUT.keys
    ours = rollup_input(table, LAYOUT, extra)
    assert ours.schema == _acero_rollup(table, extra).schema
    assert _canonical(ours, keys) == _canonical(_acero_rollup(table, extra), keys)
    assert ours.column(CHUNK).to_pylist() == sorted(ours.column(CHUNK).to_pylist())
    # Rolled up in two halves (dictionaries kept), then combined: the same rows.
    halves = [rollup_input(table.slice(0, n // 2), LAYOUT, extra, dictionaries=True),
              rollup_input(table.slice(n // 2), LAYOUT, extra, dictionaries=True)]
    assert pa.types.is_dictionary(halves[0].schema.field("a").type)
    merged = combine(pa.concat_tables(halves), LAYOUT, extra)
    assert [r[:len(keys)] for r in _canonical(merged, keys)] == [
        r[:len(keys)] for r in _canonical(ours, keys)]
    assert merged.column("cnt").to_pylist() == [] or sum(merged.column("cnt").to_pylist()) == n


def test_both_group_bys_give_one_schema_that_concatenates(monkeypatch: pytest.MonkeyPatch) -> None:
    # A task keeps rolled-up tables from both group-bys (its last slice is often small)
    # and concatenates them: with dictionaries, strings are dictionary<int32> either way.
    monkeypatch.setattr(rollup_mod, "SMALL", 1000)
    table = raw_table(3000, seed=11).drop_columns([BUCKET])
    big = rollup_input(table.slice(0, 2500), LAYOUT, [CHUNK], dictionaries=True)  # grouping
    small = rollup_input(table.slice(2500), LAYOUT, [CHUNK], dictionaries=True)  # Acero
    assert big.schema == small.schema
    assert big.schema.field("a").type == pa.dictionary(pa.int32(), pa.string())
    for merged in (combine(pa.concat_tables([big, small]), LAYOUT, [CHUNK], dictionaries=True),
                   combine(pa.concat_tables([small, small]), LAYOUT, [CHUNK], dictionaries=True)):
        assert merged.schema == big.schema
    whole = rollup_input(table, LAYOUT, [CHUNK])
    merged = combine(pa.concat_tables([big, small]), LAYOUT, [CHUNK])
    keys = [CHUNK] + LAYOUT.keys
    assert merged.schema == whole.schema == cast_to_layout(whole, LAYOUT, [CHUNK]).schema
    assert [r[:len(keys) + 2] for r in _canonical(merged, keys)] == [
        r[:len(keys) + 2] for r in _canonical(whole, keys)]  # keys, count, long sum


def test_grouping_codes_wide_ranges_and_overflowing_keys() -> None:
    rng = np.random.default_rng(1)
    n = 5000
    wide = pa.array(rng.choice([-(2 ** 62), 0, 7, 2 ** 62], n), pa.int64())  # ranked, not offset
    cols = [wide] + [pa.array(rng.integers(0, 3000, n), pa.int64()) for _ in range(6)]  # > 2^62
    g = grouping.group(cols, n)
    want = {tuple(c[i].as_py() for c in cols) for i in range(n)}
    assert g.count == len(want)
    firsts = {tuple(c[i].as_py() for c in cols) for i in g.first.tolist()}
    assert firsts == want
    assert sorted(g.gid().tolist()) == sorted(np.repeat(np.arange(g.count), g.sizes()).tolist())
    # A dictionary whose values repeat (and hold a null) still groups by value.
    d = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 3, None]), pa.array(["x", "x", None, "y"]))
    g = grouping.group(grouping.key_columns(pa.table({"d": d}), ["d"]) or [], 5)
    assert g.count == 3


def _old_partials(table: pa.Table) -> list[tuple[int, int, int, bytes]]:
    out = []
    for (chunk, bucket), part in split_by(table, [CHUNK, BUCKET]):
        part = part.cast(LAYOUT.schema())
        out.append((chunk, bucket, part.num_rows, to_ipc(part)))
    return out


def _same_partials(got: list[tuple[int, int, int, bytes]],
                   want: list[tuple[int, int, int, bytes]]) -> None:
    """The same partials in the same order: the same schema message, the same rows. (Not
    always the same bytes: the IPC writer may send a small buffer whole where a slice of
    it would do, and bytes under null slots are undefined.)"""
    head = Encoder(LAYOUT.schema()).head
    assert [g[:3] for g in got] == [w[:3] for w in want]
    for (_, _, rows, a), (_, _, _, b) in zip(got, want):
        assert a.startswith(head) and b.startswith(head)
        part = from_ipc(a)
        assert part.schema == LAYOUT.schema() and part.num_rows == rows
        assert _canonical(part, LAYOUT.keys) == _canonical(from_ipc(b), LAYOUT.keys)


@pytest.mark.parametrize("nulls", [True, False])
@pytest.mark.parametrize("slab", [3, 1 << 16])
@pytest.mark.parametrize("n", [1, 500, 5000])
def test_vectorised_split_equals_split_by(
        monkeypatch: pytest.MonkeyPatch, slab: int, n: int, nulls: bool) -> None:
    monkeypatch.setattr(partials_mod, "SLAB", slab)
    raw = raw_table(n, seed=n + 1, chunks=40).drop_columns([BUCKET])
    if not nulls:
        raw = raw.drop_null()
    rolled = rollup_input(raw, LAYOUT, [CHUNK], dictionaries=True)
    buckets = np.random.default_rng(n).integers(0, 4, rolled.num_rows).astype(np.int32)
    with_bucket = rolled.append_column(BUCKET, pa.array(buckets))
    want = _old_partials(with_bucket)
    _same_partials(list(split_partials(rolled, LAYOUT, buckets)), want)  # native
    _same_partials(list(split_partials(with_bucket, LAYOUT, None, Encoder(LAYOUT.schema()))),
                   want)  # JVM: __bucket is a column
    shuffled = with_bucket.take(pa.array(np.random.default_rng(2).permutation(rolled.num_rows)))
    got = {(c, b): from_ipc(body) for c, b, _, body in split_partials(shuffled, LAYOUT)}
    assert sorted(got) == [(c, b) for c, b, _, _ in want]  # unsorted input: same partials
    for c, b, rows, body in want:
        assert got[(c, b)].num_rows == rows
        assert _canonical(got[(c, b)], LAYOUT.keys) == _canonical(from_ipc(body), LAYOUT.keys)


def test_encoder_writes_what_new_stream_writes() -> None:
    table = rollup_input(raw_table(300).drop_columns([BUCKET]), LAYOUT, [CHUNK]).drop_columns([CHUNK])
    enc = Encoder(LAYOUT.schema())
    batch = table.combine_chunks().to_batches()[0]
    rows = table.num_rows
    for lo, n in [(0, rows), (1, 7), (rows - 1, 1), (17, 100)]:
        assert enc.encode(batch.slice(lo, n)) == to_ipc(table.slice(lo, n))


def test_spark_hash_of_dictionaries_equals_plain_strings() -> None:
    rng = np.random.default_rng(4)
    words = ["", "a", "ab", "abc", "abcd", "\u20ac\U0001F600", "caf\u00e9 au lait", "x" * 37]
    plain = pa.array([None if rng.random() < 0.1 else words[i] for i in rng.integers(0, 8, 3000)])
    t = pa.array(rng.integers(-(2 ** 63), 2 ** 63 - 1, 3000), pa.int64())
    want = spark_hash([t, plain, plain.cast(pa.large_string())])
    assert spark_hash([t, plain.dictionary_encode(), plain]).tolist() == want.tolist()
    odd = pa.DictionaryArray.from_arrays(  # unused, repeated and null dictionary entries
        pa.array([0, 1, None, 2, 4, 1]), pa.array(["q", "zz", None, "unused", "q"]))
    assert spark_hash([odd]).tolist() == spark_hash([odd.cast(pa.string())]).tolist()
    # Long values among short ones (entries have different block counts; the blocks of
    # long ones are stored for them alone).
    mixed = pa.array([None if i % 11 == 0 else "\u00e9" * int(i % 7 == 0) * 300 + words[i % 8]
                      for i in range(2000)])
    assert spark_hash([t.slice(0, 2000), mixed.dictionary_encode()]).tolist() == \
        spark_hash([t.slice(0, 2000), mixed]).tolist()
    sliced = plain.dictionary_encode().slice(100, 50)
    assert spark_hash([sliced]).tolist() == spark_hash([plain.slice(100, 50)]).tolist()


# --- the task: one bulk upload per flush, through a real daemon -------------------------


def _batches(n: int, parts: int) -> Iterator[pa.RecordBatch]:
    table = raw_table(n, seed=9, chunks=6).append_column(BAD, pa.nulls(n, pa.string()))
    for t in table.to_batches(max_chunksize=-(-n // parts)):
        yield t


def test_task_uploads_each_flush_in_one_bulk_request_and_reports_it(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "loc")
    try:
        cfg = Phase1Config("bulk-task", (daemon.url,), LAYOUT, "day", max_rows=1500, max_saved_bad=5,
                          max_bytes=64 << 10)
        lines = run_task(cfg, _batches(4000, 8))
        items = [json.loads(x) for x in lines]
        uploads, stats = items[:-1], items[-1]
        subs = {u["sub"] for u in uploads}
        assert len(subs) > 1, "max_rows should have forced several flushes"
        # On the wire (bulk format 2): each flush's schema message once, then the bodies;
        # each partial stands for the stream schema + body + end marker ("bytes").
        head = len(Encoder(LAYOUT.schema()).head)
        assert stats["rowsIn"] == 4000 and stats["bytesShuffled"] == sum(
            u["bytes"] - head - 8 for u in uploads) + head * len(subs)
        want = rollup_input(raw_table(4000, seed=9, chunks=6), LAYOUT, [CHUNK, BUCKET])
        total = 0
        with ShuffleClient(daemon.url) as c:
            for u in uploads:
                key = PartialKey("bulk-task", u["sub"], Interval(u["start"], u["end"]), u["partition"])
                body = c.get_partial(key)
                assert len(body) == u["bytes"] and u["crc32c"]
                part = from_ipc(body)
                assert part.schema == LAYOUT.schema() and part.num_rows == u["rows"]
                assert u["end"] - u["start"] == DAY
                total += int(pc.sum(part.column("cnt")).as_py())
            c.delete_task("bulk-task")
        assert total == int(pc.sum(want.column("cnt")).as_py()) == 4000
    finally:
        daemon.stop()


def test_the_combiner_ships_each_key_once_when_the_budget_allows(tmp_path: Path) -> None:
    """Raw rows are rolled up 1,500 at a time, but rolled-up rows are combined across those
    buffers within maxBytesInMemory: on input that folds (the same 500 rows eight times) the
    task ships exactly one full rollup of its input, and so it does on input whose keys
    fold only across buffers (combined as the flush goes out)."""
    daemon = start_daemon(tmp_path / "loc")
    try:
        cfg = Phase1Config("combined", (daemon.url,), LAYOUT, "day", max_rows=1500,
                           max_saved_bad=5)
        some = raw_table(500, seed=9, chunks=6)
        folds = pa.concat_tables([some] * 8)
        lines = run_task(cfg, iter(folds.append_column(BAD, pa.nulls(4000, pa.string()))
                                   .to_batches(max_chunksize=500)))
        stats = json.loads(lines[-1])
        want = rollup_input(folds, LAYOUT, [CHUNK, BUCKET])
        assert {json.loads(x)["sub"] for x in lines[:-1]} == {"p0-a0-f0"}  # one flush
        assert stats["rowsShipped"] == want.num_rows <= 500

        cfg = dataclasses.replace(cfg, supervisor_task_id="unfolded")
        lines = run_task(cfg, _batches(4000, 8))
        stats = json.loads(lines[-1])
        whole = rollup_input(raw_table(4000, seed=9, chunks=6), LAYOUT, [CHUNK, BUCKET])
        assert {json.loads(x)["sub"] for x in lines[:-1]} == {"p0-a0-f0"}
        assert stats["rowsShipped"] == whole.num_rows < 4000
        with ShuffleClient(daemon.url) as c:
            c.delete_task("combined")
            c.delete_task("unfolded")
    finally:
        daemon.stop()


def test_injected_failure_fires_after_partials_were_stored(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path / "loc")
    try:
        fault = FailAttempts(partitions=[0], attempts=[0], after_uploads=2)
        cfg = Phase1Config("bulk-fail", (daemon.url,), LAYOUT, "day", max_rows=1500,
                           max_bytes=64 << 10,
                           max_saved_bad=5, hooks=fault)
        with pytest.raises(RuntimeError, match="injected phase-1 failure"):
            run_task(cfg, _batches(4000, 8))
        with ShuffleClient(daemon.url) as c:
            held = c.task("bulk-fail") or {}
            stored = sum(len(p["subTasks"]) for p in held.get("partitions", []))
            c.delete_task("bulk-fail")
        assert stored >= 2  # the failed attempt left partials behind: what retries must ignore
    finally:
        daemon.stop()


def test_a_task_reads_on_while_its_flush_is_uploaded(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The first upload (encoding its flush, then sending it) is held until the task has
    asked for more input: with uploads made inline (the task waiting for each answer) it
    would never be released."""
    entered, released = threading.Event(), threading.Event()
    encode = tasks.encode_flush

    def held(*args: Any) -> Any:
        entered.set()
        if not released.wait(timeout=20):
            raise AssertionError("the task did not read on while its flush was uploaded")
        return encode(*args)

    def watched(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if entered.is_set():
                released.set()  # asked for more input while an upload is under way
            yield batch

    monkeypatch.setattr(tasks, "encode_flush", held)  # the task's uploads
    daemon = start_daemon(tmp_path / "loc")
    try:
        cfg = Phase1Config("overlap", (daemon.url,), LAYOUT, "day", max_rows=1500, max_saved_bad=5,
                          max_bytes=64 << 10)
        items = [json.loads(x) for x in run_task(cfg, watched(_batches(4000, 8)))]
        subs = {u["sub"] for u in items[:-1]}
        assert released.is_set() and len(subs) > 1
        head = len(Encoder(LAYOUT.schema()).head)
        assert items[-1]["bytesShuffled"] == sum(
            u["bytes"] - head - 8 for u in items[:-1]) + head * len(subs)
        with ShuffleClient(daemon.url) as c:
            c.delete_task("overlap")
    finally:
        daemon.stop()


def test_a_column_of_many_distinct_values_is_hashed_in_slices_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys that never fold: a dictionary as large as its rows is hashed a slice of rows at
    a time, each with a dictionary of its own values; the hashes are the same."""
    from shuffled.spark.phase1.spark_compat import murmur3 as sparkhash

    rng = np.random.default_rng(3)
    values = pa.array([None if i % 97 == 0 else f"id-{v}" for i, v in
                       enumerate(rng.integers(0, 1 << 40, 5000))])
    t = pa.array(rng.integers(-(2 ** 62), 2 ** 62, 5000), pa.int64())
    whole = spark_hash([t, values.dictionary_encode(), values]).tolist()
    monkeypatch.setattr(sparkhash, "ROWS_AT_A_TIME", 700)  # slices, dictionaries > 700
    assert spark_hash([t, values.dictionary_encode(), values]).tolist() == whole

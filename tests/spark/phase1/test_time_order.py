"""A task reading several time-ordered files ships each time chunk once (phase1/native/timeorder.py).

Four files that each span the whole interval, read by one task whose combiner must flush
several times: read one after the other, every flush held a slice of every chunk read so
far; read side by side in time order, a flush takes only the chunks every file has moved
past, so each (chunk, partition) is one partial. Out-of-order input loses nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench import druid_data
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.spark.driver.context import layout_of
from shuffled.spark.phase1 import tasks
from shuffled.spark.phase1.native.reader import SplitSizing, plan_native
from shuffled.spark.phase1.native.timeorder import TimeOrdered
from shuffled.spark.rows.rollup import CHUNK
from shuffled.spark.spec.model import PartitionPlan
from shuffled.spark.spec.parse import parse_spec

ROWS = 1_000_000
DAYS = 120


def _run(data: Path, loc: Path) -> tuple[list[dict[str, object]], dict[str, object]]:
    spec = parse_spec(druid_data.spec(data))
    files = sorted(str(p) for p in data.glob("*.parquet"))
    native, splits = plan_native(spec, PartitionPlan("hashed", ("user",), num_shards=2), files,
                                 SplitSizing(max_bytes=1 << 40, parallelism=1))
    assert len(splits) == 1 and len({s.path for s in splits[0]}) == len(files)
    with EmbeddedDaemon([str(loc)], free_space_reserve=0) as url:
        # 256 MiB: four files at once; flushes once the held rows pass 32 MiB.
        cfg = tasks.Phase1Config("order", (url,), layout_of(spec), "day", 200_000, 5,
                                 max_bytes=256 << 20)
        lines = [json.loads(x) for x in tasks.run_native_task(cfg, native, iter(splits[0]))]
    return lines[:-1], lines[-1]


def test_time_ordered_files_ship_each_chunk_once_per_task(tmp_path: Path) -> None:
    druid_data.generate(tmp_path / "data", ROWS, days=DAYS)
    partials, stats = _run(tmp_path / "data", tmp_path / "loc")
    flushes = {p["sub"] for p in partials}
    assert len(flushes) >= 2, flushes  # the combiner did flush while reading
    keys = [(p["start"], p["partition"]) for p in partials]
    assert len(keys) == len(set(keys))  # one partial per (chunk, partition)
    assert len({k[0] for k in keys}) == DAYS
    assert sum(p["rows"] for p in partials) == stats["rowsShipped"]
    assert stats["rowsIn"] == ROWS


def test_rows_out_of_time_order_are_all_shipped(tmp_path: Path) -> None:
    data = tmp_path / "data"
    druid_data.generate(data, ROWS // 2, days=DAYS)
    for f in data.glob("*.parquet"):  # shuffle each file's rows: no order left
        table = pq.read_table(f)
        order = pc.sort_indices(pc.random(table.num_rows))  # type: ignore[attr-defined]
        pq.write_table(table.take(order), f)
    partials, stats = _run(data, tmp_path / "loc")
    assert stats["rowsIn"] == ROWS // 2
    assert sum(p["rows"] for p in partials) == stats["rowsShipped"]
    keys = [(p["sub"], p["start"], p["partition"]) for p in partials]
    assert len(keys) == len(set(keys))


def _tables(chunks: list[list[int]]) -> Iterator[pa.Table]:
    for c in chunks:
        yield pa.table({CHUNK: pa.array(c, pa.int64())})


@pytest.mark.parametrize("at_once", [1, 2])
def test_batches_come_earliest_chunk_first_and_the_watermark_follows(at_once: int) -> None:
    order = TimeOrdered([_tables([[1, 2], [5, 6]]), _tables([[3, 4], [7]]),
                         _tables([[0], []])], at_once)
    seen, marks = [], []
    for table in order:
        seen.append(table.column(CHUNK).to_pylist())
        marks.append(order.watermark)
    assert sorted(sum(seen, [])) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert marks[-1] is None  # every file read: every chunk is past
    if at_once == 2:  # the third file waits: nothing is past until it is opened
        assert seen[:2] == [[1, 2], [3, 4]] and marks[0] == -(1 << 63)

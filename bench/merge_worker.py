"""One side of comparison 8 in a fresh process: ``python -m bench.merge_worker SIDE INPUT
OUTPUT BUDGET``. Prints JSON: seconds, RSS growth (VmHWM from /proc, reset after the input
schema is read) and the output's rows and clicks total (so the sides are checked equal)."""

from __future__ import annotations

import json
import sys
import time

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from bench.merge_data import LAYOUT, SQL
from shuffled.spark.rows.memory import peak_rss, release_free_memory, reset_peak_rss, rss


def _batches(path: str) -> tuple[pa.Schema, object]:
    reader = ipc.open_file(path)
    return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))


def ours(path: str, out: str, budget: int) -> None:
    from shuffled.spark.phase2.spill import merge_bounded

    schema, batches = _batches(path)
    with pq.ParquetWriter(out, LAYOUT.schema(), compression="zstd") as writer:
        merge_bounded(batches, LAYOUT, budget, writer.write_table)


def duckdb_side(path: str, out: str, budget: int) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET memory_limit='{budget >> 20}MB'")
    con.execute("SET threads=1")  # one merge task is one thread of ours
    con.execute("SET preserve_insertion_order=false")
    schema, batches = _batches(path)
    src = pa.RecordBatchReader.from_batches(schema, batches)  # noqa: F841 (DuckDB scans it)
    con.execute(f"COPY ({SQL}) TO '{out}' (FORMAT parquet, COMPRESSION zstd)")


def main() -> None:
    side, path, out, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if side == "duckdb":
        import duckdb  # noqa: F401  (its import is not part of the merge)
    release_free_memory()
    reset_peak_rss()
    base = rss()
    started = time.monotonic()
    (ours if side == "shuffled" else duckdb_side)(path, out, budget)
    seconds = time.monotonic() - started
    growth = (peak_rss() - base) / (1 << 20)
    table = pq.read_table(out, columns=["clicks"])
    print(json.dumps({"seconds": seconds, "growth_mib": growth, "rows": table.num_rows,
                      "clicks": int(pa.compute.sum(table.column("clicks")).as_py())}))


if __name__ == "__main__":
    main()

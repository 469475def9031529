"""Phase 1's memory on input whose keys never fold (every row its own rolled-up row).

The combiner combines held tables across raw buffers so that foldable input ships each key
about once per task; on unfoldable input that combine only copies (about three times the
held rows at its peak). Once a full buffer's rollup keeps 80% of its rows the task stops
combining and ships each buffer's rollup as it is. Measured by Arrow's allocator peak in a
process of its own (deterministic, unlike RSS): 1M unfoldable rows under a 64 MiB budget
peaked at 154 MiB with the combine, 81 MiB without it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import unfold_data

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, sys
from pathlib import Path
import pyarrow as pa
from bench import unfold_data
from shuffled.spark.spec.parse import parse_spec
from shuffled.spark.spec.model import PartitionPlan
from shuffled.spark.phase1.native.reader import plan_native, SplitSizing
from shuffled.spark.driver.context import layout_of
from shuffled.spark.phase1 import tasks
from shuffled.server.embedded import EmbeddedDaemon

data, loc = Path(sys.argv[1]), sys.argv[2]
spec = parse_spec(unfold_data.spec(data))
files = sorted(str(p) for p in data.glob("*.parquet"))
native, splits = plan_native(spec, PartitionPlan("hashed", (), num_shards=4), files,
                             SplitSizing(max_bytes=1 << 40, parallelism=1))
with EmbeddedDaemon([loc], free_space_reserve=0) as url:
    cfg = tasks.Phase1Config("unfold", (url,), layout_of(spec), "day", 200_000, 5,
                             max_bytes=64 << 20)
    lines = [json.loads(x) for x in tasks.run_native_task(cfg, native, iter(splits[0]))]
print(json.dumps({"poolPeak": pa.default_memory_pool().max_memory(), "stats": lines[-1],
                  "shipped": sum(u["rows"] for u in lines[:-1])}))
"""


def test_unfoldable_input_is_shipped_without_combining_held_tables(tmp_path: Path) -> None:
    data = tmp_path / "data"
    unfold_data.generate(data, 1_000_000, row_group=100_000)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(data), str(tmp_path / "loc")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["stats"]["rowsIn"] == got["shipped"] == 1_000_000  # nothing folded, all sent
    assert got["poolPeak"] <= 110 << 20, got["poolPeak"] / 2**20  # 154 MiB with the combine


def test_batches_of_a_row_group_keep_only_the_dictionary_values_they_use(tmp_path: Path) -> None:
    """Parquet's reader gives batch k of a row group the dictionary read so far; the native
    reader compacts it to the batch's own values (same rows, same nulls)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shuffled.spark.phase1.native.reader import compact

    values = [None if i % 13 == 0 else f"v{i}" for i in range(40_000)]
    pq.write_table(pa.table({"s": values}), tmp_path / "f.parquet", row_group_size=40_000)
    pf = pq.ParquetFile(tmp_path / "f.parquet", read_dictionary=["s"])
    batches = list(pf.iter_batches(batch_size=10_000, columns=["s"]))
    assert len(batches[-1].column(0).dictionary) > 2 * batches[-1].num_rows  # the growth
    for batch in batches:
        col = batch.column(0)
        small = compact(col)
        assert len(small.dictionary) <= len(small)
        assert small.to_pylist() == col.to_pylist()

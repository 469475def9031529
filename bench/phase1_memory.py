"""``python -m bench.phase1_memory [--unfoldable] [ROWS ...]``: phase 1's memory and its
combiner on comparison 5's data (bench/e2e_data.py), or on rows that never fold
(bench/unfold_data.py), at several sizes, one ingestion each.

Prints, per size, the peak RSS of the largest phase-1 Python worker (VmHWM, reset when the
task starts) and what a task added to it (beyond pages its worker kept from a task of the
ten seconds before), the rows phase 1 shipped against the rows read
and against the rows the job published (the distinct keys of the whole input: no combiner
can ship fewer than one per key per task holding it), and the phases' seconds.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import e2e_data, unfold_data


def main(argv: list[str]) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shuffled.api import ingest

    shape = unfold_data if "--unfoldable" in argv else e2e_data
    argv = [a for a in argv if a != "--unfoldable"]
    for rows in [int(x) for x in argv] or [10_000_000, 30_000_000]:
        with tempfile.TemporaryDirectory(prefix="shuffled-p1mem-") as tmp:
            data = Path(tmp) / "data"
            started = time.monotonic()
            shape.generate(data, rows)
            made = time.monotonic() - started
            result = ingest(shape.spec(data), output_dir=str(Path(tmp) / "out"))
            p1 = result.report["phases"]["partialSegmentGeneration"]
            tasks = result.report["subtasks"]
            print(json.dumps({
                "rows": rows, "generatedSeconds": round(made, 1), "tasks": len(tasks),
                "peakWorkerRssMiB": round(p1.get("peakTaskRssBytes", 0) / 2**20, 1),
                "peakTaskGrowthMiB": round(p1.get("peakTaskRssGrowthBytes", 0) / 2**20, 1),
                "rowsRead": result.report["ingestionStatsAndErrors"]["rowStats"]
                ["buildSegments"]["processed"],
                "rowsShipped": p1.get("rowsShipped"), "rowsOut": result.report["rowsOut"],
                "bytesShuffled": p1.get("bytesShuffled"),
                "bytesBeforeCompression": p1.get("bytesBeforeCompression"),
                "phase1Seconds": p1["ingest/task/time"] / 1000,
                "peakMergeWorkerRssMiB": round(result.report["phases"]["partialSegmentMerge"]
                                               .get("peakTaskRssBytes", 0) / 2**20, 1),
                "phase2Seconds": result.report["phases"]["partialSegmentMerge"]
                ["ingest/task/time"] / 1000}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

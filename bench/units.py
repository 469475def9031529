"""``python -m bench.units SHAPE [ROWS]``: what each unit of an ingestion costs, from a
profile of every process of one run (py-spy) and the task report.

One warm-up ingestion, then one under ``py-spy record --subprocesses``, attached once the
warm-up is done (driver, embedded daemon, Spark's Python workers; the JVM is not sampled:
its share is the wall time the Python processes wait). Each sample is put in a bucket by the frames it holds (phase 1
reading, rolling up, cutting and sending partials; the daemon receiving, committing,
serving; phase 2 fetching, merging, writing segments; publishing; Spark's per-task Python
start-up; the rest of the driver), and each bucket is divided by its unit from the task
report: input rows, partials, segments, Spark tasks, or once per job. Printed as the
markdown table docs/benchmarks.md carries; ``--json`` prints the figures; ``--raw PATH``
keeps py-spy's samples for a closer look.

A sample is a thread py-spy did not find idle: running, or ready to run and waiting for a
core. With the driver, the daemon, two Python workers and the JVM on two cores, the
"busy seconds" add up to more than the run's CPU time; their shares are what to compare.

SHAPE is ``druid`` (comparison 7), ``druid_json`` (comparison 9) or ``e2e`` (comparison 5).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

RATE = 100  # samples per second per thread
# py-spy beside this interpreter (the venv's bin, not on PATH when run as .venv/bin/python)
PY_SPY = (shutil.which("py-spy", path=os.path.dirname(sys.executable))
          or shutil.which("py-spy"))

#: (bucket, unit, frames that put a sample there: any of them, in order of precedence)
BUCKETS: list[tuple[str, str, tuple[str, ...]]] = [
    ("phase 1: read and parse input", "input row", (
        "read_split", "native_text", "text_json", "text_csv", "prepare_batch",
        "ArrowStreamSerializer", "load_stream")),
    ("phase 1: roll up", "input row", ("rollup_input", "_pending_table", "rows/grouping",
                                       "rows/rollup")),
    ("phase 1: partition (Spark's hash)", "input row", ("Bucketer", "pmod_hash", "sparkhash")),
    ("phase 1: cut and encode partials", "partial", ("encode_flush", "partials.py")),
    ("phase 1: send partials", "partial", ("put_flush", "put_partials", "client/bulk",
                                           "phase1/ring.py")),
    ("daemon: receive and store partials", "partial", (
        "server/bulk.py", "storage/upload", "storage/append", "storage/commit",
        "storage/catalog", "storage/arrowfile", "storage/packs")),
    ("daemon: serve partitions", "partial", ("server/partitions.py", "server/sendfile",
                                             "storage/streams", "storage/reads")),
    ("daemon: HTTP and the rest", "partial", ("aiohttp", "shuffled/server")),
    ("phase 2: fetch and decode", "partial", ("phase2/fetch", "get_partitions", "from_ipc",
                                               "client/partitions")),
    ("phase 2: merge", "segment", ("merge_partitions", "merge_bounded", "phase2/spill")),
    ("phase 2: write segments", "segment", ("_write (shuffled/spark/phase2/merge.py",
                                            "_segment_table", "ParquetWriter", "sync_files",
                                            "write_table (pyarrow/parquet")),
    ("publish", "segment", ("phase2/publish", "shards.py")),
    # The phase records (one JSON line per partial and per segment), written by the tasks
    # and read by the driver.
    ("task records (JSON lines)", "partial", ("shuffled/spark/records.py",)),
    ("Spark task start-up (Python worker)", "Spark task", (
        "pyspark/worker.py", "cloudpickle", "pyspark/daemon.py", "_compile_source",
        "importlib")),
]


def _bucket(stack: str) -> tuple[str, str]:
    for name, unit, marks in BUCKETS:
        if any(m in stack for m in marks):
            return name, unit
    return "driver and the rest", "job"


def _idle(leaf: str) -> bool:
    # py-spy shows a thread in a blocking C call by its Python frame: the ones known to
    # wait (py4j's finalizer thread sleeps a second at clientserver.py:58).
    return any(w in leaf for w in ("thread.py:81", "(threading.py", "select", "wait (",
                                   "_recv_into", "readinto", "poll (", "sleep",
                                   "py4j/clientserver.py:58"))


def profile(shape: str, rows: int, work: Path) -> tuple[dict[str, Any], Counter[tuple[str, str]]]:
    """Run the shape twice (the second under py-spy); its task report and the samples per
    (bucket, unit)."""
    raw = work / "profile.raw"
    out = work / "report.json"
    script = work / "run.py"
    script.write_text(f"""
import json, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from bench import e2e_data, druid_data, druid_json_data
from bench.e2e_worker import session
shape = {{"e2e": e2e_data, "druid": druid_data, "druid_json": druid_json_data}}[{shape!r}]
data = Path({str(work / 'data')!r})
if not data.exists():
    shape.generate(data, {rows})
spark = session({{"spark.driver.memory": "3g"}})
from shuffled.api import ingest
import shutil
for i in range(2):
    shutil.rmtree({str(work / 'out')!r}, ignore_errors=True)
    if i == 1:
        Path({str(work / 'go')!r}).write_text("")
    r = ingest(shape.spec(data), output_dir={str(work / 'out')!r})
Path({str(out)!r}).write_text(json.dumps(r.report))
spark.stop()
""")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    go = work / "go"
    run = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 1800
        while not go.exists():  # the warm-up run is done
            if run.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the ingestion ended (exit {run.returncode}) or took "
                                   f"over 30 min before its measured run")
            time.sleep(0.2)  # poll interval of a bounded wait
        assert PY_SPY is not None
        subprocess.run([PY_SPY, "record", "--pid", str(run.pid), "--subprocesses",
                        "--rate", str(RATE), "--format", "raw", "-o", str(raw)],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=3600)  # ends when the process does
        if run.wait(timeout=3600) != 0:
            raise RuntimeError(f"the ingestion failed (exit {run.returncode})")
    finally:
        if run.poll() is None:
            run.kill()
    counts: Counter[tuple[str, str]] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if _idle(frames[-1]):
            continue
        counts[_bucket(stack)] += int(n)
    return json.loads(out.read_text()), counts


def _count(value: Any) -> int:
    return value if isinstance(value, int) else len(value or [])


def units(report: dict[str, Any]) -> dict[str, int]:
    phases = report["phases"]
    p1 = phases.get("partialSegmentGeneration", {})
    p2 = phases.get("partialSegmentMerge", {})
    return {"input row": report["ingestionStatsAndErrors"]["rowStats"]["buildSegments"]
            ["processed"] or 1, "partial": p1.get("partials") or 1,
            # the report names its segments (a list) or, for many, counts them
            "segment": _count(report.get("segments")) or 1,
            "Spark task": (p1.get("tasks") or 0) + (p2.get("tasks") or 0) or 1, "job": 1}


def table(report: dict[str, Any], counts: Counter[tuple[str, str]]) -> str:
    """The markdown table: per bucket its share, CPU seconds and cost per unit."""
    n = units(report)
    total = sum(counts.values()) or 1
    # py-spy leaves out idle threads, not runnable ones waiting for a core: on a busy
    # 2-core machine these are thread-seconds at work or ready to, not CPU seconds.
    lines = ["| where | unit | units | busy s (one run) | share | per unit |",
             "|---|---|---:|---:|---:|---:|"]
    for (name, unit), samples in sorted(counts.items(), key=lambda x: -x[1]):
        seconds = samples / RATE
        per = seconds / n[unit]
        shown = f"{per * 1e6:,.1f} us" if per < 1e-3 else f"{per * 1e3:,.1f} ms"
        lines.append(f"| {name} | {unit} | {n[unit]:,} | {seconds:.2f} | "
                     f"{100 * samples / total:.0f}% | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.units")
    p.add_argument("shape", choices=["druid", "druid_json", "e2e"])
    p.add_argument("rows", type=int, nargs="?", default=3_000_000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--raw", type=Path, help="keep py-spy's raw samples at this path")
    args = p.parse_args(argv)
    if PY_SPY is None:
        p.error("py-spy is not installed (it is in the test extras: make venv)")
    with tempfile.TemporaryDirectory(prefix="shuffled-units-") as tmp:
        report, counts = profile(args.shape, args.rows, Path(tmp))
        if args.raw:
            shutil.copy(Path(tmp) / "profile.raw", args.raw)
    if args.json:
        print(json.dumps({"units": units(report), "samples": {
            f"{k[0]} / {k[1]}": v for k, v in counts.items()}}, indent=1))
    else:
        print(table(report, counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What losing a daemon costs: ``python -m bench.failover [rows] [repeats] [days]``.

The Druid shape (:mod:`bench.druid_data`: ``rows`` rows over ``days`` day chunks, four
string dimensions, hashed numShards 2, read natively from Parquet) ingested through three
``shuffled serve`` processes on loopback by one local[2] Spark session, ``repeats`` times
undisturbed and ``repeats`` times with daemon 0 SIGKILLed by phase-1 task 0 after its
first flush landed there (replication off: that task's partials there are lost, later
flushes of every task fail over), and ``repeats`` times with daemon 0 SIGKILLed by a merge
task after its first batch (``shuffleRetrySeconds`` 120: the merge tasks reading it move on
once the driver's verdict reaches them, not after 120 s), and, with deep storage (a moto S3
server on loopback) and ``shuffleDurability: deep``, ``repeats`` times undisturbed and
``repeats`` times with daemon 0 SIGKILLed right after the seal (its share is then read from
the tier through the survivors: no recompute; target <= 1.1x the undisturbed deep run),
alternating. Each run gets three
fresh daemons. Prints the medians, their ratios to the undisturbed run (target <= 1.5,
docs/failover.md), the seconds from the phase-2 kill to the merge tasks' Lost reports
(target 5 s) and what the recovery did (from the task report), and checks every kind of run
publishes the same rows.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

import pyarrow.parquet as pq
from pyspark import cloudpickle

from bench.daemon import Daemon
from bench.druid_data import generate, spec
from bench.s3server import MotoTier, moto_tier
from shuffled.spark.hooks import Hooks

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the hooks go to executors
KINDS = ("undisturbed", "killed", "killed_phase2", "deep_undisturbed", "deep_killed")
PHASE = {"killed": 1, "killed_phase2": 2, "deep_killed": 3}  # 3: after the seal


@dataclass
class Kill(Hooks):
    """SIGKILL the daemon ``pid`` (this bench started it) in phase 1, once Spark partition
    0 has a flush answered, or in phase 2 once a merge task fetched a batch; ``log``
    records when, and when each partition is reported lost (one JSON line each)."""

    pid: int
    phase: int
    log: str

    def _kill(self) -> None:
        try:  # once, across worker processes
            os.close(os.open(self.log + ".killed", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
        os.kill(self.pid, signal.SIGKILL)
        self._note({"kill": time.time()})

    def _note(self, record: dict[str, Any]) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)

    def phase1_uploaded(self, partition: int, attempt_number: int, uploads: int) -> None:
        if self.phase == 1 and partition == 0 and uploads >= 1:
            self._kill()

    def phase2_fetched(self, batches: int) -> None:
        if self.phase == 2:
            self._kill()

    def after_seal(self) -> None:
        if self.phase == 3:
            self._kill()

    def phase2_lost(self, partition: int, servers: tuple[str, ...], why: str) -> None:
        self._note({"lost": time.time()})


def _rows(out: Path) -> tuple[int, int]:
    files = sorted(out.rglob("*.parquet"))
    tables = [pq.read_table(f, columns=["count"]) for f in files]
    return sum(t.num_rows for t in tables), sum(int(t.column(0).to_numpy().sum()) for t in tables)


def _one(base: Path, data: Path, name: str, kind: str,
         tier: MotoTier | None = None) -> dict[str, Any]:
    from shuffled.spark.driver.pipeline import run_ingestion

    work = base / name
    extra: tuple[str, ...] = ()
    if kind.startswith("deep"):
        assert tier is not None
        extra = ("--deep-storage", tier.uri, "--deep-storage-key-file", str(tier.key_file))
    daemons = [Daemon(work / f"d{i}", fsync=True, extra=extra) for i in range(3)]
    log = work / "kill.jsonl"
    the_spec = spec(data)
    try:
        for d in daemons:
            d.start()
        hooks = Hooks()
        if kind in PHASE:
            assert daemons[0].proc is not None
            hooks = Kill(daemons[0].proc.pid, PHASE[kind], str(log))
        if kind == "killed_phase2":
            the_spec["spec"]["tuningConfig"]["shuffleRetrySeconds"] = 120
        if kind.startswith("deep"):
            the_spec["spec"]["tuningConfig"]["shuffleDurability"] = "deep"
        started = time.monotonic()
        result = run_ingestion(the_spec, shuffle_servers=[d.url for d in daemons],
                               output_dir=str(work / "out"), hooks=hooks)
        seconds = time.monotonic() - started
        rows = _rows(work / "out")
    finally:
        for d in daemons:
            d.stop()
    report = result.report
    out = {"seconds": seconds, "rows": rows, "recovery": report["recovery"],
           "phases": {k: v["ingest/task/time"] / 1000 for k, v in report["phases"].items()},
           "failovers": report["phases"]["partialSegmentGeneration"].get("failovers", 0)}
    if kind == "killed_phase2":
        events = [json.loads(x) for x in log.read_text().splitlines()]
        killed = min(e["kill"] for e in events if "kill" in e)
        lost = [e["lost"] - killed for e in events if "lost" in e]
        out["killToLost"] = [round(min(lost), 2), round(max(lost), 2)] if lost else None
    return out


def main(argv: list[str]) -> int:
    rows = int(argv[0]) if argv else 2_000_000
    repeats = int(argv[1]) if len(argv) > 1 else 3
    days = int(argv[2]) if len(argv) > 2 else 1096  # three years
    kinds = argv[3].split(",") if len(argv) > 3 else list(KINDS)  # e.g. the deep ones only
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from shuffled.spark.driver.sparksession import get_session

    spark, _ = get_session("local[2]")
    base = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    data = base / "data"
    generate(data, rows, days)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    try:
        with moto_tier(base / "tier") as tier:
            _one(base, data, "warmup", "undisturbed")  # Python workers and imports, once
            for i in range(repeats):
                for kind in runs:
                    runs[kind].append(_one(base, data, f"{kind}-{i}", kind, tier))
                    print(f"{kind} {i}: {runs[kind][-1]['seconds']:.1f} s "
                          f"{json.dumps(runs[kind][-1]['phases'])}"
                          + (f" kill->Lost {runs[kind][-1]['killToLost']} s"
                             if kind == "killed_phase2" else ""), flush=True)
    finally:
        spark.stop()
    same = {json.dumps(r["rows"]) for v in runs.values() for r in v}
    if len(same) != 1:
        raise SystemExit(f"the runs disagree on the published rows: {same}")
    t = {k: median(r["seconds"] for r in v) for k, v in runs.items()}

    def ratio(a: str, b: str) -> float | None:
        return t[a] / t[b] if a in t and b in t else None

    deep = runs.get("deep_killed", [])
    print(json.dumps({"rows": rows, "days": days, "repeats": repeats,
                      "seconds_median": t, "ratio": ratio("killed", "undisturbed"),
                      "ratio_phase2": ratio("killed_phase2", "undisturbed"),
                      "target": "<= 1.5", "rowsOut_countSum": next(iter(same)),
                      "killToLost_phase2": [r["killToLost"]
                                            for r in runs.get("killed_phase2", [])],
                      "lastRecovery": (runs.get("killed") or [{}])[-1].get("recovery"),
                      "failovers": [r["failovers"] for r in runs.get("killed", [])],
                      # the deep runs: lost after the seal vs undisturbed, both deep
                      "ratio_deep": ratio("deep_killed", "deep_undisturbed"),
                      "target_deep": "<= 1.1, zero recompute",
                      "deep_undisturbed_vs_local": ratio("deep_undisturbed", "undisturbed"),
                      "recomputed_deep": [r["recovery"]["subtasksRecomputed"] for r in deep],
                      "readFromTier_deep": [r["recovery"].get("readFromTier") for r in deep],
                      "phases_deep_killed": [r["phases"] for r in deep],
                      "seconds_deep": {k: [round(r["seconds"], 2) for r in runs[k]]
                                       for k in ("deep_undisturbed", "deep_killed")
                                       if k in runs},
                      "rounds_deep_killed": [r["recovery"]["rounds"] for r in deep]},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

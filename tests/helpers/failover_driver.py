"""The failover tests' Spark driver: one process, one Spark application on the cluster,
every scenario in turn (an application's executors take longer to start than a scenario
takes to run).

Usage: ``python tests/helpers/failover_driver.py ARGS.json RESULTS.json``. ARGS has ``master``,
``input`` (the JSON input directory), ``root`` (a scratch directory) and ``scenarios``:
each with a ``name`` and optional ``tuning`` (tuningConfig additions), ``partitions``
(the partitionsSpec; hashed numShards 2), ``reader`` (``auto``; ``jvm`` for partials),
``kill_in_phase1``
(daemon indexes an executor SIGKILLs after partition 0's second upload),
``kill_between`` (indexes SIGKILLed after phase 1 commits, before phase 2),
``kill_after_seal`` (indexes SIGKILLed once the daemons are sealed), ``deep`` (the
daemons copy sealed tasks to deep storage: a moto S3 server on loopback started for the
scenario, a bucket and key made for it), ``term_in_phase2`` (an index a merge task SIGTERMs; this driver restarts it on the same
port and locations, the operator's rolling restart) and ``cli`` (run through
``shuffled ingest`` to see what a user sees; its stdout and stderr are kept). Each scenario
gets three fresh daemon processes (stopped by pid at its end). RESULTS gets, per
scenario: the task report, the error if any, the daemons' urls, what each survivor still
holds of the task, the victims' exit codes and whether a restart happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.helpers.cli import fds_to
from tests.helpers.hooks import StopDaemons
from tests.helpers.procs import DaemonProcess
from tests.helpers.ingestion import base_spec, free_port, held_tasks


def spec_for(base: str, tuning: dict[str, Any],
             partitions: dict[str, Any] | None = None) -> dict[str, Any]:
    # Small in-memory bounds: every phase-1 task flushes several times, so a lost daemon
    # holds some flushes of a task whose later ones went elsewhere.
    return base_spec(Path(base), partitions or {"type": "hashed", "numShards": 2},
                     maxRowsInMemory=1000,
                     maxBytesInMemory=1 << 16, maxNumConcurrentSubTasks=4, **tuning)


def restarter(victim: DaemonProcess, done: threading.Event, out: dict[str, Any],
              ) -> threading.Thread:
    """Restart ``victim`` once it exits (bounded by ``done``, set when the scenario ends)."""

    def run() -> None:
        try:
            assert victim.proc is not None
            while not done.is_set():
                try:
                    victim.proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                return
            old = victim.pid
            victim.start()
            out["restarted"] = victim.pid != old
        except BaseException as exc:  # reported in the results, not lost in the thread
            out["restartError"] = repr(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def run_scenario(args: dict[str, Any], sc: dict[str, Any]) -> dict[str, Any]:
    root = Path(args["root"]) / sc["name"]
    root.mkdir(parents=True)
    out: dict[str, Any] = {"name": sc["name"], "restarted": False}
    with contextlib.ExitStack() as stack:
        extra: list[str] = []
        if sc.get("deep"):
            extra = deep_storage(stack, root, out)
        daemons = [DaemonProcess([root / f"d{i}"], "--port", str(free_port()), *extra,
                                 log_path=root / f"d{i}.log") for i in range(3)]
        run_daemons(args, sc, root, daemons, out)
        if sc.get("deep"):
            out["tierLeft"] = tier_names(out)
    return out


def deep_storage(stack: contextlib.ExitStack, root: Path, out: dict[str, Any]) -> list[str]:
    """A moto S3 server for the scenario (its environment set, which the daemons inherit),
    a bucket and a per-run key; the daemons' arguments."""
    import secrets

    from tests.helpers.s3 import moto_s3

    fs, _ = stack.enter_context(moto_s3())
    bucket = "failover-" + secrets.token_hex(6)
    fs.create_dir(bucket)
    key = root / "deep.key"
    key.write_bytes(secrets.token_bytes(48))
    out["_fs"], out["tier"] = fs, f"{bucket}/tier"
    return ["--deep-storage", f"s3://{bucket}/tier", "--deep-storage-key-file", str(key)]


def tier_names(out: dict[str, Any]) -> list[str]:
    import pyarrow.fs as pafs

    fs = out.pop("_fs")
    infos = fs.get_file_info(pafs.FileSelector(out["tier"], allow_not_found=True,
                                               recursive=True))
    return sorted(i.path for i in infos if i.type == pafs.FileType.File)


def run_daemons(args: dict[str, Any], sc: dict[str, Any], root: Path,
                daemons: list[DaemonProcess], out: dict[str, Any]) -> None:
    from shuffled.spark.driver import pipeline

    done = threading.Event()
    watcher = None
    try:
        for d in daemons:
            d.start()
        urls = [d.url for d in daemons]
        out["urls"] = urls
        # Only daemons this driver started, by pid.
        fault = StopDaemons(
            in_phase1=[daemons[i].pid for i in sc.get("kill_in_phase1") or ()],
            between=[daemons[i].pid for i in sc.get("kill_between") or ()],
            sealed=[daemons[i].pid for i in sc.get("kill_after_seal") or ()])
        if sc.get("term_in_phase2") is not None:
            victim = daemons[sc["term_in_phase2"]]
            fault.in_phase2 = [victim.pid]
            watcher = restarter(victim, done, out)
        victims = [daemons[i] for key in ("kill_in_phase1", "kill_between", "kill_after_seal")
                   for i in sc.get(key) or ()]
        spec = spec_for(args["input"], sc.get("tuning") or {}, sc.get("partitions"))
        output = root / "out"
        out["output"] = str(output)
        if sc.get("cli"):
            out["exitCode"] = run_cli(spec, urls, args["master"], output, fault, root)
            out["stdout"] = (root / "cli.stdout").read_text(errors="replace")
            out["stderr"] = (root / "cli.stderr").read_text(errors="replace")
        else:
            try:
                result = pipeline.run_ingestion(spec, shuffle_servers=urls,
                                                master=args["master"],
                                                output_dir=str(output), hooks=fault,
                                                reader=sc.get("reader", "auto"))
                out["report"] = result.report
            except Exception as exc:
                out["error"] = f"{type(exc).__name__}: {exc}"
        report = output / "events" / "task-report.json"
        if "report" not in out and report.exists():
            out["report"] = json.loads(report.read_text())
        out["victimExit"] = [v.proc.wait(timeout=30) if v.proc else None for v in victims]
        out["held"] = {d.url: len(held_tasks(d.url)) for d in daemons if d not in victims}
    finally:
        done.set()
        if watcher is not None:
            watcher.join(timeout=60)
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()


def run_cli(spec: dict[str, Any], urls: list[str], master: str, output: Path,
            fault: StopDaemons, root: Path) -> int:
    """``shuffled ingest`` in this process (its session is this application's), with the
    test's fault hooks handed to the pipeline."""
    import shuffled.spark
    from shuffled import cli

    real = shuffled.spark.run_ingestion

    def with_fault(*a: Any, **kw: Any) -> Any:
        return real(*a, **{**kw, "hooks": fault})

    spec_path = root / "spec.json"
    spec_path.write_text(json.dumps(spec))
    argv = ["ingest", str(spec_path), "--master", master, "--output", str(output)]
    for url in urls:
        argv += ["--shuffle-server", url]
    shuffled.spark.run_ingestion = with_fault  # type: ignore[assignment]
    try:
        with fds_to(root / "cli.stdout", root / "cli.stderr"):
            try:
                return int(cli.main(argv) or 0)
            except SystemExit as exc:
                return int(exc.code or 0)
    finally:
        shuffled.spark.run_ingestion = real  # type: ignore[assignment]


def main(args_path: str, results_path: str) -> int:
    args = json.loads(Path(args_path).read_text())
    if "root" not in args:  # (setdefault made a directory each run, given a root or not)
        args["root"] = tempfile.mkdtemp(prefix="failover-")
    from shuffled.spark.driver.sparksession import get_session

    spark, _ = get_session(args["master"])  # one application: its executors start once
    results = {}
    try:
        for sc in args["scenarios"]:
            results[sc["name"]] = run_scenario(args, sc)
            Path(results_path).write_text(json.dumps(results))  # what is done so far
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))

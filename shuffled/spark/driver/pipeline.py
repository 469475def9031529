"""The supervisor: runs partition determination, phase 1, phase 2 and publishing on Spark.

The driver keeps the shuffle data alive while the job runs and DELETEs it on every shuffle
server when the job ends, success or failure. See docs/exactly-once.md for why phase 2 reads
exactly the committed phase-1 attempts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from shuffled.client import ShuffleClient
from shuffled.errors import ShuffleError
from shuffled.protocol import format_instant
from shuffled.spark.fs import remote
from shuffled.spark.phase1 import native
from shuffled.spark.phase1 import tasks as phase1
from shuffled.spark.phase2 import merge as phase2
from shuffled.spark.phase1.determine import determine
from shuffled.spark.spec.model import IngestSpec, PartitionPlan
from shuffled.spark.driver.monitor import Monitor, stage_status
from shuffled.spark.phase1.prepare import (bucket_column, metric_column, metric_time_column,
                                            multi_value_dimensions, prepare)
from shuffled.spark.phase2.publish import publish, write_json_atomic
from shuffled.spark.driver.context import READERS, Auth, JobContext
from shuffled.spark.driver.report import TaskReport
from shuffled.spark.rows.rollup import BAD, BUCKET, CHUNK, TIME
from shuffled.spark.driver.session import get_session, job_conf
from shuffled.spark.phase2.shards import shard_spec_builder
from shuffled.spark.phase1.source import csv_columns, load_input, resolve_files, resolve_lines
from shuffled.spark.spec.parse import parse_spec

log = logging.getLogger("shuffled.spark")


class IngestionFailed(ShuffleError):
    """The ingestion could not complete (e.g. too many parse exceptions, lost data)."""

    code = "ingestion_failed"


@dataclass(frozen=True)
class IngestResult:
    """What a successful ingestion produced."""

    task_id: str
    data_source: str
    version: str
    segments: list[dict[str, Any]]
    manifest_path: str
    report_path: str
    report: dict[str, Any]
    summary: str


def _task_id(spec: IngestSpec) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return spec.task_id or f"index_parallel_{spec.data_source}_{stamp}_{uuid.uuid4().hex[:8]}"


def run_ingestion(spec: dict[str, Any] | IngestSpec, *, shuffle_servers: list[str],
                  master: str | None = None, output_dir: str, token: str | None = None,
                  ca_file: str | None = None, progress: Callable[[str], None] | None = None,
                  keepalive_seconds: float = 30.0, reader: str = "auto",
                  fault: dict[str, Any] | None = None) -> IngestResult:
    """Run a perfect-rollup ingestion of ``spec`` through the given shuffle servers.

    The spec is validated (SpecError naming the field) and the input files listed before
    Spark starts. Segments, ``manifest.json`` and ``task-report.json`` land under
    ``output_dir/<dataSource>/``. Raises IngestionFailed (or the underlying error) on
    failure, after writing a FAILED task report and deleting the shuffle data.
    ``reader`` picks how phase 1 reads its input: ``native`` (pyarrow on the executors,
    Parquet only, see :mod:`shuffled.spark.phase1.native`), ``jvm`` (Spark reads, rows handed to
    Python), or ``auto`` (native where it applies). ``fault`` is a test hook (see
    :func:`shuffled.spark.phase1.tasks._maybe_fail`).
    """
    if reader not in READERS:
        raise ValueError(f"reader must be auto, native or jvm, not {reader!r}")
    s = parse_spec(spec)
    files = resolve_files(s)
    if s.input_format.type == "csv":
        csv_columns(s, files)
    servers = [u.strip().rstrip("/") for u in shuffle_servers if u.strip()]
    if not servers:
        raise ValueError("at least one shuffle server URL is needed")
    _check_reachable(servers, token, ca_file)
    say = progress or (lambda _msg: None)
    task_id = _task_id(s)
    version = format_instant(int(time.time() * 1000))
    if remote.scheme(output_dir) == "s3":
        # Segments are staged on local disk and uploaded when published (phase2.publish).
        ds_dir = f"{output_dir.rstrip('/')}/{s.data_source}"
        local_dir = tempfile.mkdtemp(prefix=f"shuffled-{s.data_source}-")
    else:
        ds_dir = local_dir = os.path.abspath(os.path.join(output_dir, s.data_source))
        os.makedirs(ds_dir, exist_ok=True)
    report = TaskReport(task_id, s.data_source, version, servers)
    spark, created = get_session(master)
    staging = os.path.join(local_dir, f".staging-{task_id}")
    ctx = JobContext(spark, s, files, tuple(servers), task_id, report, staging,
                     Auth(token, ca_file), reader, say, fault or {})
    monitor = Monitor(task_id, servers, token=token, ca_file=ca_file,
                      keepalive_seconds=keepalive_seconds, progress_seconds=2.0,
                      status=stage_status(spark, lambda: ctx.phase), progress=progress)
    try:
        with job_conf(spark):
            try:
                monitor.start()
                os.makedirs(staging, exist_ok=True)
                job = _Job(ctx)
                staged, plan = job.run()
                ctx.phase = "publish"
                started = time.monotonic()
                report.segments = publish(ds_dir, s.data_source, version, staged,
                                          shard_spec_builder(s, plan, staged), s.append_to_existing)
                report.phase("publish", started, segments=len(report.segments))
                report.status = "SUCCESS"
            finally:
                monitor.stop()
                _cleanup(servers, task_id, token, ca_file, report)
                shutil.rmtree(staging, ignore_errors=True)
                if local_dir != ds_dir:
                    shutil.rmtree(local_dir, ignore_errors=True)
    except BaseException as exc:
        report.status = "FAILED"
        report.error = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        path = _write_report(ds_dir, report)
        exc.add_note(f"task report: {path}")  # the CLI names it in its one paragraph
        say(report.summary())
        raise
    finally:
        if created:
            spark.stop()
    report_path = _write_report(ds_dir, report)
    summary = report.summary()
    say(summary)
    return IngestResult(task_id, s.data_source, version, report.segments,
                        f"{ds_dir}/manifest.json", report_path, report.to_json(), summary)


def _check_reachable(servers: list[str], token: str | None, ca_file: str | None) -> None:
    """Refuse to start when a shuffle server does not answer its health check: found here,
    it is one clear error; found by phase 1, it would be every task failing in turn."""
    down = []
    for server in servers:
        with ShuffleClient(server, token=token, ca_file=ca_file, timeout=10.0) as client:
            if not client.health():
                down.append(server)
    if down:
        raise IngestionFailed(
            f"shuffle server{'s' if len(down) > 1 else ''} {', '.join(down)} did not answer "
            "its health check (GET /status/health); start it (`shuffled serve`), fix the "
            "URL, or leave out --shuffle-server to use an embedded one", servers=down)


def _write_report(ds_dir: str, report: TaskReport) -> str:
    body = report.to_json()
    if remote.scheme(ds_dir) == "s3":
        data = (json.dumps(body, indent=2) + "\n").encode()
        remote.write_bytes(f"{ds_dir}/reports/{report.task_id}.json", data)
        remote.write_bytes(f"{ds_dir}/task-report.json", data)
        return f"{ds_dir}/task-report.json"
    os.makedirs(os.path.join(ds_dir, "reports"), exist_ok=True)
    write_json_atomic(os.path.join(ds_dir, "reports", f"{report.task_id}.json"), body)
    path = os.path.join(ds_dir, "task-report.json")
    write_json_atomic(path, body)
    return path


def _cleanup(servers: list[str], task_id: str, token: str | None, ca_file: str | None,
             report: TaskReport) -> None:
    """DELETE the supervisor task's shuffle data on every server (never raises)."""
    for server in servers:
        try:
            with ShuffleClient(server, token=token, ca_file=ca_file, timeout=30.0) as c:
                c.delete_task(task_id)
            report.cleanup[server] = "deleted"
        except Exception as exc:
            log.warning("could not delete %s on %s: %s", task_id, server, exc)
            report.cleanup[server] = f"failed: {exc}"


class _Job:
    """The driver's steps of one ingestion, all reading one :class:`JobContext`."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.spark, self.spec, self.report, self.say = ctx.spark, ctx.spec, ctx.report, ctx.say
        self.may_be_multi: tuple[str, ...] = ()  # string dimensions whose input may hold arrays
        self.multi_value: set[str] = set()  # those phase 1 saw holding multi-values

    def run(self) -> tuple[list[dict[str, Any]], PartitionPlan]:
        s = self.spec
        rows = load_input(self.spark, s, self.ctx.files)
        self.may_be_multi = multi_value_dimensions(rows, s)
        prepared = prepare(rows, s)
        self.ctx.phase = "determine partitions"
        started = time.monotonic()
        plan, card = determine(prepared, s)
        chunks = len(card) if card else None
        self.report.phase("determinePartitions", started, timeChunks=chunks,
                          estimatedRows=sum(card.values()) if card else None)
        self.say(f"determine partitions: {plan.kind}, "
                 + (f"{chunks} time chunks, {sum(plan.shards(c) for c in card)} partitions"
                    if card else f"numShards {plan.num_shards}"))
        partials = self.phase1(prepared, plan)
        self.seal(partials)
        staged = self.phase2(partials)
        return staged, plan

    def phase1(self, prepared: DataFrame, plan: PartitionPlan) -> list[dict[str, Any]]:
        s = self.spec
        self.ctx.phase = "phase 1 (partial segments)"
        self.say("phase 1: rolling up and shuffling partial segments")
        started = time.monotonic()
        cfg = self.ctx.phase1_config(self.may_be_multi)
        why_not = "the JVM reader was asked for"
        if self.ctx.reader != "jvm":
            conf = self.spark.conf
            sizing = native.SplitSizing(
                native.parse_bytes(conf.get("spark.sql.files.maxPartitionBytes", "128m") or "128m"),
                native.parse_bytes(conf.get("spark.sql.files.openCostInBytes", "4m") or "4m"),
                self.spark.sparkContext.defaultParallelism, s.max_concurrent_subtasks)
            planned = native.plan_native(s, plan, self.ctx.files, sizing)
            if not isinstance(planned, str):
                self.say(f"phase 1 reads {len(self.ctx.files)} Parquet files natively "
                         f"in {len(planned[1])} tasks")
                lines = self._native(cfg, *planned)
                return self._collect(lines, started, "native", native.NATIVE_REASON)
            why_not = planned
        if self.ctx.reader == "native":
            raise IngestionFailed(f"the native phase-1 reader cannot read this input: {why_not}")
        log.info("phase 1 reads through the JVM: %s", why_not)
        return self._collect(self._jvm(prepared, plan, cfg), started, "jvm", why_not)

    def _native(self, cfg: phase1.Phase1Config, ninput: native.NativeInput,
                tasks: list[list[native.Split]]) -> list[str]:
        """Each Spark task reads its row groups with pyarrow. ``collect`` keeps the result of
        exactly one successful attempt per task, as the data source commit does."""
        rdd = self.spark.sparkContext.parallelize(tasks, len(tasks))
        return rdd.mapPartitions(
            lambda it: phase1.run_native_task(cfg, ninput, (x for t in it for x in t))).collect()

    def _jvm(self, prepared: DataFrame, plan: PartitionPlan, cfg: phase1.Phase1Config) -> list[str]:
        s = self.spec
        cols = [CHUNK, BUCKET, TIME, *[F.col(f"`{d}`") for d in s.dimension_names],
                *[metric_column(i) for i, m in enumerate(s.metrics) if m.field],
                *[metric_time_column(i) for i, m in enumerate(s.metrics) if m.first_last], BAD]
        handoff = prepared.withColumn(BUCKET, bucket_column(plan, s)).select(*cols)
        limit = s.max_concurrent_subtasks
        if limit > 1 and handoff.rdd.getNumPartitions() > limit:
            handoff = handoff.coalesce(limit)
        result_path = os.path.join(self.ctx.staging, "phase1-committed.jsonl")
        self.spark.dataSource.register(phase1.ShuffleDataSource)
        (handoff.write.format(phase1.ShuffleDataSource.name()).mode("append")
         .option("config", phase1.encode_config(cfg)).option("result_path", result_path).save())
        with open(result_path, encoding="utf-8") as fh:
            return [line for line in fh if line.strip()]

    def _collect(self, lines: list[str], started: float, reader: str,
                 reason: str) -> list[dict[str, Any]]:
        s = self.spec
        partials, bad = [], []
        for line in lines:
            item = json.loads(line)
            if item["kind"] == "partial":
                partials.append(item)
            else:
                self.report.add_subtask(item)
                bad.extend(item["bad"])
                self.multi_value.update(item.get("multiValue", ()))
        bad = bad[: s.max_saved_parse_exceptions]
        resolve_lines(bad)
        for b in bad:
            log.warning("unparseable row at %s:%s: %s", b["file"], b["line"], b["message"])
        self.report.unparseable_events = bad
        r = self.report.rows
        self.report.phase("partialSegmentGeneration", started, subtasks=len(self.report.subtasks),
                          partials=len(partials), bytesShuffled=self.report.bytes_shuffled,
                          bytesBeforeCompression=self.report.bytes_before_compression,
                          # the combiner: rows sent after each task's local rollup
                          rowsShipped=self.report.rows_shipped,
                          peakTaskRssBytes=self.report.peak_rss,
                          peakTaskRssGrowthBytes=self.report.peak_rss_growth,
                          compression=self.spec.partial_compression,
                          reader=reader, readerReason=reason,
                          multiValueDimensions=sorted(self.multi_value))
        self.say(f"phase 1 done: {len(self.report.subtasks)} subtasks, {r['processed']} rows, "
                 f"{r['unparseable']} unparseable, {r['thrownAway']} thrown away, "
                 f"{len(partials)} partials, {self.report.bytes_shuffled} bytes shuffled")
        if r["unparseable"] > s.max_parse_exceptions:
            first = bad[0] if bad else {}
            where = f"; first at {first.get('file')}:{first.get('line')}: {first.get('message')}" if first else ""
            raise IngestionFailed(
                f"Max parse exceptions [{s.max_parse_exceptions}] exceeded: "
                f"{r['unparseable']} unparseable rows{where}", unparseable=r["unparseable"])
        return partials

    def seal(self, partials: list[dict[str, Any]]) -> None:
        """Tell each daemon which subtasks committed partials there (the seal): its paged
        reads then serve only those and say when a partition is complete."""
        committed: dict[str, set[str]] = {}
        for p in partials:
            committed.setdefault(p["server"], set()).add(p["sub"])
        auth = self.ctx.auth
        for server, subs in sorted(committed.items()):
            with ShuffleClient(server, token=auth.token, ca_file=auth.ca_file) as client:
                client.seal(self.ctx.task_id, sorted(subs))

    def phase2(self, partials: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.ctx.phase = "phase 2 (merge)"
        started = time.monotonic()
        assignments = phase2.assign(partials)
        if not assignments:
            self.report.phase("partialSegmentMerge", started, tasks=0, partitions=0)
            self.say("phase 2: no rows to merge")
            return []
        tasks = self.spec.total_merge_tasks
        sized = tasks is None
        if tasks is None:
            tasks = phase2.merge_tasks(assignments, sum(int(p.get("bytes", 0)) for p in partials),
                                       self.spark.sparkContext.defaultParallelism)
        groups = phase2.balance(assignments, tasks)
        self.say(f"phase 2: merging {len(assignments)} partitions in {len(groups)} tasks"
                 + (" (sized from phase 1's rows and bytes)" if sized else ""))
        os.makedirs(self.ctx.staging, exist_ok=True)
        cfg = self.ctx.phase2_config(tuple(sorted(self.multi_value)))
        fn = phase2.make_phase2(cfg)
        rdd = self.spark.sparkContext.parallelize(groups, len(groups))
        results = [json.loads(x) for x in rdd.mapPartitions(lambda it: fn(a for g in it for a in g)).collect()]
        expected = {(a.start, a.end, a.partition): a.rows for a in assignments}
        got = {(r["start"], r["end"], r["partition"]): r["rowsIn"] for r in results}
        if got != expected or len(results) != len(assignments):
            raise IngestionFailed("phase 2 results do not match the phase-1 partitions")
        self.report.rows_out = sum(r["rows"] for r in results)
        self.report.bytes_fetched = sum(r["bytesFetched"] for r in results)
        spent = {f"{k}Seconds": round(sum(r.get(f"{k}Ms", 0.0) for r in results) / 1000, 3)
                 for k in ("fetch", "merge", "write")}  # summed over the merge tasks
        spilled = [r for r in results if "spillFiles" in r]
        self.report.phase("partialSegmentMerge", started, tasks=len(groups),
                          partitions=len(results), rowsOut=self.report.rows_out, **spent,
                          memoryBudgetBytes=self.spec.max_bytes_in_memory or None,
                          peakTaskRssBytes=max((r.get("peakRss", 0) for r in results), default=0),
                          # what a task added to its worker: the budget's measure
                          peakTaskRssGrowthBytes=max(
                              (r.get("peakRss", 0) - r.get("rssAtStart", 0) for r in results),
                              default=0),
                          partitionsSpilled=len(spilled),
                          spillBytes=sum(r["spillBytes"] for r in spilled))
        self.say(f"phase 2 done: {len(results)} segments, {self.report.rows_out} rows")
        return results

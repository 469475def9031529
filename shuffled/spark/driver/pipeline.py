"""The supervisor: runs an ingestion's steps (:mod:`.job`) and publishing on Spark.

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
from typing import Any, NamedTuple


from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.client.http import NO_RETRY
from shuffled.protocol import format_instant
from shuffled.spark.fs import remote
from shuffled.spark.spec.model import IngestSpec
from shuffled.spark.driver.job import IngestionFailed, Job
from shuffled.spark.driver import late, sparkfailure
from shuffled.spark.driver.monitor import Monitor, RowCount, Timing, stage_status
from shuffled.spark.driver.watchdog import DEFAULT_STALL_SECONDS, Watchdog
from shuffled.spark.phase2.iceberg import IcebergOutput, is_iceberg, publish_iceberg
from shuffled.spark.phase2.publish import (make_durable_dir, publish, segment_dir,
                                           spread_versions, write_json_atomic)
from shuffled.spark.hooks import NONE, Hooks
from shuffled.spark.driver.context import READERS, Auth, JobContext
from shuffled.spark.driver.gcpause import frozen_during
from shuffled.spark.driver.report import TaskReport, counted
from shuffled.spark.driver.sparksession import get_session, job_conf, kill_jvm, stop_session
from shuffled.spark.phase2.shards import renumbered, shard_spec_builder
from shuffled.spark.phase1.native.text.plan import csv_columns
from shuffled.spark.phase1.source import resolve_files
from shuffled.spark.spec.parse import parse_spec

log = logging.getLogger("shuffled.spark")


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
    table: str | None = None  # iceberg://CATALOG/NAMESPACE.TABLE when published there


def _task_id(spec: IngestSpec) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return spec.task_id or f"index_parallel_{spec.data_source}_{stamp}_{uuid.uuid4().hex[:8]}"


@frozen_during  # the collector walks only what the ingestion makes (.gcpause)
def run_ingestion(spec: dict[str, Any] | IngestSpec, *, shuffle_servers: list[str],
                  master: str | None = None, output_dir: str, token: str | None = None,
                  ca_file: str | None = None, progress: Callable[[str], None] | None = None,
                  keepalive_seconds: float = 2.0, reader: str = "auto",
                  hooks: Hooks = NONE, signing_secret: bytes | None = None,
                  stall_seconds: float = DEFAULT_STALL_SECONDS) -> IngestResult:
    """Run a perfect-rollup ingestion of ``spec`` through the given shuffle servers.

    The spec is validated (SpecError naming the field) and the input files listed before
    Spark starts. Segments, ``manifest.json`` and ``task-report.json`` land under
    ``output_dir/<dataSource>/``; an ``iceberg://CATALOG/NAMESPACE.TABLE`` output_dir
    publishes them as that Iceberg table's data files in one commit instead
    (:mod:`shuffled.spark.phase2.iceberg`, the reports beside its data). Raises IngestionFailed (or the underlying error) on
    failure, after writing a FAILED task report and deleting the shuffle data.
    ``reader`` picks how phase 1 reads its input: ``native`` (pyarrow on the executors:
    Parquet, JSON and CSV, see :mod:`shuffled.spark.phase1.native.reader`), ``jvm`` (Spark reads, rows handed to
    Python), or ``auto`` (native where it applies). ``keepalive_seconds`` is the period of
    the heartbeats to the daemons (expiry and loss detection, docs/failover.md). ``hooks``
    are test seams (:mod:`shuffled.spark.hooks`); production passes none.
    ``signing_secret`` (the daemons' ``signing_secret_file``, first line): the driver
    mints per-task tokens with it (write for phase 1, read for phase 2, admin for itself,
    docs/security.md) and executors see only those; without it ``token`` (the daemons'
    shared token) goes everywhere. ``stall_seconds``: a Spark job of the ingestion that
    makes no progress for that long fails it (:mod:`.watchdog`).
    """
    if reader not in READERS:
        raise ValueError(f"reader must be auto, native or jvm, not {reader!r}")
    if not stall_seconds > 0:
        raise ValueError(f"the stall timeout must be above 0 seconds, not {stall_seconds}")
    s, files, servers, task_id, auth = _preflight(spec, shuffle_servers, token, ca_file,
                                                  signing_secret)
    if not servers:
        raise ValueError("at least one shuffle server URL is needed")
    say = progress or (lambda _msg: None)
    token = auth.token  # the driver's own from here on (admin of this task when scoped)
    version = format_instant(int(time.time() * 1000))
    ice = None
    if is_iceberg(output_dir):
        # The table's data files are the segments: written in the table's location when
        # it is local, staged and uploaded there before the one commit when on S3.
        ice = IcebergOutput(output_dir, version, task_id, s.segment_granularity)
        ds_dir = ice.report_dir
        local_dir = tempfile.mkdtemp(prefix=f"shuffled-{s.data_source}-")
    elif remote.scheme(output_dir) == "s3":
        # Segments are staged on local disk and uploaded when published (phase2.publish).
        ds_dir = f"{output_dir.rstrip('/')}/{s.data_source}"
        local_dir = tempfile.mkdtemp(prefix=f"shuffled-{s.data_source}-")
    else:
        ds_dir = local_dir = os.path.abspath(os.path.join(output_dir, s.data_source))
        os.makedirs(ds_dir, exist_ok=True)
    report = TaskReport(task_id, s.data_source, version, servers)
    spark, created = get_session(master)
    ui = spark.sparkContext.uiWebUrl
    say(f"Spark {spark.version} on {spark.sparkContext.master}"
        + (f", its UI at {ui}" if ui else ""))
    staging = os.path.join(local_dir, f".staging-{task_id}")
    segments = (ice.local_data_dir if ice and ice.local_data_dir
                else segment_dir(local_dir, version))
    ctx = JobContext(spark, s, files, tuple(servers), task_id, report, staging, segments,
                     auth, reader, say, hooks)
    monitor = Monitor(task_id, servers, token=token, ca_file=ca_file,
                      timing=Timing(keepalive_seconds, restart_seconds=s.shuffle_retry_seconds),
                      progress_seconds=2.0, progress=progress,
                      quota={"bytes": s.shuffle_quota_bytes, "partials": s.shuffle_quota_partials}
                      if s.shuffle_quota_bytes or s.shuffle_quota_partials else None)
    ctx.rows = RowCount(spark)
    monitor.status = stage_status(spark, lambda: ctx.phase, monitor.held, ctx.rows,
                                  group=lambda: ctx.job_group,
                                  shuffled=ctx.rows.shuffled_bytes)
    ctx.monitor = monitor
    rows = ctx.rows
    watchdog = Watchdog(spark, lambda: ctx.job_group, lambda: ctx.phase, stall_seconds,
                        figures=lambda: (monitor.held(), rows()),
                        on_wedged=(lambda: kill_jvm(spark)) if created else None)
    try:
        with job_conf(spark):
            try:
                job = None
                monitor.start()
                watchdog.start()
                os.makedirs(staging, exist_ok=True)
                make_durable_dir(os.path.dirname(segments))
                spread_versions(os.path.dirname(segments))  # on ext4, apart from the last
                make_durable_dir(segments)
                job = Job(ctx)
                staged, plan = job.run()
                ctx.phase = "publish"
                started = time.monotonic()
                staged = renumbered(s, staged)
                if ice is not None:
                    report.segments = publish_iceberg(ice, s, version, staged,
                                                      shard_spec_builder(s, plan, staged),
                                                      hooks)
                else:
                    report.segments = publish(ds_dir, s.data_source, version, staged,
                                              shard_spec_builder(s, plan, staged),
                                              s.append_to_existing, local_root=local_dir)
                report.status = "SUCCESS"
                if not report.segments:
                    shutil.rmtree(segments, ignore_errors=True)  # nothing was written there
                report.phase("publish", started, segments=len(report.segments))
            except BaseException as exc:
                if report.status != "SUCCESS":
                    # Nothing of a failed ingestion stays: its version's directory holds
                    # only its own segments, which no manifest names (publish raises
                    # nothing once its manifest is written).
                    shutil.rmtree(segments, ignore_errors=True)
                    _remove_if_empty(os.path.dirname(segments))  # <ds>/segments/ itself
                    if ice is not None:
                        ice.discard()
                interrupt = interrupt_of(exc)
                if interrupt is not None and interrupt is not exc:
                    raise interrupt  # Ctrl-C, whatever py4j made of it
                # each raises the one-paragraph IngestionFailed if it is its failure
                _explain_spark(ctx, watchdog, exc)  # a stall, a JVM out of memory
                _explain_loss(ctx, exc, job.recovery.recomputed if job is not None else 0)
                raise
            finally:
                watchdog.stop()
                if job is not None:
                    job.recovery.lost.update(ctx.lost)
                    job.recovery.declared = dict(monitor.declared_after)
                    report.recovery = job.recovery.to_json()
                monitor.stop()
                _cleanup(servers, task_id, token, ca_file, report, lost=set(ctx.lost))
                shutil.rmtree(staging, ignore_errors=True)
                if local_dir != ds_dir:
                    shutil.rmtree(local_dir, ignore_errors=True)
    except BaseException as exc:
        report.status = "FAILED"
        report.error = ("interrupted (Ctrl-C): nothing published, the shuffle data deleted"
                        if isinstance(exc, KeyboardInterrupt) else
                        getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
        path = _write_report(ds_dir, report)
        exc.add_note(f"task report: {path}")  # the CLI names it in its one paragraph
        say(report.summary())
        raise
    finally:
        if created:
            stop_session(spark)
    report_path = _write_report(ds_dir, report)
    summary = report.summary()
    say(summary)
    return IngestResult(task_id, s.data_source, version, report.segments,
                        ice.metadata_location if ice else f"{ds_dir}/manifest.json",
                        report_path, report.to_json(), summary,
                        str(ice.target) if ice else None)


class _Checked(NamedTuple):
    """What :func:`_preflight` found: the parsed spec, its input files, the daemons' URLs,
    the task's id and the driver's credentials for it."""

    spec: IngestSpec
    files: list[str]
    servers: list[str]
    task_id: str
    auth: Auth


def _preflight(spec: dict[str, Any] | IngestSpec, shuffle_servers: list[str],
               token: str | None, ca_file: str | None,
               signing_secret: bytes | None) -> _Checked:
    """Everything a run checks before Spark starts, and ``--validate`` with it: the spec
    (SpecError naming the field), its input files, a CSV header, and the daemons' health
    and token (each given daemon must answer)."""
    s = parse_spec(spec)
    files = resolve_files(s)
    if s.input_format.type == "csv":
        csv_columns(s, files)
    servers = [u.strip().rstrip("/") for u in shuffle_servers if u.strip()]
    task_id = _task_id(s)
    auth = (Auth.scoped(signing_secret, task_id, s.shuffle_token_seconds, ca_file)
            if signing_secret else Auth(token, ca_file))
    if servers:
        _check_reachable(servers, auth.token, ca_file)
    return _Checked(s, files, servers, task_id, auth)


def _remove_if_empty(path: str) -> None:
    """Remove ``path`` if it is an empty directory (a failed run leaves no empty one)."""
    try:
        os.rmdir(path)
    except OSError:
        pass


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


def interrupt_of(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C behind ``exc``: ``exc`` itself, or a new KeyboardInterrupt caused by it
    when one is in its chain (py4j, interrupted mid-command, closes the connection in its
    ``except KeyboardInterrupt`` and may raise its own Py4JError there instead); None if
    there is none."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if isinstance(at, KeyboardInterrupt):
            if at is exc:
                return at
            interrupt = KeyboardInterrupt()
            interrupt.__cause__ = exc
            return interrupt
        seen.add(id(at))
        at = at.__cause__ or at.__context__
    return None


def _explain_spark(ctx: JobContext, watchdog: Watchdog, exc: BaseException) -> None:
    """Raise the one-paragraph IngestionFailed for a job that stalled (the watchdog fired)
    or whose Spark work failed for want of memory or a lost result
    (:mod:`.sparkfailure`); return for any other failure."""
    if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, IngestionFailed)
                                              and watchdog.fired is None):
        return
    why = watchdog.fired or sparkfailure.explain(ctx.spark, ctx.phase, exc)
    if why is not None:
        what, hint = why
        raise IngestionFailed(what, phase=ctx.phase, hint=hint) from exc


def _explain_loss(ctx: JobContext, exc: BaseException, recomputed: int) -> None:
    """Raise the one-paragraph IngestionFailed for a job that failed because shuffle
    daemons were lost (every daemon gone, or lost data that could not be recomputed);
    return for any other failure. ``recomputed``: the subtasks run again so far."""
    if isinstance(exc, (IngestionFailed, KeyboardInterrupt)) or ctx.monitor is None:
        return
    gone = ctx.monitor.verdict([s for s in ctx.servers if s not in ctx.lost])
    ctx.lost.update(gone)
    if not ctx.lost:
        return
    names = ", ".join(f"{s} ({why})" for s, why in ctx.lost.items())
    left = ctx.survivors
    what = (f"no shuffle daemon is left ({len(ctx.servers)} lost)" if not left else
            f"the data lost with {len(ctx.lost)} of {len(ctx.servers)} shuffle daemons could "
            f"not be recomputed on the {len(left)} left")
    cause = getattr(exc, "message", None) or _first_line(exc)
    if left and recomputed:
        tried = (f"{counted(recomputed, 'lost subtask')} recomputed from the input, then "
                 f"the ingestion failed with: {cause}")
    elif left:
        tried = f"the ingestion failed before any lost subtask was recomputed, with: {cause}"
    elif ctx.phase.startswith("phase 1"):
        tried = "phase-1 uploads failed over from daemon to daemon until none was left"
    else:
        tried = ("nothing was left to recompute the lost partitions on (phase 2 reads "
                 "partials phase 1 wrote to the daemons)")
    raise IngestionFailed(
        f"{what}: lost {names} during {ctx.phase}; {tried}. Restart the lost daemons (or "
        "leave them out of --shuffle-server) and run the ingestion again; "
        "tuningConfig.shuffleReplicas 2 survives one lost daemon without recompute",
        lost=sorted(ctx.lost)) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


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
             report: TaskReport, lost: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """DELETE the supervisor task's shuffle data on every server (never raises). A daemon
    found lost gets one quick try (it may have come back with the data after the job
    stopped waiting for it); if it does not answer it is reported ``lost``."""
    for server in servers:
        gone = server in lost
        try:
            with ShuffleClient(server, token=token, ca_file=ca_file, timeout=5.0 if gone else 30.0,
                               retry=NO_RETRY if gone else RetryPolicy()) as c:
                c.delete_task(task_id)
            report.cleanup[server] = "deleted"
        except Exception as exc:
            if gone:
                report.cleanup[server] = "lost"
                continue
            log.warning("could not delete %s on %s: %s", task_id, server, exc)
            report.cleanup[server] = f"failed: {exc}"


def validate(spec: dict[str, Any] | IngestSpec, *, shuffle_servers: list[str],
             output_dir: str, token: str | None = None, ca_file: str | None = None,
             signing_secret: bytes | None = None) -> list[str]:
    """``shuffled ingest --validate``: everything :func:`run_ingestion` checks before Spark
    starts (the spec, the input files, a CSV header, the daemons' health and token), and
    the plan as lines to print; starts no Spark, writes nothing, sends no data. Raises the
    error the run would have raised."""
    s, files, servers, _, _ = _preflight(spec, shuffle_servers, token, ca_file, signing_secret)
    p = s.partitions
    if p.num_shards:
        shards = f"{p.num_shards:,} shards a time chunk (known up front)"
    else:
        rows = f"at most {p.max_rows:,}" if p.max_rows else f"about {p.target_rows:,}"
        keyed = late.keying(s, "auto")
        when = ("chosen after phase 1 from its slabs' statistics (one pass; a first pass "
                "if the native reader cannot read the input)" if not isinstance(keyed, str)
                else "chosen by a first pass over the input")
        shards = f"shards of {rows} rows, {when}"
    source = s.input_source
    where = source.base_dir or ", ".join(source.uris + source.prefixes) or source.type
    compressed = sorted({f.rsplit(".", 1)[-1] for f in files
                         if f.endswith((".gz", ".bz2", ".zst", ".xz"))})
    return [
        f"spec: valid ({s.data_source}: {counted(len(s.dimensions), 'dimension')}, "
        f"{counted(len(s.metrics), 'metric')}, rollup {'on' if s.rollup else 'off'})",
        f"input: {counted(len(files), s.input_format.type + ' file')} from {where}"
        + (f" ({', '.join(compressed)} compressed)" if compressed else ""),
        f"time: {s.segment_granularity} segments, {s.query_granularity} query granularity",
        f"partitioning: {p.type}{' ' + str(list(p.dimensions)) if p.dimensions else ''}, "
        f"{shards}" + (", perfect rollup" if s.force_guaranteed_rollup else ""),
        f"shuffle: {counted(len(servers), 'daemon') + ' answering their health check' if servers else 'an embedded daemon'}",
        f"output: {output_dir.rstrip('/')}/{s.data_source}"
        + (" (an Iceberg table)" if is_iceberg(output_dir) else " (Parquet + manifest.json)"),
        "nothing was run: drop --validate to run it",
    ]

"""The driver's steps of one ingestion: partition determination, phase 1, recovery from
lost daemons, the seal and phase 2 (publishing is :mod:`.pipeline`'s). See
docs/exactly-once.md for why phase 2 reads exactly the committed phase-1 attempts, and
docs/failover.md for what happens when a daemon is lost.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shuffled.client import ShuffleClient
from shuffled.protocol import PEERS_PATH
from shuffled.spark.driver import durable, late, late_recompute, parse_errors, recompute
from shuffled.spark.driver.context import JobContext
from shuffled.spark.driver.failed import IngestionFailed
from shuffled.spark.driver.report import counted, size
from shuffled.spark.phase1.native import reader as native
from shuffled.spark.phase1 import sink
from shuffled.spark.phase1 import tasks as phase1
from shuffled.spark.phase1.tasks import Phase1Config
from shuffled.spark.phase1.determine import determine
from shuffled.spark.phase1.columns import metric_column, metric_time_column, native_multi_value
from shuffled.spark.phase1.jvm.prepare import bucket_column, multi_value_dimensions, prepare
from shuffled.spark.phase1.source import input_bytes, load_input
from shuffled.spark.phase1.native.text.blocks import Declined
from shuffled.spark import records
from shuffled.spark.phase2 import merge as phase2
from shuffled.spark.phase2.plan import Assignment
from shuffled.spark.rows.rollup import BAD, BUCKET, CHUNK, TIME
from shuffled.spark.spec.model import PartitionPlan

log = logging.getLogger("shuffled.spark")


class Job:
    """The driver's steps of one ingestion, all reading one :class:`JobContext`."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.spark, self.spec, self.report, self.say = ctx.spark, ctx.spec, ctx.report, ctx.say
        self.recovery = recompute.Recovery()
        self.shares = durable.TierShares()  # which daemons' shares are in deep storage
        # How to re-run one phase-1 subtask alone (set by phase 1): (read natively, the
        # native input and splits) or (through the JVM, the hand-off DataFrame).
        self._native_input: tuple[native.NativeInput, list[list[native.Split]]] | None = None
        self._handoff: DataFrame | None = None
        self.may_be_multi: tuple[str, ...] = ()  # string dimensions whose input may hold arrays
        self.multi_value: set[str] = set()  # those phase 1 saw holding multi-values
        self.slabs: list[records.SlabSent] = []  # the late plan's committed slabs
        self._declined: str | None = None  # the native reader met what it does not read

    def run(self) -> tuple[list[records.Segment], PartitionPlan]:
        s = self.spec
        keyed = late.keying(s, self.ctx.reader)
        if isinstance(keyed, str):
            log.info("partitions are determined by a first pass: %s", keyed)
        else:
            # The late plan reads natively: the JVM's DataFrame of the input is built only
            # if it declines (building it was ~0.3 s of driver time a run, unread).
            self.may_be_multi = native_multi_value(s)
            done = self._late(keyed)
            if done is not None:
                return done
        self.ctx.enter("reading input")  # its Spark jobs (schemas, footers) are watched too
        rows = load_input(self.spark, s, self.ctx.files)
        self.may_be_multi = multi_value_dimensions(rows, s)
        prepared = prepare(rows, s)
        # Why the late plan was not taken: the spec, or the native reader declining.
        why = keyed if isinstance(keyed, str) else self._declined
        self.ctx.enter("determine partitions")
        started = time.monotonic()
        determined = determine(prepared, s)
        plan, card = determined.plan, determined.cardinality
        chunks = len(card) if card else None
        given = s.partitions.type == "hashed" and bool(s.partitions.num_shards)
        self.report.phase("determinePartitions", started,
                          # "scan": a pass over the input before phase 1 (two for range);
                          # "numShards": the plan was given, nothing read
                          method="numShards" if given else "scan", methodReason=why,
                          timeChunks=chunks,
                          estimatedRows=sum(card.values()) if card else None,
                          # range: the shard starts collected, at most one per shard
                          rowsToDriver=determined.rows_to_driver if plan.kind == "range"
                          else None)
        self.ctx.settle()
        kind = (f"dynamic (hashed shards of at most {s.partitions.target_rows:,} rows)"
                 if s.partitions.type == "dynamic" else plan.kind)
        self.say(f"determine partitions: {kind}, "
                 + (f"{counted(len(card), 'time chunk')}, "
                    f"{counted(sum(plan.shards(c) for c in card), 'partition')}"
                    if card else f"numShards {plan.num_shards}"))
        partials = self.phase1(prepared, plan)
        self.ctx.hooks.between_phases()
        partials = self.sealed(partials, "after phase 1")
        self.ctx.hooks.after_seal()
        if self.shares.instances:  # the seal may have waited for the copies: a daemon lost
            partials = self.sealed(partials, "before phase 2")  # meanwhile is found now
        staged = self.phase2(partials)
        durable.note_tier_reads(self.ctx, self.shares, self.recovery,
                                {r for seg in staged for r in seg.from_tier})
        self.recovery.restarts = self.ctx.monitor.restarts() if self.ctx.monitor else {}
        return staged, plan

    def _late(self, keyed: late.Keying) -> tuple[list[records.Segment], PartitionPlan] | None:
        """The late plan (issue 36, :mod:`.late`): phase 1 as slabs, the shards chosen
        from their statistics, phase 2 by key ranges; None when the native reader cannot
        read this input (then the determine pass and today's phase 1 run)."""
        s = self.spec
        self.ctx.enter("phase 1 (partial segments)")
        started = time.monotonic()
        planned = native.plan_native(s, late.placeholder(s, keyed), self.ctx.files,
                                     self._sizing())
        if isinstance(planned, str):
            self._declined = planned
            log.info("the late plan needs the native reader: %s", planned)
            return None
        if self.ctx.rows is not None:
            self.ctx.rows.start()
        when = (f"numShards {keyed.num_shards}, known up front" if keyed.num_shards
                else "shards chosen after phase 1")
        self.say(f"phase 1: rolling up and shuffling slabs ({when}); "
                 f"reading {counted(len(self.ctx.files), s.input_format.type + ' file')} "
                 f"natively in {counted(len(planned[1]), 'task')}")
        self._native_input = planned
        lines, plans = late.run_phase1(self, keyed, *planned)
        declined = [r.reason for r in map(records.load, lines) if isinstance(r, records.Declined)]
        if declined:  # nothing sealed names these slabs: they are never read
            self._native_input = None
            self._declined = f"the native reader met what it does not read: {declined[0]}"
            self.say(f"phase 1: {self._declined}; determining partitions and reading "
                     "through the JVM")
            return None
        self._collect(lines, started, "native", planned[0].reason)
        plan = late.partition_plan(s, keyed, plans)
        # "numShards": the plan was given, nothing read (as without slabs)
        how = ({"method": "numShards",
                "methodReason": "numShards is given (the plan is known up front)"}
               if keyed.num_shards else {"method": "latePlan"})
        self.report.phase("determinePartitions", time.monotonic(), **how,
                          timeChunks=len(plans),
                          # numShards estimates nothing (its slabs carry no sketch)
                          estimatedRows=(None if keyed.num_shards
                                         else sum(p.estimate for p in plans)),
                          # what reached the driver: the shards' bounds, per chunk
                          rowsToDriver=sum(p.shards for p in plans), slabs=len(self.slabs))
        self.say(late.describe(plans, self.slabs))
        self.ctx.hooks.between_phases()
        slabs = late_recompute.CommittedSlabs(list(self.slabs))
        plans = late_recompute.sealed(self, keyed, slabs, plans, "after phase 1")
        self.ctx.hooks.after_seal()
        if self.shares.instances:  # the seal may have waited for the copies: a daemon lost
            plans = late_recompute.sealed(self, keyed, slabs, plans, "before phase 2")
        staged = late.phase2(self, keyed, slabs, plans)
        self.recovery.restarts = self.ctx.monitor.restarts() if self.ctx.monitor else {}
        return staged, plan

    def _sizing(self) -> native.SplitSizing:
        conf = self.spark.conf
        return native.SplitSizing(
            native.parse_bytes(conf.get("spark.sql.files.maxPartitionBytes", "128m") or "128m"),
            native.parse_bytes(conf.get("spark.sql.files.openCostInBytes", "4m") or "4m"),
            self.spark.sparkContext.defaultParallelism, self.spec.max_concurrent_subtasks)

    def phase1(self, prepared: DataFrame, plan: PartitionPlan) -> list[records.Partial]:
        s = self.spec
        self.ctx.enter("phase 1 (partial segments)")
        if self.ctx.rows is not None:
            self.ctx.rows.start()
        self.say("phase 1: rolling up and shuffling partial segments")
        started = time.monotonic()
        cfg = self.ctx.phase1_config(self.may_be_multi)
        why_not = self._declined or "the JVM reader was asked for"
        if self.ctx.reader != "jvm" and self._declined is None:
            planned = native.plan_native(s, plan, self.ctx.files, self._sizing())
            if not isinstance(planned, str):
                self.say(f"phase 1 reads {counted(len(self.ctx.files), s.input_format.type + ' file')} "
                         f"natively in {counted(len(planned[1]), 'task')}")
                self._native_input = planned
                lines = self._native(cfg, *planned)
                declined = [r.reason for r in map(records.load, lines)
                            if isinstance(r, records.Declined)]
                if not declined:
                    return self._collect(lines, started, "native", planned[0].reason)
                # Input the plan could not foresee (text_io.Declined): every task's partials
                # are left uncommitted (phase 2 reads only what _collect commits) and the
                # JVM reader does phase 1 again.
                self._native_input = None
                planned = f"the native reader met what it does not read: {declined[0]}"
                self.say(f"phase 1: {planned}; reading through the JVM")
            why_not = planned
        if self.ctx.reader == "native":
            raise IngestionFailed(f"the native phase-1 reader cannot read this input: {why_not}")
        log.info("phase 1 reads through the JVM: %s", why_not)
        if self.ctx.rows is not None:
            self.ctx.rows.start(jvm=True)
        return self._collect(self._jvm(prepared, plan, cfg), started, "jvm", why_not)

    def _native(self, cfg: Phase1Config, ninput: native.NativeInput,
                tasks: list[list[native.Split]]) -> list[str]:
        """Each Spark task reads its row groups with pyarrow. ``collect`` keeps the result of
        exactly one successful attempt per task, as the data source commit does."""
        rdd = self.spark.sparkContext.parallelize(tasks, len(tasks))
        rows = self.ctx.rows.acc if self.ctx.rows is not None else None
        shuffled = self.ctx.rows.shuffled if self.ctx.rows is not None else None

        def run(it: Iterable[list[native.Split]]) -> list[str]:
            try:
                lines = phase1.run_native_task(cfg, ninput, (x for t in it for x in t))
            except Declined as exc:  # see phase1()
                return [records.dump(records.Declined(str(exc)))]
            if rows is not None and shuffled is not None:  # the progress line's figures
                stats = records.load(lines[-1])  # once the task is done
                if isinstance(stats, records.TaskStats):
                    rows.add(stats.rows_in)
                    shuffled.add(stats.bytes_shuffled)
            return lines

        return rdd.mapPartitions(run).collect()

    def _recompute(self, only: dict[int, frozenset[recompute.Key]]) -> list[records.Partial]:
        """Re-run the phase-1 subtasks ``only`` names, each on its own input split, for
        only their lost keys, on the surviving daemons; returns their partials."""
        subtasks = sorted(only)
        if self._native_input is not None:
            ninput, tasks = self._native_input
            ids, work = recompute.spread(tasks, subtasks,
                                         self.spark.sparkContext.defaultParallelism)
            cfg = self.ctx.phase1_config(self.may_be_multi, partition_ids=tuple(ids),
                                         only_keys=only)
            lines = self._native(cfg, ninput, work)
        else:
            from pyspark.sql.pandas.types import to_arrow_schema

            assert self._handoff is not None
            schema = to_arrow_schema(self._handoff.schema)
            # runJob on the chosen partitions: their own splits, nothing else is read.
            cfg = self.ctx.phase1_config(self.may_be_multi, only_keys=only)
            lines = self.spark.sparkContext.runJob(
                self._handoff.rdd, lambda rows: phase1.run_rows_task(cfg, rows, schema),
                subtasks)
        return [r for r in map(records.load, lines) if isinstance(r, records.Partial)]

    def recover(self, partials: list[records.Partial], when: str,
                wanted: set[recompute.PartitionId] | None = None) -> list[records.Partial]:
        """Ask which daemons are gone (waiting out a restart); if any held committed
        partials with no surviving replica, recompute them: the committed list after."""
        monitor = self.ctx.monitor
        if monitor is None:
            return partials
        backed = self.shares.backed()
        gone = monitor.verdict(self.ctx.survivors, backed=backed)
        self.ctx.lost.update(gone)
        self.recovery.lost.update(gone)
        tier = sorted(s for s in gone if s in backed)
        if tier:  # their shares are read from deep storage: nothing to recompute
            self.say(f"recovering: {', '.join(tier)} lost; reading its share from deep "
                     "storage through the survivors")
            self.recovery.round(when, time.monotonic(), lost=tier, readFromTier=tier,
                                subtasksRecomputed=0)
            durable.warm(self.ctx, self.shares, tier, self._admin)
        only = recompute.lost_keys(partials, [s for s in self.ctx.lost if s not in backed],
                                   wanted)
        if not only:
            return partials
        if not self.ctx.survivors:
            raise RuntimeError("every shuffle daemon is gone")  # explained by _explain_loss
        started = time.monotonic()
        self.ctx.enter("recompute (lost daemon)")
        keys = sum(len(k) for k in only.values())
        self.say(f"recovering: {', '.join(self.ctx.lost)} lost; recomputing "
                 f"{counted(len(only), 'phase-1 subtask')} for {counted(keys, 'partition')} on "
                 f"{counted(len(self.ctx.survivors), 'daemon')}")
        recomputed = self._recompute(only)
        after = recompute.replace(partials, only, recomputed)
        self.recovery.round(when, started, lost=sorted(gone) or sorted(self.ctx.lost),
                            subtasksRecomputed=len(only), keysRecomputed=keys,
                            partialsDropped=len(partials) + len(recomputed) - len(after),
                            partialsRecomputed=len(recomputed),
                            bytesRecomputed=sum(p.bytes for p in recomputed))
        return after

    def _jvm(self, prepared: DataFrame, plan: PartitionPlan, cfg: Phase1Config) -> list[str]:
        s = self.spec
        cols: list[Column | str] = [
            CHUNK, BUCKET, TIME, *[F.col(f"`{d}`") for d in s.dimension_names],
            *[metric_column(i) for i, m in enumerate(s.metrics) if m.field],
            *[metric_time_column(i) for i, m in enumerate(s.metrics) if m.first_last], BAD]
        handoff = prepared.withColumn(BUCKET, bucket_column(plan, s)).select(*cols)
        limit = s.max_concurrent_subtasks
        if limit > 1 and handoff.rdd.getNumPartitions() > limit:
            handoff = handoff.coalesce(limit)
        result_path = os.path.join(self.ctx.staging, "phase1-committed.jsonl")
        self._handoff = handoff
        self.spark.dataSource.register(sink.ShuffleDataSource)
        (handoff.write.format(sink.ShuffleDataSource.name()).mode("append")
         .option("config", sink.encode_config(cfg)).option("result_path", result_path).save())
        with open(result_path, encoding="utf-8") as fh:
            return [line for line in fh if line.strip()]

    def _collect(self, lines: list[str], started: float, reader: str,
                 reason: str) -> list[records.Partial]:
        s = self.spec
        partials: list[records.Partial] = []
        bad: list[dict[str, Any]] = []
        for record in map(records.load, lines):
            if isinstance(record, records.Partial):
                partials.append(record)
            elif isinstance(record, records.SlabSent):
                self.slabs.append(record)
            elif isinstance(record, records.TaskStats):
                self.report.add_subtask(record)
                bad.extend(dict(b) for b in record.bad)
                self.multi_value.update(record.multi_value)
        if reader == "jvm" or s.input_format.type == "parquet":
            # Druid's processedBytes: the input's bytes (text after decompression); native
            # text tasks count what they read, otherwise the driver counts the input.
            self.report.rows["processedBytes"] = input_bytes(s, self.ctx.files)
        bad = parse_errors.saved_exceptions(s, bad)
        self.report.unparseable_events = bad
        r = self.report.rows
        self.report.phase("partialSegmentGeneration", started, subtasks=len(self.report.subtasks),
                          partials=len(partials), slabs=len(self.slabs) or None,
                          bytesShuffled=self.report.bytes_shuffled,
                          replicas=self.spec.shuffle_replicas,
                          bytesReplicated=self.report.bytes_replicated,
                          replicationSeconds=self.report.replication_ms / 1000,
                          failovers=self.report.failovers,
                          bytesBeforeCompression=self.report.bytes_before_compression,
                          # the combiner: rows sent after each task's local rollup
                          rowsShipped=self.report.rows_shipped,
                          peakTaskRssBytes=self.report.peak_rss,
                          peakTaskRssGrowthBytes=self.report.peak_rss_growth,
                          compression=self.spec.partial_compression,
                          reader=reader, readerReason=reason,
                          multiValueDimensions=sorted(self.multi_value))
        self.ctx.settle()
        self.say(f"phase 1 done: {counted(len(self.report.subtasks), 'subtask')}, "
                 f"{counted(r['processed'], 'row')}, {r['processedWithError']:,} with errors, "
                 f"{r['unparseable']:,} unparseable, "
                 f"{r['thrownAway']:,} thrown away, "
                 f"{counted(len(self.slabs), 'slab') if self.slabs else counted(len(partials), 'partial')}, "
                 f"{size(self.report.bytes_shuffled)} shuffled")
        failed = parse_errors.over_limit(s, r, bad)
        if failed:
            raise IngestionFailed(failed, unparseable=r["unparseable"])
        return partials

    def seal(self, partials: list[records.Partial]) -> list[str]:
        """Tell each daemon which subtasks committed partials there (the seal): its paged
        reads then serve only those and say when a partition is complete. A seal after a
        recompute adds the recomputed subtasks. Returns the daemons that could not be
        sealed (the caller asks whether they are gone)."""
        return durable.seal(self.ctx, recompute.on_daemons(partials), self.shares,
                            self._admin, durable=self.spec.shuffle_durability == "deep")

    def _admin(self, server: str) -> ShuffleClient:
        auth = self.ctx.auth
        return ShuffleClient(server, token=auth.token, ca_file=auth.ca_file,
                             retry=self.ctx.phase2_config().retry)

    def sealed(self, partials: list[records.Partial], when: str,
               wanted: set[recompute.PartitionId] | None = None) -> list[records.Partial]:
        """:meth:`recover`, then :meth:`seal`, again while a daemon fails its seal."""
        for _ in range(len(self.ctx.servers) + 1):
            partials = self.recover(partials, when, wanted)
            if not self.seal(partials):
                return partials
        raise IngestionFailed("the shuffle daemons could not be sealed")

    def phase2(self, partials: list[records.Partial]) -> list[records.Segment]:
        self.ctx.enter("phase 2 (merge)")
        if self.ctx.rows is not None:
            self.ctx.rows.start()
        started = time.monotonic()
        assignments = phase2.assign(partials)
        if not assignments:
            self.report.phase("partialSegmentMerge", started, tasks=0, partitions=0)
            self.say("phase 2: no rows to merge")
            return []
        tasks = self.spec.total_merge_tasks
        sized = tasks is None
        if tasks is None:
            tasks = phase2.merge_tasks(assignments, sum(p.bytes for p in partials),
                                       self.spark.sparkContext.defaultParallelism)
        self.say(f"phase 2: merging {counted(len(assignments), 'partition')} in "
                 f"{counted(min(tasks, len(assignments)), 'task')}"
                 + (" (sized from phase 1's rows and bytes)" if sized else ""))
        os.makedirs(self.ctx.staging, exist_ok=True)
        done: dict[recompute.PartitionId, records.Segment] = {}
        todo = assignments
        for round_ in range(len(self.ctx.servers) + 1):
            results, lost = self._merge(todo, tasks)
            done.update({r.key: r for r in results})
            if not lost:
                break
            # Some partitions could not be read: the daemons named are restarting (then
            # they are read again) or gone (then what they held is recomputed first).
            again_started = time.monotonic()
            wanted = {r.key for r in lost}
            dropped = self.shares.give_up([s for r in lost for s in r.lost])
            if dropped:  # their tier copies could not be read: recomputed when lost
                self.say(f"phase 2: the deep-storage shares of {', '.join(dropped)} could "
                         "not be read; recomputing what they held")
            for r in lost:  # answered without rows it committed: its data is gone
                for server in (s for s in r.missing if PEERS_PATH not in s):
                    self.ctx.lost.setdefault(server, f"lacks committed partials: {r.why}")
                    self.recovery.lost.setdefault(server, self.ctx.lost[server])
            self.say(f"phase 2: {counted(len(wanted), 'partition')} could not be read from "
                     f"{', '.join(sorted({s for r in lost for s in r.lost}))}")
            partials = self.sealed(partials, "during phase 2", wanted)
            self.ctx.enter("phase 2 (merge)")
            todo = [a for a in phase2.assign(partials)
                    if (a.start, a.end, a.partition) in wanted]
            self.recovery.round("phase 2 re-merge", again_started, partitionsRemerged=len(todo),
                                round=round_ + 1)
        else:
            raise IngestionFailed("phase 2 could not read every partition after recovering")
        assignments = phase2.assign(partials)
        results = [done[(a.start, a.end, a.partition)] for a in assignments
                   if (a.start, a.end, a.partition) in done]
        expected = {(a.start, a.end, a.partition): a.rows for a in assignments}
        got = {r.key: r.rows_in for r in results}
        if got != expected or len(results) != len(assignments):
            raise IngestionFailed("phase 2 results do not match the phase-1 partitions")
        groups = min(tasks, len(assignments))
        self.report.rows_out = sum(r.rows for r in results)
        self.report.bytes_fetched = sum(r.bytes_fetched for r in results)
        spent = {f"{k}Seconds": round(sum(getattr(r, f"{k}_ms") for r in results) / 1000, 3)
                 for k in ("fetch", "merge", "write")}  # summed over the merge tasks
        spilled = [r for r in results if r.spill_files is not None]
        self.report.phase("partialSegmentMerge", started, tasks=groups,
                          partitions=len(results), rowsOut=self.report.rows_out, **spent,
                          memoryBudgetBytes=self.spec.max_bytes_in_memory or None,
                          peakTaskRssBytes=max((r.peak_rss for r in results), default=0),
                          # what a task added to its worker: the budget's measure
                          peakTaskRssGrowthBytes=max(
                              (r.peak_rss - r.rss_at_start for r in results), default=0),
                          partitionsSpilled=len(spilled),
                          spillBytes=sum(r.spill_bytes or 0 for r in spilled))
        self.ctx.settle()
        self.say(f"phase 2 done: {counted(len(results), 'segment')}, "
                 f"{counted(self.report.rows_out, 'row')}")
        return results

    def _merge(self, assignments: list[Assignment], tasks: int,
               ) -> tuple[list[records.Segment], list[records.Lost]]:
        """One phase-2 Spark job: (results, partitions reported lost)."""
        groups = phase2.balance(assignments, tasks)
        fn = phase2.make_phase2(self.ctx.phase2_config(
            tuple(sorted(self.multi_value)),
            tier=self.shares.routes(self.ctx.servers, self.ctx.lost)))
        rdd = self.spark.sparkContext.parallelize(groups, len(groups))
        rows = self.ctx.rows.acc if self.ctx.rows is not None else None

        def run(it: Iterable[list[Assignment]]) -> Iterator[str]:
            for line in fn(a for g in it for a in g):
                if rows is not None:  # the progress line's rows, once the task is done
                    done = records.load(line)
                    rows.add(done.rows if isinstance(done, records.Segment) else 0)
                yield line

        got = [records.load(x) for x in rdd.mapPartitions(run).collect()]
        return ([r for r in got if isinstance(r, records.Segment)],
                [r for r in got if isinstance(r, records.Lost)])

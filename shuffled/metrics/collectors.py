"""Scrape-time collectors: disk and index state read when Prometheus asks, never cached."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shuffled.storage import Store
from shuffled.storage import DeepStats


class StoreCollector(Collector):
    """Per-location used/capacity/free/health, tasks and partial segments held, and how far
    the most overdue task is past its expiry (so an alert can see data the sweeper keeps)."""

    def __init__(self, store: Store, in_flight: Callable[[], dict[str, int]] | None = None,
                 held_partials: Callable[[], int] | None = None) -> None:
        self._store = store
        self._in_flight = in_flight
        self._held_partials = held_partials

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        used = GaugeMetricFamily("shuffled_location_used_bytes",
                                 "Bytes of partial segments stored in the location.",
                                 labels=["location"])
        cap = GaugeMetricFamily("shuffled_location_capacity_bytes",
                                "The location's max size, or its file system's size.",
                                labels=["location"])
        free = GaugeMetricFamily("shuffled_location_free_bytes",
                                 "Free bytes on the location's file system.", labels=["location"])
        healthy = GaugeMetricFamily("shuffled_location_healthy",
                                    "1 if the location takes writes, 0 if taken out of service.",
                                    labels=["location"])
        files = GaugeMetricFamily("shuffled_location_partials",
                                  "Partial segments stored in the location.", labels=["location"])
        for loc in self._store.locations:
            label = [str(loc.path)]
            used.add_metric(label, loc.used_bytes)
            files.add_metric(label, loc.files)
            healthy.add_metric(label, 1 if loc.healthy else 0)
            try:
                total, available = loc.disk_usage()
            except OSError:
                continue
            cap.add_metric(label, min(total, loc.max_bytes) if loc.max_bytes else total)
            free.add_metric(label, available)
        yield from (used, cap, free, healthy, files)
        # Group commit: partials per group = how many uploads shared one round of syncs.
        groups = CounterMetricFamily("shuffled_commit_groups",
                                     "Group commits (one round of syncs and one index "
                                     "transaction) done.", labels=["location"])
        committed = CounterMetricFamily("shuffled_commit_partials",
                                        "Partial segments made durable by group commits.",
                                        labels=["location"])
        for loc, commit in zip(self._store.locations, self._store.commits, strict=True):
            groups.add_metric([str(loc.path)], commit.groups)
            committed.add_metric([str(loc.path)], commit.partials)
        yield from (groups, committed)
        tasks = self._store.tasks()
        yield GaugeMetricFamily("shuffled_tasks", "Supervisor tasks with data held.",
                                value=len(tasks))
        yield GaugeMetricFamily("shuffled_partials", "Partial segments held.",
                                value=sum(t.files for t in tasks))
        yield GaugeMetricFamily("shuffled_held_bytes", "Bytes of partial segments held.",
                                value=sum(t.bytes for t in tasks))
        # Quotas (shuffled.storage.write.admission): per task would be a label per task id
        # (unbounded); the operator's limits and how close the nearest task is to its own.
        admission = self._store.admission
        yield GaugeMetricFamily("shuffled_task_quota_bytes", "Most bytes one task may hold "
                                "here (task_quota_bytes; 0: no limit).",
                                value=admission.quota.bytes)
        yield GaugeMetricFamily("shuffled_task_quota_partials", "Most partial segments one "
                                "task may hold here (task_quota_partials; 0: no limit).",
                                value=admission.quota.partials)
        yield GaugeMetricFamily("shuffled_task_quota_used_ratio_max",
                                "The largest share of its own quota (bytes or partials) any "
                                "task holds (0 without quotas).",
                                value=max((admission.used(t) for t in tasks), default=0.0))
        # Expired = last access + expiry_timeout has passed; the sweeper removes such a task
        # within one period unless the overlord says it runs (then its expiry is refreshed)
        # or cannot be asked (kept up to max_age). Read here, not by the sweeper, so the
        # figure grows even while the sweeper is stuck.
        now = self._store.clock()
        timeout = self._store.settings.expiry_timeout
        overdue = [now - (t.last_access + timeout) for t in tasks
                   if now >= t.last_access + timeout]
        yield GaugeMetricFamily("shuffled_overdue_tasks",
                                "Supervisor tasks held past their expiry.", value=len(overdue))
        yield GaugeMetricFamily("shuffled_expiry_overdue_seconds",
                                "How long past its expiry the most overdue task held is "
                                "(0 when none is).", value=max(overdue, default=0.0))
        # Deep storage (shuffled.storage.deep): zero without it.
        deep = self._store.deep
        stats = deep.stats if deep is not None else DeepStats()
        yield CounterMetricFamily("shuffled_deep_offloaded_bytes", "Pack and slab bytes copied to "
                                  "the deep-storage tier (before encryption).",
                                  value=stats.offloaded_bytes)
        yield CounterMetricFamily("shuffled_deep_offloaded_packs", "Packs copied to the "
                                  "deep-storage tier.", value=stats.offloaded_packs)
        yield CounterMetricFamily("shuffled_deep_offloaded_slabs", "Slabs copied to the "
                                  "deep-storage tier.", value=stats.offloaded_slabs)
        yield GaugeMetricFamily("shuffled_deep_offload_pending_tasks", "Sealed tasks being "
                                "copied to the deep-storage tier or waiting to be.",
                                value=deep.pending if deep is not None else 0)
        yield CounterMetricFamily("shuffled_deep_evicted_bytes", "Local pack bytes removed "
                                  "to keep free space over the reserve (their copies in the "
                                  "tier serve them).", value=stats.evicted_bytes)
        yield CounterMetricFamily("shuffled_deep_spilled_packs", "Packs of unsealed tasks "
                                  "copied to the tier early, to be evicted from a full "
                                  "location.", value=stats.spilled_packs)
        yield CounterMetricFamily("shuffled_deep_read_bytes", "Pack bytes read back from the "
                                  "deep-storage tier (packs no longer local).",
                                  value=stats.read_bytes)
        yield CounterMetricFamily("shuffled_deep_errors", "Deep-storage operations that "
                                  "failed (offload, read-back, deletion).", value=stats.errors)
        yield CounterMetricFamily("shuffled_deep_orphans_removed", "Task prefixes the "
                                  "orphan sweep removed from the deep-storage tier (tasks "
                                  "over, or a lost daemon's).", value=stats.orphans_removed)
        if self._in_flight is not None:
            gauge = GaugeMetricFamily("shuffled_in_flight_requests",
                                      "Uploads and downloads in progress.", labels=["kind"])
            for kind, count in self._in_flight().items():
                gauge.add_metric([kind], count)
            yield gauge
        if self._held_partials is not None:
            yield GaugeMetricFamily("shuffled_bulk_held_partials", "Partial segments the "
                                    "bulk uploads in flight hold until they answer (bounded "
                                    "by max_held_partials).", value=self._held_partials())

"""Every metric family the daemon updates as things happen (no per-task labels)."""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from shuffled import __version__
from shuffled.errors import error_codes



class OverlordOutcome(StrEnum):
    """The ``outcome`` label of shuffled_overlord_requests_total: how a task-status call to
    the overlord ended (shuffled.cleanup.overlord counts them)."""

    OK = "ok"
    UNREACHABLE = "unreachable"  # refused, reset, no route
    TIMEOUT = "timeout"
    HTTP_ERROR = "http_error"  # answered, not 200
    BAD_ANSWER = "bad_answer"  # 200, but not a usable answer


class LongPoll(StrEnum):
    """The ``outcome`` label of shuffled_long_polls_total: how a wait for news ended."""

    EARLY = "early"  # news came
    TIMEOUT = "timeout"  # maxWait passed


class Cut(StrEnum):
    """The ``reason`` label of shuffled_connections_cut_total: why the daemon aborted a
    connection in the middle of an answer."""

    SEND_TIMEOUT = "send_timeout"  # the reader took nothing for send_idle_timeout
    ERROR_AFTER_HEADERS = "error_after_headers"  # a failure once the 200 headers went out


class Served(StrEnum):
    """The ``route`` label of shuffled_served_bytes_total and shuffled_served_requests_total."""

    PARTIAL = "partial"  # one partial segment
    PARTITION = "partition"  # whole partitions as one Arrow stream
    PAGES = "pages"  # a page of a paged partition read
    SHARD = "shard"  # a shard read from slabs

# Statuses of shuffled_http_requests_total exported at zero for every route (export_routes).
ROUTE_STATUSES = ("200", "500")
# Rejected-request reasons besides the domain errors' codes: aiohttp's own refusals (its
# reason phrase, snake-cased), the drain on shutdown and unexpected failures.
OTHER_REASONS = ("draining", "internal", "method_not_allowed", "not_found",
                 "request_entity_too_large", "bad_request")

# Request latency buckets from 1 ms to 2 min: small GETs up to 256 MiB transfers.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0, 120.0)


class Metrics:
    """The daemon's metric families, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        Info("shuffled_build", "Version of the running daemon, and the memory pool Arrow's "
             "allocations go to.", registry=registry).info(
            {"version": __version__, "arrow_memory_pool": pa.default_memory_pool().backend_name}
        )
        # The seed's ingest/shuffle/bytes and ingest/shuffle/requests.
        self.served_bytes = Counter(
            "shuffled_served_bytes", "Partial-segment bytes served to readers.", ["route"],
            registry=registry)
        self.served_requests = Counter(
            "shuffled_served_requests", "Partial-segment fetches served to readers.", ["route"],
            registry=registry)
        self.received_bytes = Counter(
            "shuffled_received_bytes", "Partial-segment bytes stored from writers.",
            registry=registry)
        self.received_partials = Counter(
            "shuffled_received_partials", "Partial segments stored (new or replacing).",
            registry=registry)
        self.rejected = Counter(
            "shuffled_rejected_requests", "Requests answered with an error, by reason.",
            ["reason"], registry=registry)
        self.requests = Counter(
            "shuffled_http_requests", "HTTP requests by route template, method and status.",
            ["route", "method", "status"], registry=registry)
        self.latency = Histogram(
            "shuffled_request_duration_seconds", "Request latency by route template.",
            ["route", "method"], buckets=LATENCY_BUCKETS, registry=registry)
        self.deleted_tasks = Counter(
            "shuffled_deleted_tasks", "Supervisor tasks whose data was deleted, by cause.",
            ["cause"], registry=registry)
        self.deleted_bytes = Counter(
            "shuffled_deleted_bytes", "Bytes of partial segments deleted, by cause.", ["cause"],
            registry=registry)
        self.expired_tasks = Counter(
            "shuffled_expired_tasks", "Supervisor tasks found past their expiry by the sweeper.",
            registry=registry)
        self.extended_tasks = Counter(
            "shuffled_extended_tasks",
            "Expired supervisor tasks kept because the overlord says they still run.",
            registry=registry)
        self.sweeps = Counter("shuffled_sweeps", "Sweeper runs.", registry=registry)
        self.sweep_failures = Counter(
            "shuffled_sweep_failures", "Sweeper runs that raised.", registry=registry)
        self.overlord_requests = Counter(
            "shuffled_overlord_requests", "Task-status calls to the overlord, by outcome.",
            ["outcome"], registry=registry)
        self.last_sweep = Gauge(
            "shuffled_last_sweep_timestamp_seconds", "When the sweeper last finished a run.",
            registry=registry)
        # Exported so alert rules can say "N sweep periods" whatever the configured period.
        self.sweep_period = Gauge(
            "shuffled_sweep_period_seconds",
            "How often the expiry sweeper is scheduled (0 while it is not).", registry=registry)
        self.long_polls = Counter(
            "shuffled_long_polls", "Requests that waited for news, by how the wait ended "
            "(early: news came; timeout: maxWait passed).", ["outcome"], registry=registry)
        self.long_poll_waiters = Gauge(
            "shuffled_long_poll_waiters", "Requests waiting for news right now.",
            registry=registry)
        self.connections_cut = Counter(
            "shuffled_connections_cut", "Connections aborted in the middle of an answer, by "
            "reason.", ["reason"], registry=registry)
        self.page_acks = Counter(
            "shuffled_page_acks", "Paged-read tokens acknowledged by readers.",
            registry=registry)
        # Every label value known in advance is exported at zero from the first scrape, so
        # rate() and the shipped alert rules work before the first event (Prometheus' advice
        # on missing metrics); routes are added by the app (export_routes).
        for how in LongPoll:
            self.long_polls.labels(how)
        for reason in sorted(set(error_codes()) | set(OTHER_REASONS)):
            self.rejected.labels(reason)
        for reason in Cut:
            self.connections_cut.labels(reason)
        for outcome in OverlordOutcome:
            self.overlord_requests.labels(outcome)
        for route in Served:
            self.served_bytes.labels(route)
            self.served_requests.labels(route)
        for cause in ("request", "expired", "max_age"):
            self.deleted_tasks.labels(cause)
            self.deleted_bytes.labels(cause)

    def export_routes(self, routes: list[tuple[str, str]]) -> None:
        """Export the latency histogram and the 200 and 500 counts of every (route template,
        method) at zero. 500 (an unexpected failure) can answer any route and is what the
        error-rate alert watches (``status=~"5..", status!="503"``), so its first occurrence
        is counted by rate(); other statuses appear as they happen."""
        for route, method in routes:
            self.latency.labels(route, method)
            for status in ROUTE_STATUSES:
                self.requests.labels(route, method, status)

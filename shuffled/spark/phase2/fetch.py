"""Reading a partition's committed partials from the daemons, in a merge task.

Each source of an :class:`~.plan.Assignment` (the partials of some subtasks, on one or
more replicas) is read from its first replica not known to be gone: in bulk
(:func:`fetch_batch`, a batch of partitions per request per daemon) or in pages
(:func:`stream_partition`, a partition bigger than the memory budget). A daemon that stays
unreachable past the retry budget (long enough to ride through its restart), or declared
lost by the driver (asked of a survivor between retries, :mod:`.verdict`), or answers
without rows it committed, is gone for the rest of the task and its sources move to their
next replica; a source with no replica left makes its partition :class:`SourceLost`,
reported to the driver (which recomputes what was lost) instead of failing the task
(docs/failover.md). Row counts are checked per daemon against what phase 1 reported.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from shuffled.client import ShuffleClient, daemon_failed
from shuffled.errors import CorruptData, DigestMismatch
from shuffled.protocol import Interval, PartitionKey
from shuffled.spark.phase2.plan import Assignment, Phase2Config
from shuffled.spark.phase2.verdict import Verdict
from shuffled.spark.rows.rollup import from_ipc

_IDS_PER_REQUEST = 64


def _client(clients: dict[str, ShuffleClient], cfg: Phase2Config, server: str,
            verdict: Verdict | None = None) -> ShuffleClient:
    """The task's client of ``server``: reads retry it for the read budget, given up as
    soon as the driver declared it lost, when ``verdict`` is given."""
    client = clients.get(server)
    if client is None:
        retry = cfg.retry_of(server)
        retry = retry if verdict is None else verdict.policy(retry, server)
        client = clients[server] = ShuffleClient(server, token=cfg.token, ca_file=cfg.ca_file,
                                                 retry=retry)
    return client


class SourceLost(Exception):
    """Every daemon holding some of a partition's partials is gone (or lacks them)."""

    def __init__(self, servers: Sequence[str], why: str, missing: Sequence[str] = ()) -> None:
        super().__init__(why)
        self.servers = tuple(servers)
        self.why = why
        self.missing = tuple(missing)  # of those, the ones that answered without the rows


def _next_replica(replicas: Sequence[str], down: set[str]) -> str | None:
    return next((r for r in replicas if r not in down), None)


def fetch_batch(clients: dict[str, ShuffleClient], cfg: Phase2Config,
                batch: Sequence[Assignment], down: set[str] | None = None,
                verdict: Verdict | None = None) -> list[list[pa.Table] | SourceLost]:
    """The partials of every assignment of ``batch``: one bulk read per daemon for the
    lot (``get_partitions``), subtask ids :data:`_IDS_PER_REQUEST` at a time. Checks each
    daemon's row count per partition against what phase 1 reported.

    A source is read from its first replica not in ``down``; a daemon that stays
    unreachable past the retry budget, or lacks rows it committed, joins ``down`` and its
    sources move to their next replica, as does a corrupt copy when another replica
    exists. An assignment with a source no replica can serve comes back as
    :class:`SourceLost` (the driver recomputes it) instead of failing the task. With
    ``verdict``, a daemon the driver declared lost is given up within seconds."""
    down = down if down is not None else set(cfg.lost)
    out: list[list[pa.Table] | SourceLost] = [[] for _ in batch]
    parts: dict[tuple[int, int], list[pa.Table]] = {}
    why: dict[str, str] = {}
    lacks: set[str] = set()  # answered, but without rows they committed
    pending = [(n, si) for n, a in enumerate(batch) for si in range(len(a.sources))]
    while pending:
        asked: dict[str, list[tuple[int, int]]] = {}
        for n, si in pending:
            if isinstance(out[n], SourceLost):
                continue
            replicas = cfg.replicas(batch[n].sources[si][0])
            server = _next_replica(replicas, down)
            if server is None:
                out[n] = SourceLost(replicas, "; ".join(
                    f"{r}: {why.get(r, 'known lost')}" for r in replicas),
                    [r for r in replicas if r in lacks])
                continue
            asked.setdefault(server, []).append((n, si))
        pending = []
        for server, items in asked.items():
            try:
                got = _read_sources(_client(clients, cfg, server, verdict), cfg, batch, items)
            except Exception as exc:
                spare = all(_next_replica(cfg.replicas(batch[n].sources[si][0]),
                                          down | {server}) for n, si in items)
                if not (daemon_failed(exc) or (isinstance(exc, (CorruptData, DigestMismatch))
                                       and spare)):
                    raise
                down.add(server)
                why[server] = getattr(exc, "message", None) or repr(exc)
                pending.extend(items)
                continue
            for (n, si), tables in got.items():
                expected = batch[n].sources[si][2]
                rows = sum(t.num_rows for t in tables)
                if rows != expected:  # e.g. a restarted daemon that lost a location
                    down.add(server)
                    lacks.add(server)
                    why[server] = (f"{Interval(batch[n].start, batch[n].end)} partition "
                                   f"{batch[n].partition}: expected {expected} rows, got {rows}")
                    pending.append((n, si))
                else:
                    parts[(n, si)] = tables
    for (n, _si), tables in sorted(parts.items()):
        slot = out[n]
        if not isinstance(slot, SourceLost):
            slot.extend(tables)
    return out


def _read_sources(client: ShuffleClient, cfg: Phase2Config, batch: Sequence[Assignment],
                  items: list[tuple[int, int]]) -> dict[tuple[int, int], list[pa.Table]]:
    """One bulk read of the given (assignment, source) pairs from one daemon."""
    requests: list[tuple[tuple[int, int], PartitionKey, tuple[str, ...]]] = []
    for n, si in items:
        a = batch[n]
        key = PartitionKey(cfg.supervisor_task_id, Interval(a.start, a.end), a.partition)
        subs = a.sources[si][1]
        for i in range(0, len(subs), _IDS_PER_REQUEST):
            requests.append(((n, si), key, subs[i:i + _IDS_PER_REQUEST]))
    bodies = client.get_partitions(cfg.supervisor_task_id,
                                   [(key, list(subs)) for _, key, subs in requests])
    got: dict[tuple[int, int], list[pa.Table]] = {item: [] for item in items}
    for (item, _, _), body in zip(requests, bodies, strict=True):
        got[item].append(from_ipc(body))
    return got


def stream_partition(clients: dict[str, ShuffleClient], cfg: Phase2Config, a: Assignment,
                     down: set[str], verdict: Verdict | None = None,
                     ) -> Iterator[pa.RecordBatch]:
    """The record batches of one partition, read in pages of at most :attr:`page_bytes`
    (paged reads: a partial bigger than a page comes in several), row counts checked per
    daemon as in :func:`fetch_batch`. The driver sealed each daemon before phase 2, so a
    partition reads as complete exactly when every committed partial has been read."""
    key = PartitionKey(cfg.supervisor_task_id, Interval(a.start, a.end), a.partition)
    for held, subs, expected in a.sources:
        replicas = cfg.replicas(held)
        # A replica is chosen before the first page; once rows of it are merged, its loss
        # loses the partition (another replica's tokens are not this one's).
        server = _next_replica(replicas, down)
        got = 0
        why = "known lost"
        while server is not None:
            try:
                for page in _client(clients, cfg, server, verdict).pages(
                        key, max_bytes=cfg.page_bytes, sub_task_ids=list(subs), poll=5.0,
                        deadline=120.0):
                    table = from_ipc(page)
                    del page
                    got += table.num_rows
                    yield from table.to_batches()
            except Exception as exc:
                if not daemon_failed(exc):
                    raise
                down.add(server)
                if got:
                    raise SourceLost(replicas, f"{server}: {exc}") from exc
                why = f"{server}: {getattr(exc, 'message', None) or exc!r}"
                server = _next_replica(replicas, down)
                continue
            break
        if server is None:
            raise SourceLost(replicas, f"no replica answers ({why})")
        if got != expected:
            down.add(server)
            raise SourceLost(replicas, f"{Interval(a.start, a.end)} partition {a.partition} "
                             f"on {server}: expected {expected} rows, got {got}", [server])

"""A hypothesis state machine: a model dict against the real daemon over its HTTP API.

Rules: put (new or replacing), get, aggregate (all or some subtasks), paged reads, seal,
delete, restart (stop the daemon and start a new one on the same locations). After every step the daemon's task
listing must agree with the model; every read must equal the model byte for byte (or be
NotFound exactly when the model holds nothing).
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shuffled.client import RetryPolicy, ShuffleClient
from shuffled.crc import crc32c
from shuffled.errors import Conflict, NotFound, SealedConflict
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.tokens import Scope, mint
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, committed_bytes, files_under, pack_files, sample_table,
)

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
SUP_NAMES = ["sup_a", "sup_b"]
SUPS = st.sampled_from(SUP_NAMES)
SUBS = ["s1", "s2", "s3"]
PIDS = st.sampled_from([0, 7])


class StoreMachine(RuleBasedStateMachine):
    """The model: ``{PartialKey: bytes}``, what the daemon must hold."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="shuffled-stateful-"))
        self.locations = [self.tmp / "a", self.tmp / "b"]
        self.model: dict[PartialKey, bytes] = {}
        # Bytes of every acknowledged upload per task since its last delete: its packs hold
        # at most these (replaced partials' bytes stay until the task is deleted).
        self.written: dict[str, int] = {}
        self.sealed: dict[str, frozenset[str]] = {}  # survives restarts, gone with a delete
        self.failed: set[str] = set()  # deleted since the last restart: paged reads "failed"
        self.daemon: EmbeddedDaemon | None = None
        self.client: ShuffleClient | None = None  # the operator's (the listing)
        # Scoped tokens (docs/security.md), secret and operator token made per run: each
        # rule acts with the token of its own task and right, as the pipeline does.
        self.secret = secrets.token_bytes(32)
        self.operator = secrets.token_urlsafe(24)
        self.scoped: dict[tuple[str, Scope], ShuffleClient] = {}
        self._start()

    def _start(self) -> None:
        self.daemon = EmbeddedDaemon(self.locations, free_space_reserve=0,
                                     auth_token=self.operator, signing_secrets=(self.secret,))
        self.url = self.daemon.start()
        self.client = ShuffleClient(self.url, token=self.operator,
                                    retry=RetryPolicy(attempts=2, backoff=0.01))

    def _stop(self) -> None:
        if self.client is not None:
            self.client.close()
        for scoped in self.scoped.values():
            scoped.close()
        self.scoped.clear()
        if self.daemon is not None:
            self.daemon.stop()
        self.client = self.daemon = None

    @property
    def c(self) -> ShuffleClient:
        assert self.client is not None
        return self.client

    def as_(self, scope: Scope, sup: str) -> ShuffleClient:
        """A client holding the ``scope`` token of task ``sup``."""
        client = self.scoped.get((sup, scope))
        if client is None:
            client = self.scoped[(sup, scope)] = ShuffleClient(
                self.url, token=mint(self.secret, sup, scope, 3600),
                retry=RetryPolicy(attempts=2, backoff=0.01))
        return client

    @rule(sup=SUPS, sub=st.sampled_from(SUBS), pid=PIDS, rows=st.integers(0, 60),
          seed=st.integers(0, 10_000))
    def put(self, sup: str, sub: str, pid: int, rows: int, seed: int) -> None:
        key = PartialKey(sup, sub, INTERVAL, pid)
        body = arrow_bytes(sample_table(rows, seed=seed), batch_rows=25)
        if sub in self.sealed.get(sup, ()):
            # Sealed means sealed (storage.admission): 409, nothing stored (the invariants
            # check the listing and the bytes).
            with pytest.raises(SealedConflict):
                self.as_(Scope.WRITE, sup).put_partial(key, body)
            return
        result = self.as_(Scope.WRITE, sup).put_partial(key, body)
        self.failed.discard(sup)  # a deleted task's id lives again with an upload
        assert result["replaced"] == (key in self.model)
        assert result["rows"] == rows and result["bytes"] == len(body)
        self.model[key] = body
        self.written[sup] = self.written.get(sup, 0) + len(body)

    @rule(sup=SUPS, sub=st.sampled_from(SUBS), pid=PIDS)
    def get(self, sup: str, sub: str, pid: int) -> None:
        key = PartialKey(sup, sub, INTERVAL, pid)
        if key in self.model:
            assert self.as_(Scope.READ, sup).get_partial(key) == self.model[key]
        else:
            with pytest.raises(NotFound):
                self.as_(Scope.READ, sup).get_partial(key)

    @rule(sup=SUPS, pid=PIDS,
          subs=st.none() | st.lists(st.sampled_from(SUBS), min_size=1, max_size=3, unique=True))
    def aggregate(self, sup: str, pid: int, subs: list[str] | None) -> None:
        partition = PartitionKey(sup, INTERVAL, pid)
        held = sorted(k.sub_task_id for k in self.model
                      if k.supervisor_task_id == sup and k.partition_id == pid)
        wanted = held if subs is None else subs
        if not wanted or any(s not in held for s in wanted):
            with pytest.raises(NotFound):
                self.as_(Scope.READ, sup).get_partition(partition, subs)
            return
        got = pa.ipc.open_stream(self.as_(Scope.READ, sup).get_partition(partition, subs)).read_all()
        parts = [pa.ipc.open_stream(self.model[PartialKey(sup, s, INTERVAL, pid)]).read_all()
                 for s in wanted]
        # Partials whose schemas differ (an all-null column is typed null) take the daemon's
        # re-encoding path: the model unifies them the same way.
        assert got.equals(pa.concat_tables(parts, promote_options="permissive"))

    @rule(sup=SUPS, pid=PIDS, max_bytes=st.integers(300, 20_000))
    def paged(self, sup: str, pid: int, max_bytes: int) -> None:
        partition = PartitionKey(sup, INTERVAL, pid)
        sealed = self.sealed.get(sup)
        subs = sorted(k.sub_task_id for k in self.model if k.supervisor_task_id == sup
                      and k.partition_id == pid and (sealed is None or k.sub_task_id in sealed))
        token, tables = 0, []
        for _ in range(1000):  # bounded: a partition of at most 3 partials of 3 batches
            page = self.as_(Scope.READ, sup).read_page(partition, token, max_bytes=max_bytes)
            if sup in self.failed:
                assert page.state == "failed" and not page.body and not page.complete
                return
            if not page.body:
                break
            tables.append(pa.ipc.open_stream(page.body).read_all())
            token = page.next_token
        assert page.complete == (sealed is not None)
        want = [pa.ipc.open_stream(self.model[PartialKey(sup, s, INTERVAL, pid)]).read_all()
                for s in subs]
        def rows(ts: list[pa.Table]) -> list[tuple]:
            return sorted((r for t in ts for r in zip(*(c.to_pylist() for c in t.columns))),
                          key=repr)
        assert rows(tables) == rows(want)

    @rule(sup=SUPS)
    def seal(self, sup: str) -> None:
        subs = frozenset(k.sub_task_id for k in self.model if k.supervisor_task_id == sup)
        if not subs:
            return  # a seal of a task with no data would hold it (empty): not modelled
        known = self.sealed.get(sup)
        if sup in self.failed or (known is not None and not known <= subs):
            with pytest.raises(Conflict):  # a seal may add subtasks, never take one back
                self.as_(Scope.ADMIN, sup).seal(sup, sorted(subs))
            return
        assert self.as_(Scope.ADMIN, sup).seal(sup, sorted(subs))["new"] == (known != subs)
        self.sealed[sup] = subs

    @rule(sup=SUPS)
    def delete(self, sup: str) -> None:
        self.as_(Scope.ADMIN, sup).delete_task(sup)
        self.model = {k: v for k, v in self.model.items() if k.supervisor_task_id != sup}
        self.written.pop(sup, None)
        self.sealed.pop(sup, None)
        self.failed.add(sup)

    @rule()
    def restart(self) -> None:
        self._stop()
        self._start()
        self.failed.clear()  # failed marks live in memory

    @invariant()
    def listing_agrees(self) -> None:
        listing = self.c.list_tasks()
        assert {t["supervisorTaskId"] for t in listing["tasks"]} == {
            k.supervisor_task_id for k in self.model}
        assert listing["files"] == len(self.model)
        assert listing["bytes"] == sum(len(v) for v in self.model.values())
        # Each task's own listing, paged two partials at a time: every key of the model once,
        # in (start, end, partitionId, subTaskId) order, with its size; figures on each page.
        for sup in SUP_NAMES:
            held = sorted((k.partition_id, k.sub_task_id, len(v)) for k, v in self.model.items()
                          if k.supervisor_task_id == sup)
            pages = self._task_pages(sup, limit=2)
            if not held:
                assert pages is None
                continue
            assert pages is not None
            got = [(p["partitionId"], s["subTaskId"], s["bytes"])
                   for page in pages for p in page["partitions"] for s in p["subTasks"]]
            assert got == held
            assert all(page["files"] == len(held) for page in pages)
            assert all(page["bytes"] == sum(n for _, _, n in held) for page in pages)

    def _task_pages(self, sup: str, limit: int) -> list[dict] | None:
        """GET /tasks/{sup} page by page (plain HTTP, not the client's paging)."""
        pages, cursor = [], None
        while True:
            query = {"limit": str(limit), **({"cursor": cursor} if cursor else {})}
            request = urllib.request.Request(
                f"{self.url}{PREFIX}/tasks/{sup}?{urllib.parse.urlencode(query)}",
                headers={"Authorization": f"Bearer {mint(self.secret, sup, Scope.READ, 600)}"})
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    page = json.load(resp)
            except urllib.error.HTTPError as err:
                assert err.code == 404 and not pages, err
                return None
            assert sum(len(p["subTasks"]) for p in page["partitions"]) <= limit
            pages.append(page)
            cursor = page["nextCursor"]
            if cursor is None:
                return pages
            assert len(pages) <= len(self.model) + 1, "the listing does not end"

    def teardown(self) -> None:
        self._stop()
        try:
            for loc in self.locations:  # nothing but packs (and no temp files)
                assert list((loc / ".tmp").iterdir()) == []
                assert all(p.suffix == ".pack" for p in files_under(loc))
            # The catalogs index exactly the model's keys, one row each, for every task
            # (a deleted one has none), each row the model's bytes.
            rows = [(sup, r) for sup in SUP_NAMES for loc in self.locations
                    for r in catalog_rows(loc, sup)]
            keys = [(sup, r[0], r[1], r[3]) for sup, r in rows]
            assert sorted(keys) == sorted((k.supervisor_task_id, k.sub_task_id, k.interval.start,
                                           k.partition_id) for k in self.model)
            for sup, r in rows:
                body = self.model[PartialKey(sup, r[0], INTERVAL, r[3])]
                assert (r[7], r[8]) == (len(body), crc32c(body))
            # Packs hold every partial of the model, and no more than was ever acknowledged
            # since the task's last delete (no bytes of refused or cut uploads); a deleted
            # task has no directory left.
            for sup in SUP_NAMES:
                packed = sum(p.stat().st_size for loc in self.locations
                             for p in pack_files(loc, sup))
                live = sum(committed_bytes(loc, sup) for loc in self.locations)
                assert live <= packed <= self.written.get(sup, 0)
                if sup not in self.written:
                    assert not any((loc / sup).exists() for loc in self.locations)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


StoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestStoreAgainstModel = StoreMachine.TestCase

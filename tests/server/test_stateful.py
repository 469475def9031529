"""A hypothesis state machine: a model dict against the real daemon over its HTTP API.

Rules: put (new or replacing), get, aggregate (all or some subtasks), paged reads, slab
uploads (docs/slab.md: new, sent again, conflicting, refused once sealed), shard reads
(single and batched, a key range cut at a random point, ``without`` some sealed subtasks),
seal, delete, restart (stop the daemon and start a new one on the same locations; or as
after a crash, the slabs' catalog rows lost and a temporary file left: rebuilt from the
files). After every step the daemon's task listing must agree with the model; every read
must equal the model byte for byte (or be NotFound exactly when the model holds nothing).
"""

from __future__ import annotations

import functools
import json
import secrets
import shutil
import sqlite3
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
from shuffled.client.slabs import SlabRead
from shuffled.crc import crc32c
from shuffled.errors import Conflict, NotFound, SealedConflict
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.server.embedded import EmbeddedDaemon
from shuffled.slab import build
from shuffled.slab.keys import KEY_COLUMN
from shuffled.tokens import Scope, mint
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, committed_bytes, data_size, files_under,
    pack_files, sample_table,
)
from tests.helpers.slabs import HOUR, make_slab, rows_table

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
SUP_NAMES = ["sup_a", "sup_b"]
SUPS = st.sampled_from(SUP_NAMES)
SUBS = ["s1", "s2", "s3"]
PIDS = st.sampled_from([0, 7])
SLAB_CHUNKS = 2  # a slab's rows fall in hours 0 and 1; hour 2 is a chunk nobody wrote
SlabKey = tuple[str, str, int, int]  # (sup, sub, slabId, attempt)
Row = tuple[bytes, int, str, str, int]  # (__key, __time, dim, user, count)


@functools.lru_cache(maxsize=None)
def slab_of(sub: str, slab_id: int, attempt: int, seed: int,
            ) -> tuple[build.Slab, bytes, tuple[Row, ...]]:
    """A small hashed slab (batches of 4 rows: shards cut batches, and runs of whole ones
    go out as file ranges), its bytes as sent, and its rows with their keys."""
    slab = make_slab(rows_table(4 + 7 * seed, chunks=SLAB_CHUNKS, seed=seed), sub=sub,
                     slab_id=slab_id, attempt=attempt, batch_rows=4)
    data = pa.ipc.open_stream(slab.data).read_all()
    rows = tuple(zip(*(data[c].to_pylist() for c in (KEY_COLUMN, "__time", "dim", "user",
                                                      "count"))))
    return slab, b"".join(slab.parts()), rows


def table_rows(table: pa.Table | None) -> list[tuple]:
    """A shard's rows (``__key`` dropped by the client), sorted."""
    if table is None:
        return []
    return sorted(zip(*(table[c].to_pylist() for c in ("__time", "dim", "user", "count"))))


class StoreMachine(RuleBasedStateMachine):
    """The model: ``{PartialKey: bytes}`` and ``{SlabKey: (bytes, rows)}``, what the daemon
    must hold."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="shuffled-stateful-"))
        self.locations = [self.tmp / "a", self.tmp / "b"]
        self.model: dict[PartialKey, bytes] = {}
        # Every slab stored (every attempt: a read serves the newest of each (sub, slab)).
        self.slabs: dict[SlabKey, tuple[bytes, tuple[Row, ...]]] = {}
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

    @rule(sup=SUPS, sub=st.sampled_from(SUBS), slab_id=st.integers(0, 1),
          attempt=st.none() | st.integers(0, 1), seed=st.integers(0, 3))
    def put_slab(self, sup: str, sub: str, slab_id: int, attempt: int | None,
                 seed: int) -> None:
        """``attempt`` None: a retried phase-1 task, the next attempt of a slab held of a
        subtask not sealed (picked by ``seed``; its rows may differ), whose reads then
        serve that one only; attempt 0 of (sub, slab_id) when there is none."""
        if attempt is None:
            sealed = self.sealed.get(sup, frozenset())
            unsealed = sorted(k for k in self.slabs if k[0] == sup and k[1] not in sealed)
            attempt = 0
            if unsealed:
                _, sub, slab_id, _ = unsealed[seed % len(unsealed)]
                attempt = 1 + max(k[3] for k in unsealed if k[1:3] == (sub, slab_id))
        slab, body, rows = slab_of(sub, slab_id, attempt, seed)
        key = (sup, sub, slab_id, attempt)
        client = self.as_(Scope.WRITE, sup)
        if sub in self.sealed.get(sup, ()):
            # Before the key's own check: a sealed subtask takes nothing, not even the same
            # bytes again (service.Slabs._admit).
            with pytest.raises(SealedConflict):
                client.put_slab(sup, slab)
            return
        held = self.slabs.get(key)
        if held is not None and held[0] != body:
            with pytest.raises(Conflict) as refused:  # same (sub, slab, attempt), other bytes
                client.put_slab(sup, slab)
            assert not isinstance(refused.value, SealedConflict)
            return
        ack = client.put_slab(sup, slab)
        assert ack == {"subTaskId": sub, "slabId": slab_id, "attempt": attempt,
                       "rows": len(rows), "size": len(body), "new": held is None}
        self.failed.discard(sup)  # a deleted task's id lives again with an upload
        self.slabs[key] = (body, rows)

    def _served(self, sup: str, subs: frozenset[str]) -> dict[tuple[str, int], tuple[Row, ...]]:
        """Per (sub, slab) of ``subs``: the rows of its newest attempt."""
        newest: dict[tuple[str, int], tuple[int, tuple[Row, ...]]] = {}
        for (s, sub, slab_id, attempt), (_, rows) in self.slabs.items():
            if s == sup and sub in subs:
                known = newest.get((sub, slab_id))
                if known is None or known[0] < attempt:
                    newest[(sub, slab_id)] = (attempt, rows)
        return {k: rows for k, (_, rows) in newest.items()}

    def _holds(self, sup: str) -> bool:
        return (any(k.supervisor_task_id == sup for k in self.model)
                or any(k[0] == sup for k in self.slabs))

    @rule(sup=SUPS, split=st.none() | st.integers(0, 2**32 - 1), batched=st.booleans(),
          without=st.lists(st.sampled_from(SUBS), max_size=2, unique=True))
    def read_shards(self, sup: str, split: int | None, batched: bool,
                    without: list[str]) -> None:
        """Every chunk (the last one nobody wrote), its keys cut in two at ``split``: one
        batched read leaving ``without`` out, or a GET per shard."""
        cut = None if split is None else split.to_bytes(4, "big")
        ranges = [(None, None)] if cut is None else [(None, cut), (cut, None)]
        shards = [(Interval(c * HOUR, (c + 1) * HOUR), lo, hi)
                  for c in range(SLAB_CHUNKS + 1) for lo, hi in ranges]
        client = self.as_(Scope.READ, sup)
        if not batched:
            without = []  # the GET has no ``without``

        def read() -> list[SlabRead]:
            if batched:  # "trim": false: the client drops the rows outside each range
                return client.read_shards(sup, shards, without=without)
            return [client.read_shard(sup, *shard) for shard in shards]

        sealed = self.sealed.get(sup)
        if sup in self.failed or sealed is None:
            # Deleted (failed), or not sealed: 409; a task holding nothing: 404.
            expected = Conflict if sup in self.failed or self._holds(sup) else NotFound
            with pytest.raises(expected) as refused:
                read()
            assert not isinstance(refused.value, SealedConflict)
            return
        served = self._served(sup, sealed - set(without))
        reads = read()
        assert len(reads) == len(shards)
        for (interval, lo, hi), got in zip(shards, reads):
            want = sorted(r[1:] for rows in served.values() for r in rows
                          if interval.start <= r[1] < interval.end
                          and (lo is None or r[0] >= lo) and (hi is None or r[0] < hi))
            assert got.slabs == len(served)
            assert got.rows == len(want)
            assert table_rows(got.table) == want

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
        # The subtasks that sent anything: partials or slabs.
        subs = frozenset({k.sub_task_id for k in self.model if k.supervisor_task_id == sup}
                         | {k[1] for k in self.slabs if k[0] == sup})
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
        self.slabs = {k: v for k, v in self.slabs.items() if k[0] != sup}
        self.written.pop(sup, None)
        self.sealed.pop(sup, None)
        self.failed.add(sup)

    @rule(crash=st.booleans())
    def restart(self, crash: bool) -> None:
        self._stop()
        if crash:
            self._crash_slabs()
        self._start()
        self.failed.clear()  # failed marks live in memory

    def _crash_slabs(self) -> None:
        """As a crash between a slab's rename and its catalog row (and one mid-write) leaves
        the locations: every slab row gone, a temporary file beside the slabs. The daemon
        rebuilds the rows from the files at start and removes the temporary one."""
        for loc in self.locations:
            db = loc / ".shuffled" / "catalog.sqlite"
            if db.exists():
                conn = sqlite3.connect(db)
                try:
                    with conn:
                        conn.execute("DELETE FROM slabs")
                finally:
                    conn.close()
            for sup in SUP_NAMES:
                if (loc / sup).is_dir():
                    (loc / sup / ".s1.0.0.slab.0123456789ab.tmp").write_bytes(b"SHS1 cut")

    @invariant()
    def listing_agrees(self) -> None:
        listing = self.c.list_tasks()
        # A task's figures count its partials and its slabs (every attempt stored, each
        # slab's bytes as sent); its partitions list the partials only.
        assert {t["supervisorTaskId"] for t in listing["tasks"]} == {
            s for s in SUP_NAMES if self._holds(s)}
        assert listing["files"] == len(self.model) + len(self.slabs)
        assert listing["bytes"] == (sum(len(v) for v in self.model.values())
                                    + sum(len(body) for body, _ in self.slabs.values()))
        for task in listing["tasks"]:
            sup = task["supervisorTaskId"]
            slabs = [body for k, (body, _) in self.slabs.items() if k[0] == sup]
            partials = [v for k, v in self.model.items() if k.supervisor_task_id == sup]
            assert task["files"] == len(partials) + len(slabs)
            assert task["bytes"] == sum(map(len, partials)) + sum(map(len, slabs))
        # Each task's own listing, paged two partials at a time: every key of the model once,
        # in (start, end, partitionId, subTaskId) order, with its size; figures on each page.
        for sup in SUP_NAMES:
            held = sorted((k.partition_id, k.sub_task_id, len(v)) for k, v in self.model.items()
                          if k.supervisor_task_id == sup)
            slabs = [body for k, (body, _) in self.slabs.items() if k[0] == sup]
            pages = self._task_pages(sup, limit=2)
            if not held and not slabs:
                assert pages is None
                continue
            assert pages is not None
            got = [(p["partitionId"], s["subTaskId"], s["bytes"])
                   for page in pages for p in page["partitions"] for s in p["subTasks"]]
            assert got == held
            assert all(page["files"] == len(held) + len(slabs) for page in pages)
            assert all(page["bytes"] == sum(n for _, _, n in held) + sum(map(len, slabs))
                       for page in pages)

    @invariant()
    def shards_agree(self) -> None:
        """Every chunk of every sealed task, whole, in batched reads: the newest attempt of
        each slab of the sealed subtasks, every row once; and again without the first
        sealed subtask that sent slabs (the rule above cuts key ranges and leaves any
        subtasks out; this one sees each step's effect on the reads)."""
        chunks = [Interval(c * HOUR, (c + 1) * HOUR) for c in range(SLAB_CHUNKS + 1)]
        for sup, sealed in self.sealed.items():
            if sup in self.failed:
                continue
            with_slabs = sorted(sealed & {k[1] for k in self.slabs if k[0] == sup})
            for without in ({*with_slabs[:1]}, set()):  # the full read last: it stays cached
                served = self._served(sup, sealed - without)
                reads = self.as_(Scope.READ, sup).read_shards(
                    sup, [(chunk, None, None) for chunk in chunks], without=without)
                for chunk, got in zip(chunks, reads):
                    assert got.slabs == len(served)
                    assert table_rows(got.table) == sorted(
                        r[1:] for rows in served.values() for r in rows
                        if chunk.start <= r[1] < chunk.end)

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
            for loc in self.locations:  # nothing but packs and slabs (and no temp files)
                assert list((loc / ".tmp").iterdir()) == []
                assert all(p.suffix in (".pack", ".slab") for p in files_under(loc))
            # Slabs: exactly the model's, one file and one catalog row each, the bytes sent.
            files = {(p.parent.name, p.name): p.read_bytes() for loc in self.locations
                     for p in files_under(loc) if p.suffix == ".slab"}
            assert files == {(sup, f"{sub}.{slab}.{attempt}.slab"): body
                             for (sup, sub, slab, attempt), (body, _) in self.slabs.items()}
            slab_rows = [r for loc in self.locations for r in self._slab_rows(loc)]
            assert sorted(r[:4] for r in slab_rows) == sorted(self.slabs)
            for r in slab_rows:
                body, held = self.slabs[r[:4]]
                assert r[4:] == (len(body), len(held))
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
                packed = sum(data_size(p) for loc in self.locations
                             for p in pack_files(loc, sup))
                live = sum(committed_bytes(loc, sup) for loc in self.locations)
                assert live <= packed <= self.written.get(sup, 0)
                if sup not in self.written and not any(k[0] == sup for k in self.slabs):
                    assert not any((loc / sup).exists() for loc in self.locations)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @staticmethod
    def _slab_rows(loc: Path) -> list[tuple]:
        """A location's slab rows: (sup, sub, slab, attempt, size, rows)."""
        db = loc / ".shuffled" / "catalog.sqlite"
        if not db.exists():
            return []
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return conn.execute(
                "SELECT sup, sub, slab, attempt, size, rows FROM slabs").fetchall()
        finally:
            conn.close()


StoreMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestStoreAgainstModel = StoreMachine.TestCase


@pytest.mark.daemon
def test_a_slab_upload_revives_a_deleted_task(daemon_url: str) -> None:
    """Finding (the state machine's slab rules): a slab upload to a deleted task was
    stored but did not revive the task, as a partial's does (Seals.mark_deleted: a task id
    used again starts a new life with its first upload): its seal and shard reads stayed
    refused as "marked failed" until mark_ttl passed or the daemon restarted."""
    slab, _, rows = slab_of("s1", 0, 0, 1)
    with ShuffleClient(daemon_url) as client:
        assert client.put_slab("rerun", slab)["new"] is True
        client.delete_task("rerun")
        assert client.put_slab("rerun", slab)["new"] is True  # taken: the id lives again
        client.seal("rerun", ["s1"])  # was Conflict: "rerun was marked failed (or deleted)"
        read = client.read_shard("rerun", Interval(0, HOUR), None, None)
        assert read.rows == sum(1 for r in rows if r[1] < HOUR)

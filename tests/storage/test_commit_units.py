"""The write path's pieces alone, with fakes (issue 38; as dask tests each buffer): the
group commit (:mod:`shuffled.storage.commit.group`), the landing horizon
(:mod:`shuffled.storage.commit.horizon`) and admission (:mod:`shuffled.storage.write.admission`). The
daemon-level tests (test_packs, test_sealed_and_quotas) cover them together; these pin each
rule where it is made."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest

from shuffled.errors import QuotaExceeded, SealedConflict
from shuffled.protocol import Interval, PartialKey
from shuffled.storage.write.admission import Admission, Pending, Quota
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.ondisk.records import CatalogRow
from shuffled.storage.commit.group import GroupCommit
from shuffled.storage.commit.horizon import Horizon

# --- fakes -----------------------------------------------------------------------------


class FakePack:
    def __init__(self) -> None:
        self.syncs = 0
        self.dead = False
        self.fresh = True

    def sync(self) -> None:
        self.syncs += 1


@dataclass
class FakeMeta:
    key: tuple[Any, ...]
    generation: int

    def row(self) -> CatalogRow:
        return CatalogRow(*self.key, self.generation, *([0] * 11))


@dataclass
class FakeCatalog:
    """Records each transaction; ``gate`` (if set) holds a commit until released;
    ``fail`` makes the next commit raise."""

    path: str = "fake"
    commits: list[list[tuple[Any, ...]]] = field(default_factory=list)
    gate: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    fail: OSError | None = None

    def commit(self, rows: list[tuple[Any, ...]], *, recorded: bool = False) -> list[int | None]:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        self.commits.append(list(rows))
        return [None] * len(rows)


def meta(sub: str, generation: int) -> FakeMeta:
    return FakeMeta(("sup", 0, 86_400_000, 0, sub), generation)


@pytest.fixture
def writer() -> Any:
    with ThreadPoolExecutor(1) as pool:
        yield pool


# --- group commit ----------------------------------------------------------------------


async def test_submissions_of_one_loop_turn_share_one_group(writer: ThreadPoolExecutor) -> None:
    catalog = FakeCatalog()
    commit = GroupCommit(0, catalog, writer, fsync=True)
    shared, other = FakePack(), FakePack()
    futures = [commit.submit([meta("a", 1).row()], shared, [False]),
               commit.submit([meta("b", 2).row(), meta("c", 3).row()], shared, [False, False]),
               commit.submit([meta("d", 4).row()], other, [False])]
    landed = await asyncio.wait_for(asyncio.gather(*futures), 10)
    assert [len(x) for x in landed] == [1, 2, 1]
    assert len(catalog.commits) == 1 and len(catalog.commits[0]) == 4  # one transaction
    assert (shared.syncs, other.syncs) == (1, 1)  # one sync per pack, not per partial
    assert commit.groups == 1 and commit.partials == 4
    assert not shared.fresh and not other.fresh


async def test_what_arrives_during_a_commit_goes_as_the_next_group(
        writer: ThreadPoolExecutor) -> None:
    catalog = FakeCatalog(gate=threading.Event())
    commit = GroupCommit(0, catalog, writer, fsync=False)
    pack = FakePack()
    first = commit.submit([meta("a", 1).row()], pack, [False])
    await asyncio.to_thread(catalog.entered.wait, 10)  # the first group is committing
    later = [commit.submit([meta(s, g).row()], pack, [False])
             for g, s in enumerate("bcd", start=2)]
    assert catalog.gate is not None
    catalog.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 10)
    assert [len(rows) for rows in catalog.commits] == [1, 3]
    assert pack.syncs == 0  # fsync off


async def test_a_failed_group_fails_each_waiter_and_kills_its_packs(
        writer: ThreadPoolExecutor) -> None:
    catalog = FakeCatalog(fail=OSError(28, "No space left on device"))
    commit = GroupCommit(0, catalog, writer, fsync=True)
    packs = [FakePack(), FakePack()]
    futures = [commit.submit([meta(s, g).row()], p, [False])
               for g, (s, p) in enumerate(zip("ab", packs))]
    results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), 10)
    assert all(isinstance(r, OSError) and r.errno == 28 for r in results)
    assert all(p.dead for p in packs)  # their tails' state is unknown: never appended to
    again = commit.submit([meta("c", 9).row()], FakePack(), [False])
    assert len(await asyncio.wait_for(again, 10)) == 1  # the next group goes on


# --- the landing horizon ---------------------------------------------------------------


def test_generations_increase_across_a_restart_whose_clock_is_behind() -> None:
    horizon = Horizon()
    far = 10 ** 30  # a generation stored by a daemon whose clock was far ahead
    horizon.observe(far)
    taken = horizon.take(3)
    assert list(taken) == [far + 1, far + 2, far + 3]
    assert horizon.next() == far + 4


def test_the_horizon_is_the_lowest_generation_still_in_flight() -> None:
    horizon = Horizon()
    assert horizon.horizon is None
    horizon.hold([5, 3, 9])
    assert horizon.horizon == 3
    horizon.land([5])  # landing out of order moves nothing while 3 is in flight
    assert horizon.horizon == 3
    horizon.land([3])
    assert horizon.horizon == 9
    horizon.land([9])
    assert horizon.horizon is None


# --- admission -------------------------------------------------------------------------


@dataclass
class FakeSeals:
    sealed: dict[str, frozenset[str]] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    revived: list[str] = field(default_factory=list)

    def refuses_uploads(self, sup: str) -> bool:
        return sup in self.failed

    def revive(self, sup: str) -> None:
        self.revived.append(sup)


def key(sub: str, sup: str = "sup") -> PartialKey:
    return PartialKey(sup, sub, Interval(0, 86_400_000), 0)


def admission(seals: FakeSeals, quota: Quota = Quota(), deleting: frozenset[str] = frozenset(),
              ) -> tuple[Admission, TaskBook]:
    book = TaskBook(lambda: 0.0)
    return Admission(seals=seals, book=book, quota=quota,
                     deleting=deleting.__contains__), book


def test_a_sealed_subtask_is_refused_and_the_others_are_taken() -> None:
    checks, _ = admission(FakeSeals(sealed={"sup": frozenset({"a"})}))
    with pytest.raises(SealedConflict):
        checks.admit(key("a"), 10, Pending())
    checks.admit(key("recomputed"), 10, Pending())  # the recovery path's new subtask
    assert isinstance(checks.may_commit(key("a")), SealedConflict)
    assert checks.may_commit(key("recomputed")) is None


def test_a_failed_or_deleting_task_takes_nothing() -> None:
    checks, _ = admission(FakeSeals(failed={"sup"}), deleting=frozenset({"gone"}))
    with pytest.raises(SealedConflict, match="marked failed"):
        checks.admit(key("a"), 1, Pending())
    with pytest.raises(SealedConflict, match="DELETE of gone is not finished"):
        checks.admit(key("a", sup="gone"), 1, Pending())
    assert checks.may_commit_all("other", [key("a", sup="other")]) is None  # nothing refuses


def test_quotas_count_what_is_held_and_what_the_request_added() -> None:
    checks, book = admission(FakeSeals(), Quota(bytes=100, partials=3))
    entry = book.ensure("sup")
    entry.bytes, entry.files = 60, 1
    pending = Pending()
    checks.admit(key("a"), 30, pending)  # 90 bytes, 2 partials
    with pytest.raises(QuotaExceeded) as over:
        checks.admit(key("b"), 20, pending)  # 110 bytes
    assert over.value.details["quota"] == "bytes"
    checks.admit(key("c"), 5, pending)  # 95 bytes, 3 partials
    with pytest.raises(QuotaExceeded) as over:
        checks.admit(key("d"), 1, pending)  # a fourth partial
    assert over.value.details["quota"] == "partials"
    # a driver may ask for a tighter quota, never a looser one
    assert checks.ask("sup", Quota(bytes=1000, partials=2)) == Quota(bytes=100, partials=2)

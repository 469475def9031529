"""Whether an upload may be stored: sealed means sealed, failed takes nothing, quotas.

Checked when a partial is added (before its body is read: a refusal costs nothing) and
again just before its commit (:meth:`Admission.may_commit`), because a seal or a fail can
land while a body is on its way: what the seal committed never changes.

- A partial of a **sealed subtask** is refused with 409 ``sealed``: after ``PUT /seal``
  its bytes are the committed ones, read by phase 2. Partials of other subtasks of a
  sealed task are still taken: the recovery path uploads the recomputed subtasks there
  and then extends the seal with them (docs/failover.md); they stay invisible to paged
  reads until then.
- Every upload to a **failed** task (``POST /fail``) is refused with 409. A DELETE is
  not a verdict: an upload after it starts the task id's new life (a rerun of a spec
  with a fixed ``taskId``), and its reads stop answering "failed".
- **Quotas**: per task and daemon, bytes held and partials held (``task_quota_bytes``,
  ``task_quota_partials``; the driver may ask for tighter ones from the spec's
  ``tuningConfig``, never looser). Over quota is 507 ``quota_exceeded`` naming the quota
  and the task; other tasks are not affected. The check counts what is held plus what
  the same request added before (commits of other requests of the task in flight are not
  counted: concurrent requests can pass a quota by at most what they carry). A partial
  replacing one of the same key counts as new until it commits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shuffled.errors import QuotaExceeded, SealedConflict
from shuffled.protocol import PartialKey
from shuffled.storage.tasks.book import TaskBook
from shuffled.storage.ondisk.records import TaskEntry
from shuffled.storage.tasks.seals import Seals

MAX_ASKED = 100_000  # tasks whose asked-for quotas are remembered (oldest forgotten)


def _over_bytes(sup: str, held: int, limit: int) -> QuotaExceeded:
    return QuotaExceeded(
        f"task {sup} would hold {held} bytes on this daemon, over its quota of {limit} "
        "(task_quota_bytes / tuningConfig shuffleQuotaBytes); nothing was stored",
        quota="bytes", limit=limit, supervisorTaskId=sup)


@dataclass(frozen=True)
class Quota:
    """Most bytes and partials a task may hold here; 0 is no limit."""

    bytes: int = 0
    partials: int = 0

    def tighter(self, other: Quota) -> Quota:
        def low(a: int, b: int) -> int:
            return min(a, b) if a and b else (a or b)
        return Quota(low(self.bytes, other.bytes), low(self.partials, other.partials))


@dataclass
class Pending:
    """What one request added for a task and has not committed yet."""

    bytes: int = 0
    partials: int = 0


class Admission:
    """The rules above, over the seals, the task book and the operator's quota."""

    def __init__(self, *, seals: Seals, book: TaskBook, quota: Quota,
                 deleting: Callable[[str], bool] = lambda sup: False) -> None:
        self.seals = seals
        self.deleting = deleting
        self.book = book
        self.quota = quota
        self._asked: OrderedDict[str, Quota] = OrderedDict()

    def ask(self, sup: str, quota: Quota) -> Quota:
        """The task's driver asks for ``quota``; returns the one in force (the tighter of
        it and the operator's)."""
        self._asked[sup] = quota
        self._asked.move_to_end(sup)
        while len(self._asked) > MAX_ASKED:
            self._asked.popitem(last=False)
        return self.of(sup)

    def forget(self, sup: str) -> None:
        self._asked.pop(sup, None)

    def of(self, sup: str) -> Quota:
        asked = self._asked.get(sup)
        return self.quota if asked is None else self.quota.tighter(asked)

    def used(self, entry: TaskEntry) -> float:
        """The share of its quota ``entry``'s task holds (the larger of bytes and
        partials; 0 without a quota)."""
        quota = self.of(entry.supervisor_task_id)
        return max(entry.bytes / quota.bytes if quota.bytes else 0.0,
                   entry.files / quota.partials if quota.partials else 0.0)

    def _sealed_or_failed(self, key: PartialKey) -> None:
        sup = key.supervisor_task_id
        if self.seals.refuses_uploads(sup):
            raise SealedConflict(f"{sup} was marked failed by its supervisor: it takes no "
                                 "more uploads; nothing was stored", supervisorTaskId=sup)
        if self.deleting(sup):
            raise SealedConflict(f"a DELETE of {sup} is not finished here (a location could "
                                 "not remove its data yet): it takes no uploads until it is; "
                                 "retry the DELETE; nothing was stored", supervisorTaskId=sup)
        sealed = self.seals.sealed.get(sup)
        if sealed is not None and key.sub_task_id in sealed:
            raise SealedConflict(
                f"subtask {key.sub_task_id} of {sup} is sealed: its committed partials never "
                "change; nothing was stored (a retry of an attempt that already committed "
                "has nothing to do)", supervisorTaskId=sup, subTaskId=key.sub_task_id)

    def admit(self, key: PartialKey, size: int | None, pending: Pending) -> None:
        """Raise SealedConflict or QuotaExceeded if ``key`` (``size`` bytes, if known) may
        not be added; else count it in ``pending`` (the request's own tally)."""
        self._sealed_or_failed(key)
        self.seals.revive(key.supervisor_task_id)
        sup = key.supervisor_task_id
        quota = self.of(sup)
        if quota.bytes or quota.partials:
            entry = self.book.get(sup)
            held_bytes = (entry.bytes if entry else 0) + pending.bytes + (size or 0)
            held_partials = (entry.files if entry else 0) + pending.partials + 1
            if quota.bytes and held_bytes > quota.bytes:
                raise _over_bytes(sup, held_bytes, quota.bytes)
            if quota.partials and held_partials > quota.partials:
                raise QuotaExceeded(
                    f"task {sup} would hold {held_partials} partial segments on this daemon, "
                    f"over its quota of {quota.partials} (task_quota_partials / tuningConfig "
                    "shuffleQuotaPartials); nothing was stored", quota="partials",
                    limit=quota.partials, supervisorTaskId=sup)
        pending.bytes += size or 0
        pending.partials += 1

    def grow(self, key: PartialKey, more: int, pending: Pending) -> None:
        """A streamed body of unknown size grew by ``more`` bytes: check the byte quota."""
        sup = key.supervisor_task_id
        quota = self.of(sup)
        pending.bytes += more
        if quota.bytes:
            entry = self.book.get(sup)
            held = (entry.bytes if entry else 0) + pending.bytes
            if held > quota.bytes:
                raise _over_bytes(sup, held, quota.bytes)

    def may_commit_all(self, sup: str, keys: Sequence[PartialKey],
                       ) -> list[SealedConflict | None] | None:
        """:meth:`may_commit` of each of ``keys`` (all of task ``sup``), or None when no
        seal or fail of the task could refuse any: checked once for a whole submission."""
        if (not self.seals.refuses_uploads(sup) and not self.seals.sealed.get(sup)
                and not self.deleting(sup)):
            return None
        return [self.may_commit(key) for key in keys]

    def may_commit(self, key: PartialKey) -> SealedConflict | None:
        """The refusal for a written partial about to commit, if a seal or fail landed
        while it was on its way."""
        try:
            self._sealed_or_failed(key)
        except SealedConflict as exc:
            return exc
        return None

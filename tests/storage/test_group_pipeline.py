"""The group commit's pipeline (fsync on): a group's packs are synced while the group
before it is in its catalog transaction, and the order crash safety rests on holds: a
group's rows are committed only after its own packs are synced, groups commit in order,
and a failed sync fails its group alone."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from shuffled.storage.commit.group import GroupCommit

Events = list[tuple[str, str]]


class FakePack:
    def __init__(self, name: str, events: Events, lock: threading.Lock,
                 fail: bool = False) -> None:
        self.name, self.events, self.lock, self.fail = name, events, lock, fail
        self.dead, self.fresh = False, True

    def sync(self) -> None:
        time.sleep(0.02)
        with self.lock:
            self.events.append(("synced", self.name))
        if self.fail:
            raise OSError(5, "Input/output error")


class FakeCatalog:
    def __init__(self, events: Events, lock: threading.Lock) -> None:
        self.events, self.lock = events, lock

    def commit(self, rows: list[Any], *, recorded: bool = False) -> list[int | None]:
        with self.lock:
            self.events.append(("begin", ",".join(r.key for r in rows)))
        time.sleep(0.05)  # long enough for the next group's sync to run meanwhile
        with self.lock:
            self.events.append(("committed", ",".join(r.key for r in rows)))
        return [None] * len(rows)


def meta(name: str) -> Any:
    row = SimpleNamespace(key=name)
    return SimpleNamespace(row=lambda: row)


def test_groups_overlap_but_rows_follow_their_syncs_in_order() -> None:
    events: Events = []
    lock = threading.Lock()
    writer = ThreadPoolExecutor(1)

    async def main() -> list[Any]:
        commit = GroupCommit(0, FakeCatalog(events, lock), writer,  # type: ignore[arg-type]
                             fsync=True)
        a = commit.submit([meta("a").row()], FakePack("a", events, lock), [False])  # type: ignore[arg-type]
        await asyncio.sleep(0.04)  # a is synced and in its transaction now
        b = commit.submit([meta("b").row()], FakePack("b", events, lock), [False])  # type: ignore[arg-type]
        c = commit.submit([meta("c").row()], FakePack("c", events, lock, fail=True),  # type: ignore[arg-type]
                          [False])
        got = await asyncio.gather(a, b, c, return_exceptions=True)
        await commit.idle()
        commit.close()
        return got

    try:
        got = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        writer.shutdown(wait=True)
    assert [type(g) for g in got] == [list, OSError, OSError]  # b shares c's group
    at = {e: i for i, e in enumerate(events)}
    assert at[("synced", "a")] < at[("begin", "a")]
    # b and c were synced while a's transaction ran: the pipeline overlapped them...
    assert at[("synced", "b")] < at[("committed", "a")]
    # ... and their group, whose sync failed, committed nothing.
    assert not any(e[0] == "begin" and "b" in e[1] for e in events)

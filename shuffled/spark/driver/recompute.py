"""Recovering from lost daemons: what to recompute, and the committed list after it.

The driver knows where every committed partial lives (phase 1's commit messages name its
daemons), so a lost daemon costs exactly the phase-1 subtasks (Spark partitions) that had
partials there with no surviving replica, and of those only the lost (interval, partitionId)
keys. A recompute re-runs such a subtask on its own input split with ``only_keys`` set:
it uploads only those keys, under a new attempt id. The committed list then drops EVERY
partial of that subtask for those keys (on any daemon: a subtask's rows for a key may be
spread over several flushes) and takes the recompute's partials instead, so each input
row of those keys is counted exactly once (docs/exactly-once.md, "Lost daemons").
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shuffled.spark.records import Partial, PartitionId

T = TypeVar("T")

Key = tuple[int, int]  # (interval start, partitionId): a phase-2 partition
__all__ = ["Key", "PartitionId", "Recovery", "cut", "lost_keys", "on_daemons", "replace",
           "spread"]


def lost_keys(partials: Iterable[Partial], gone: Collection[str],
              wanted: Collection[PartitionId] | None = None) -> dict[int, frozenset[Key]]:
    """Per phase-1 subtask, the keys it must recompute: those of its partials whose every
    replica is on a ``gone`` daemon (and, if given, in a ``wanted`` partition)."""
    out: dict[int, set[Key]] = {}
    for p in partials:
        if wanted is not None and p.key not in wanted:
            continue
        if all(r in gone for r in p.replicas):
            out.setdefault(p.task, set()).add((p.start, p.partition))
    return {t: frozenset(keys) for t, keys in sorted(out.items())}


def replace(partials: list[Partial], only: dict[int, frozenset[Key]],
            recomputed: list[Partial]) -> list[Partial]:
    """The committed list after a recompute: each recomputed subtask's partials of its
    recomputed keys dropped (wherever they are), the recompute's partials added."""
    kept = [p for p in partials if (p.start, p.partition) not in only.get(p.task, frozenset())]
    return kept + recomputed


def cut(items: Sequence[T], pieces: int) -> list[list[T]]:
    """``items`` in at most ``pieces`` consecutive, non-empty, nearly equal parts."""
    pieces = max(1, min(pieces, len(items)))
    size, extra = divmod(len(items), pieces)
    out, at = [], 0
    for n in range(pieces):
        step = size + (1 if n < extra else 0)
        out.append(list(items[at:at + step]))
        at += step
    return [p for p in out if p]


def spread(splits: Sequence[Sequence[T]], subtasks: Sequence[int],
           cores: int) -> tuple[list[int], list[list[T]]]:
    """``subtasks``' input splits as Spark tasks, each subtask's cut into pieces so that a
    recompute of fewer subtasks than cores uses every core (each piece sends all of its
    rows; the pieces together are the subtask's rows): each piece's subtask, and the
    pieces."""
    pieces = max(1, cores // max(len(subtasks), 1))
    ids: list[int] = []
    work: list[list[T]] = []
    for t in subtasks:
        for part in cut(splits[t], pieces):
            ids.append(t)
            work.append(part)
    return ids, work


def on_daemons(partials: Iterable[Partial]) -> dict[str, set[str]]:
    """The committed subtask ids on each daemon (what the seal names)."""
    out: dict[str, set[str]] = {}
    for p in partials:
        for server in p.replicas:
            out.setdefault(server, set()).add(p.sub)
    return out


@dataclass
class Recovery:
    """What the task report says of recoveries (``recovery``)."""

    lost: dict[str, str] = field(default_factory=dict)  # daemon -> why it counts as gone
    rounds: list[dict[str, Any]] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)  # restarts ridden through
    # daemons the heartbeats declared lost while the job ran (told to the survivors, so
    # merge tasks stop reading them), with how long each had been silent then
    declared: dict[str, float] = field(default_factory=dict)
    # daemons whose share the merge tasks read from deep storage (through a survivor)
    from_tier: set[str] = field(default_factory=set)

    def round(self, when: str, started: float, **facts: Any) -> None:
        self.rounds.append({"when": when, "seconds": round(time.monotonic() - started, 3),
                            **facts})

    @property
    def recomputed(self) -> int:
        return sum(int(r.get("subtasksRecomputed", 0)) for r in self.rounds)

    def to_json(self) -> dict[str, Any]:
        return {"lostDaemons": self.lost, "rounds": self.rounds,
                "subtasksRecomputed": self.recomputed,
                # lost daemons whose share phase 2 read from deep storage instead
                "readFromTier": sorted(self.from_tier),
                "partitionsRemerged": sum(int(r.get("partitionsRemerged", 0))
                                          for r in self.rounds),
                "restartsRiddenThrough": self.restarts,
                "declaredLost": self.declared}

"""A phase-1 task's chunk statistics bound for one reducer of the late plan, as columns.

A task merges its slabs' statistics per time chunk (:class:`.shardplan.ChunkStats`) and
sends them through Spark's shuffle to the reducers that plan the chunks
(:func:`shuffled.spark.driver.late.run_phase1`). Sent one record a chunk, each was pickled
and unpickled alone: their numpy arrays, key slices and frozensets were ~a sixth of a range
spec's phase-1 CPU on the Druid shape (3,652 day chunks a task; docs/benchmarks.md). A
:class:`StatsBlock` holds every chunk a task sends one reducer as a few arrays, pickled as
plain bytes, and gives the chunks' statistics back as they went in (:meth:`StatsBlock.stats`).

The block crosses only the shuffle of one job, between the same code on both sides: it is
never stored, so it carries no version mark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shuffled.slab import sketch
from shuffled.spark.phase2.shardplan import ChunkStats, keys_as_bytes, keys_from_bytes

_NO_REGS = np.zeros(0, np.uint8)


@dataclass(frozen=True)
class StatsBlock:
    """Row ``i`` is one chunk's statistics (:class:`ChunkStats`), in columns."""

    starts: np.ndarray  # int64
    ends: np.ndarray  # int64
    rows: np.ndarray  # int64
    sketched: np.ndarray  # bool: the row has registers (numShards' have none)
    regs: np.ndarray  # uint8, (sketched rows, 2^11), in row order
    counts: np.ndarray  # int64: each row's sampled keys, in row order in ``keys``
    keys: pa.Array  # binary
    hashes: np.ndarray  # uint64, beside ``keys``
    rates: np.ndarray  # float64
    servers: tuple[tuple[str, ...], ...]

    @classmethod
    def of(cls, stats: Sequence[ChunkStats]) -> StatsBlock:
        sketched = np.array([len(st.regs) > 0 for st in stats], bool)
        regs = (np.stack([st.regs for st in stats if len(st.regs)]) if sketched.any()
                else np.zeros((0, sketch.REGISTERS), np.uint8))
        with_keys = [st.keys for st in stats if len(st.keys)]
        return cls(np.array([st.start for st in stats], np.int64),
                   np.array([st.end for st in stats], np.int64),
                   np.array([st.rows for st in stats], np.int64), sketched, regs,
                   np.array([len(st.keys) for st in stats], np.int64),
                   pa.concat_arrays(with_keys) if with_keys else pa.array([], pa.binary()),
                   (np.concatenate([st.hashes for st in stats]).astype(np.uint64)
                    if stats else np.zeros(0, np.uint64)),
                   np.array([st.rate for st in stats], np.float64),
                   tuple(tuple(sorted(st.servers)) for st in stats))

    def __len__(self) -> int:
        return len(self.starts)

    def stats(self) -> Iterator[ChunkStats]:
        """Each row as the :class:`ChunkStats` it was made of (registers and hashes as
        views, keys as slices)."""
        at = np.concatenate([[0], np.cumsum(self.counts)]).tolist()
        reg = np.cumsum(self.sketched) - 1
        servers: dict[tuple[str, ...], frozenset[str]] = {}
        for i, (start, end, rows, sketched, rate) in enumerate(zip(
                self.starts.tolist(), self.ends.tolist(), self.rows.tolist(),
                self.sketched.tolist(), self.rates.tolist(), strict=True)):
            a, b = at[i], at[i + 1]
            names = self.servers[i]
            held = servers.get(names)
            if held is None:
                held = servers[names] = frozenset(names)
            yield ChunkStats(start, end, rows, self.regs[reg[i]] if sketched else _NO_REGS,
                             self.keys.slice(a, b - a), self.hashes[a:b], held, rate)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (_unpickle, (self.starts.tobytes(), self.ends.tobytes(), self.rows.tobytes(),
                            self.sketched.tobytes(), self.regs.tobytes(),
                            self.counts.tobytes(), *keys_as_bytes(self.keys),
                            self.hashes.tobytes(), self.rates.tobytes(), self.servers))


def _unpickle(starts: bytes, ends: bytes, rows: bytes, sketched: bytes, regs: bytes,
              counts: bytes, offsets: bytes, data: bytes, hashes: bytes, rates: bytes,
              servers: tuple[tuple[str, ...], ...]) -> StatsBlock:
    keys = keys_from_bytes(offsets, data)
    return StatsBlock(np.frombuffer(starts, np.int64), np.frombuffer(ends, np.int64),
                      np.frombuffer(rows, np.int64), np.frombuffer(sketched, bool),
                      np.frombuffer(regs, np.uint8).reshape(-1, sketch.REGISTERS),
                      np.frombuffer(counts, np.int64), keys, np.frombuffer(hashes, np.uint64),
                      np.frombuffer(rates, np.float64), servers)


def by_reducer(stats: Iterable[ChunkStats], reducers: int,
               reducer_of: Callable[[int], int]) -> Iterator[tuple[int, StatsBlock]]:
    """``stats`` as one block per reducer (``reducer_of(chunk start) % reducers``), those
    with chunks only."""
    mine: dict[int, list[ChunkStats]] = {}
    for st in stats:
        mine.setdefault(reducer_of(st.start) % reducers, []).append(st)
    for r, group in sorted(mine.items()):
        yield r, StatsBlock.of(group)

"""A phase-1 task's input read in time order, and how far that order has got.

Druid-shaped input mostly arrives in time order within each file, but a task often reads
several files that each span the whole interval (one per day of logs is the exception,
one per writer process the rule). Read one after the other, every time chunk comes back
once per file, and every flush of the task's combiner holds a slice of every chunk: a
partial per chunk and shard per flush (comparison 7: 26,664 partials for 7,304 segments).

:class:`TimeOrdered` reads the task's files side by side instead, always taking the next
batch with the earliest time chunk (a merge at batch granularity, one batch held per file),
and says below which chunk the input has moved past (:attr:`TimeOrdered.watermark`): the
least chunk of the batches not yet taken. When each file is time-ordered no later row
falls below it, so the combiner can flush the chunks below it whole and keep the rest
(:meth:`.tasks._Task.flush_past`). It is only a hint: a row below it (unordered input)
makes one more partial of its chunk, which phase 2 merges like any other.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from shuffled.spark.rows.rollup import CHUNK

#: Files read side by side (one prepared batch held for each): more are read in turns.
AT_ONCE = 4


class TimeOrdered:
    """Iterate the tables of ``readers`` (one per file), earliest least chunk first."""

    def __init__(self, readers: Sequence[Iterator[pa.Table]], at_once: int = AT_ONCE) -> None:
        self._waiting = list(readers)
        self._at_once = max(1, at_once)
        self._heads: list[tuple[int, int, pa.Table, Iterator[pa.Table]]] = []
        self._seq = 0  # ties: the file opened first goes first

    @property
    def watermark(self) -> int | None:
        """The least time chunk any row not yet yielded may have, if the files are in time
        order; None once every file is read (every chunk is past)."""
        if self._waiting:  # files not opened yet may start anywhere
            return -(1 << 63)
        return min((h[0] for h in self._heads), default=None)

    def _pull(self, reader: Iterator[pa.Table]) -> None:
        for table in reader:
            if table.num_rows:
                least = pc.min(table.column(CHUNK)).as_py()
                self._heads.append((least, self._seq, table, reader))
                self._seq += 1
                return

    def __iter__(self) -> Iterator[pa.Table]:
        while self._heads or self._waiting:
            while self._waiting and len(self._heads) < self._at_once:
                self._pull(self._waiting.pop(0))
            if not self._heads:
                continue
            at = min(range(len(self._heads)), key=lambda i: self._heads[i][:2])
            _, _, table, reader = self._heads.pop(at)
            self._pull(reader)  # its next batch, so the watermark knows where it stands
            yield table

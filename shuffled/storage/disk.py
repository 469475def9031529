"""One storage location and what it owns, as one object: its directory, lock, health and
counters (:class:`~.location.Location`), and its catalog (:class:`~.catalog.Catalog`); its
writer thread is the one :meth:`~.threads.IoThreads.on_writer` runs for its ``index``.

The store builds one per configured location and hands the list to the parts that need a
location's catalog (the committer, removal, the start, slabs, deep storage), instead of
two lists kept in step by index."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shuffled.storage.catalog import Catalog
from shuffled.storage.location import Location


@dataclass(eq=False)
class Disk:
    location: Location
    catalog: Catalog

    @property
    def index(self) -> int:
        return self.location.index

    @property
    def path(self) -> Path:
        return self.location.path

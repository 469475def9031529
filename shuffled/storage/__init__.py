"""Partial-segment storage: locations, placement, packs, catalog, group commit, recovery.

Only :class:`Store` is the public face; the modules below it each own one idea.
"""

from shuffled.storage.index import PartialMeta, TaskEntry
from shuffled.storage.location import Location
from shuffled.storage.store import Store

__all__ = ["Location", "PartialMeta", "Store", "TaskEntry"]

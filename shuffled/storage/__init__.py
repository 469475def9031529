"""Partial-segment storage: locations, placement, packs, catalog, group commit, recovery.

The public face is :class:`Store` and what readers of its data need: the facts of a stored
partial (:class:`PartialMeta`), a task's figures (:class:`TaskEntry`), a location
(:class:`Location`), the stored partial as its Arrow stream (:mod:`shuffled.storage.read.streams`) and the page
plan of paged reads (:mod:`shuffled.storage.read.pageplan`). The modules below it each own one idea.
"""

from shuffled.storage.write.admission import Quota
from shuffled.storage.ondisk.arrowfile import EOS, SchemaMessage
from shuffled.storage.deep.stats import DeepStats
from shuffled.storage.location import Location
from shuffled.storage.read.pageplan import MAX_TOKEN, SEALED_FLAG, Page, page_crc, plan_page
from shuffled.storage.ondisk.records import PartialMeta, TaskEntry
from shuffled.storage.store import Store
from shuffled.storage.read.streams import (FastPlan, Reencoder, byte_range, fast_plan, stream_pieces,
                                      unified_schema)
from shuffled.storage.write.outcomes import Outcome, PutResult, Rejected
from shuffled.storage.write.upload import SMALL, BulkSession
from shuffled.storage.tasks.verdicts import MAX_LOST

__all__ = ["EOS", "MAX_LOST", "MAX_TOKEN", "DeepStats", "SMALL", "BulkSession", "FastPlan", "Location", "Outcome", "Page",
           "PartialMeta", "PutResult", "Quota", "Rejected", "Reencoder", "SEALED_FLAG", "SchemaMessage", "Store", "TaskEntry", "byte_range",
           "fast_plan", "page_crc", "plan_page", "stream_pieces", "unified_schema"]

"""Partial-segment storage: locations, placement, packs, catalog, group commit, recovery.

The public face is :class:`Store` and what readers of its data need: the facts of a stored
partial (:class:`PartialMeta`), a task's figures (:class:`TaskEntry`), a location
(:class:`Location`), the stored partial as its Arrow stream (:mod:`.streams`) and the page
plan of paged reads (:mod:`.pageplan`). The modules below it each own one idea.
"""

from shuffled.storage.admission import Quota
from shuffled.storage.arrowfile import EOS, SchemaMessage
from shuffled.storage.deep.stats import DeepStats
from shuffled.storage.location import Location
from shuffled.storage.pageplan import MAX_TOKEN, SEALED_FLAG, Page, page_crc, plan_page
from shuffled.storage.records import PartialMeta, TaskEntry
from shuffled.storage.store import Store
from shuffled.storage.streams import (FastPlan, Reencoder, byte_range, fast_plan, stream_pieces,
                                      unified_schema)
from shuffled.storage.outcomes import Outcome, PutResult, Rejected
from shuffled.storage.upload import SMALL, BulkSession
from shuffled.storage.verdicts import MAX_LOST

__all__ = ["EOS", "MAX_LOST", "MAX_TOKEN", "DeepStats", "SMALL", "BulkSession", "FastPlan", "Location", "Outcome", "Page",
           "PartialMeta", "PutResult", "Quota", "Rejected", "Reencoder", "SEALED_FLAG", "SchemaMessage", "Store", "TaskEntry", "byte_range",
           "fast_plan", "page_crc", "plan_page", "stream_pieces", "unified_schema"]

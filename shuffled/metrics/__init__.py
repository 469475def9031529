"""Prometheus metrics on an injected registry, with scrape-time collectors for disk state."""

from shuffled.metrics.collectors import StoreCollector
from shuffled.metrics.families import Cut, LongPoll, Metrics, OverlordOutcome, Served

__all__ = ["Cut", "LongPoll", "Metrics", "OverlordOutcome", "Served", "StoreCollector"]

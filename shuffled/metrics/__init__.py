"""Prometheus metrics on an injected registry, with scrape-time collectors for disk state."""

from shuffled.metrics.collectors import StoreCollector
from shuffled.metrics.families import Metrics

__all__ = ["Metrics", "StoreCollector"]

"""The tier's counters, read by the metrics at scrape time (light: no object-store or
cipher import, so a daemon without deep storage never loads them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DeepStats:
    """Counters for the metrics (read at scrape time)."""

    offloaded_bytes: int = 0  # plaintext pack and slab bytes copied to the tier
    offloaded_packs: int = 0
    offloaded_slabs: int = 0  # slab files copied (docs/slab.md)
    offloaded_tasks: int = 0
    read_bytes: int = 0  # pack bytes read back from the tier
    evicted_bytes: int = 0  # local pack (and read-back cache) bytes removed to free space
    evicted_packs: int = 0
    spilled_packs: int = 0  # packs of unsealed tasks copied early to be evicted
    errors: int = 0
    orphans_removed: int = 0  # task prefixes the orphan sweep removed (:mod:`.orphans`)

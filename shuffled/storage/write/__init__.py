"""Writes: an upload session, the packs it holds, placement over the locations,
admission (seals, quotas), uploads in flight, and their outcomes."""

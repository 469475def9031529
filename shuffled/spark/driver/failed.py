"""The error an ingestion that could not complete raises (the CLI's exit code 1)."""

from __future__ import annotations

from shuffled.errors import ShuffleError


class IngestionFailed(ShuffleError):
    """The ingestion could not complete (e.g. too many parse exceptions, lost data)."""

    code = "ingestion_failed"

"""What a write hands the group commit: a validated partial segment in a pack, waiting
for its generation (the record crossing from :mod:`shuffled.storage.write` to
:mod:`shuffled.storage.commit`)."""

from __future__ import annotations

from dataclasses import dataclass

from shuffled.protocol import PartialKey
from shuffled.storage.ondisk import arrowfile
from shuffled.storage.ondisk.packs import Pack
from shuffled.storage.ondisk.records import PartialMeta


@dataclass(slots=True, kw_only=True)
class Written:
    """A validated partial segment in a pack, waiting for its commit."""

    pack: Pack
    offset: int  # where its body starts in the pack
    size: int  # of the whole stream
    crc: int  # of the whole stream
    facts: arrowfile.ArrowFacts
    schema_at: int  # where its schema message is in the pack
    stored: int  # bytes appended to the pack for it (a new schema message included)

    def meta(self, key: PartialKey, generation: int, location: int, created: float) -> PartialMeta:
        """Its catalog facts, once it has a generation."""
        f = self.facts
        return PartialMeta(
            key=key, generation=generation, location=location, path=self.pack.path,
            offset=self.offset, size=self.size, rows=f.rows, crc=self.crc,
            schema_len=f.schema_len, schema_crc=f.schema_crc, body_crc=f.body_crc,
            has_dictionaries=f.has_dictionaries, created=created, pack=self.pack.number,
            schema_at=self.schema_at, stored=self.stored)

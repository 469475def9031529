"""What became of each partial segment of an upload session (:meth:`shuffled.storage.write.upload.BulkSession.finish`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shuffled.errors import ShuffleError
from shuffled.protocol import PartialStatus
from shuffled.storage.ondisk.records import PartialMeta


@dataclass(frozen=True, slots=True)
class PutResult:
    """A partial segment stored (durable): its facts, and whether it was the first
    generation of its key or replaced one."""

    meta: PartialMeta
    status: Literal[PartialStatus.CREATED, PartialStatus.REPLACED]

    @property
    def replaced(self) -> bool:
        return self.status is PartialStatus.REPLACED


@dataclass(frozen=True, slots=True)
class Rejected:
    """A partial segment the store refused (nothing of it kept), and why."""

    error: ShuffleError
    status: Literal[PartialStatus.REJECTED] = PartialStatus.REJECTED


#: What became of one partial of a session, in the order the partials were added.
Outcome = PutResult | Rejected

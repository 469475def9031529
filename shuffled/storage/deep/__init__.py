"""Deep storage: an object-store tier behind the local locations (docs/deep-storage.md).

Sealed tasks are copied there in the background, encrypted per task; reads of a pack that
is no longer local come back from it. :class:`~.service.DeepStorage` is what the store
holds; the modules below it each own one idea: :mod:`.tier` (the object store),
:mod:`.crypt` (AES-256-GCM per task), :mod:`.journal` (what is offloaded, durable),
:mod:`.offload` (the background copier), :mod:`.manifest` (a task's rows in the tier),
:mod:`.readback` (a pack fetched back), :mod:`.instance` (this daemon's stable name),
:mod:`.evict` (a full location's offloaded packs removed, unsealed ones spilled first),
:mod:`.orphans` (the sweeper's pass over prefixes no daemon will remove).
"""

from typing import TYPE_CHECKING, Any

from shuffled.storage.deep.stats import DeepStats

if TYPE_CHECKING:
    from shuffled.storage.deep.service import DeepStorage

__all__ = ["DeepStats", "DeepStorage"]


def __getattr__(name: str) -> Any:
    # DeepStorage pulls in pyarrow.fs (S3) and cryptography, ~11 MiB of a daemon's RSS:
    # loaded only by a daemon configured with deep storage.
    if name == "DeepStorage":
        from shuffled.storage.deep.service import DeepStorage
        return DeepStorage
    raise AttributeError(name)

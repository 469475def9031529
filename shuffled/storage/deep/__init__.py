"""Deep storage: an object-store tier behind the local locations (docs/deep-storage.md).

Sealed tasks are copied there in the background, encrypted per task; reads of a pack that
is no longer local come back from it. :class:`~.service.DeepStorage` is what the store
holds; the modules below it each own one idea: :mod:`.tier` (the object store),
:mod:`.crypt` (AES-256-GCM per task), :mod:`.journal` (what is offloaded, durable),
:mod:`.offload` (the background copier), :mod:`.manifest` (a task's rows in the tier),
:mod:`.readback` (a pack fetched back), :mod:`.instance` (this daemon's stable name).
"""

from shuffled.storage.deep.offload import DeepStats
from shuffled.storage.deep.service import DeepStorage

__all__ = ["DeepStats", "DeepStorage"]

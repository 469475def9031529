"""Round-robin placement over the healthy locations with room (the seed's rule)."""

from __future__ import annotations

from collections.abc import Sequence

from shuffled.errors import InsufficientStorage
from shuffled.storage.location import Location


class RoundRobin:
    """Hands out locations in turn, skipping unhealthy or full ones."""

    def __init__(self, locations: Sequence[Location]) -> None:
        self._locations = list(locations)
        self._next = 0

    def choose(self, size: int, exclude: frozenset[int] = frozenset()) -> Location:
        """The next location able to take ``size`` more bytes; InsufficientStorage if none."""
        count = len(self._locations)
        for step in range(count):
            loc = self._locations[(self._next + step) % count]
            if loc.index in exclude or not loc.has_room(size):
                continue
            self._next = (loc.index + 1) % count
            return loc
        states = ", ".join(
            f"{loc.path} ({'unhealthy: ' + (loc.last_error or '') if not loc.healthy else 'full'})"
            for loc in self._locations
        )
        raise InsufficientStorage(
            f"no location can take {size} more bytes: {states}; free space, raise max sizes "
            f"or add locations",
            size=size,
        )

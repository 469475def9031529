"""Building blocks of spec parsing: SpecError and a JSON-object walker that tracks paths."""

from __future__ import annotations

import difflib
import re
from typing import Any

from shuffled.errors import BadRequest, ShuffleError
from shuffled.protocol import Interval

_NAME_RE = re.compile(r"[^\x00-\x1f/\\]{1,255}")


class SpecError(BadRequest):
    """An ingestion spec field is unsupported or invalid; ``path`` is its JSON path."""

    code = "invalid_spec"

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}", path=path)
        self.path = path


# Keys Druid accepts that only tune Druid's own processes: accepted and ignored here.
IGNORED: dict[str, set[str]] = {
    "tuningConfig": {
        "maxRowsInMemory", "maxTotalRows", "maxRowsPerSegment",
        "numShards", "partitionDimensions", "indexSpec", "indexSpecForIntermediatePersists",
        "maxPendingPersists", "reportParseExceptions", "pushTimeout",
        "segmentWriteOutMediumFactory", "maxRetry", "taskStatusCheckPeriodMs",
        "chatHandlerTimeout", "chatHandlerNumRetries", "logParseExceptions",
        "maxSavedParseExceptions", "maxColumnsToMerge", "awaitSegmentAvailabilityTimeoutMillis",
        "maxAllowedLockCount", "splitHintSpec", "skipBytesInMemoryOverheadCheck",
        "numPersistThreads", "maxNumSegmentsToMerge", "totalNumMergeTasks",
        "maxNumConcurrentSubTasks", "maxParseExceptions", "forceGuaranteedRollup",
        "partitionsSpec", "type",
    },
}


class JsonObject:
    """A JSON object being consumed: remembers its path and which keys were read."""

    def __init__(self, value: Any, path: str, *, required: bool = True) -> None:
        if value is None and not required:
            value = {}
        if not isinstance(value, dict):
            raise SpecError(path, "must be a JSON object")
        self.value: dict[str, Any] = value
        self.path = path
        self.seen: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        value = self.value.get(key)
        return default if value is None else value

    def missing(self, key: str) -> SpecError:
        """``key`` is required; if a key given here looks like a misspelling of it, say so."""
        given = [k for k in self.value if k not in self.seen and k != key]
        close = difflib.get_close_matches(key, given, n=1, cutoff=0.75)
        if close:
            return SpecError(self.at(key), f"is required; {self.path} has {close[0]!r} "
                                           f"instead: rename it to {key!r}")
        return SpecError(self.at(key), "is required")

    def obj(self, key: str, *, required: bool = True) -> JsonObject:
        if required and self.value.get(key) is None:
            raise self.missing(key)
        self.seen.add(key)
        return JsonObject(self.value.get(key), self.at(key), required=required)

    def str_(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.get(key, default)
        if value is None:
            if required:
                raise self.missing(key)
            return None
        if not isinstance(value, str) or not value:
            raise SpecError(self.at(key), f"must be a non-empty string, not {value!r}")
        return value

    def bool_(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.at(key), f"must be true or false, not {value!r}")
        return value

    def int_(self, key: str, default: int | None, minimum: int = 1) -> int | None:
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise SpecError(self.at(key), f"must be an integer >= {minimum}, not {value!r}")
        return value

    def done(self, ignored: set[str] | frozenset[str] = frozenset()) -> None:
        """Refuse every key that was neither read nor listed as ignored."""
        for key in self.value:
            if key not in self.seen and key not in ignored:
                close = difflib.get_close_matches(key, sorted(self.seen), n=1, cutoff=0.75)
                raise SpecError(self.at(key), "is not a supported field" + (
                    f" (a misspelling of {close[0]!r}?)" if close else ""))


def choice(obj: JsonObject, key: str, allowed: tuple[str, ...] | list[str], default: str | None) -> str:
    value = obj.str_(key, default, required=default is None)
    assert value is not None
    if value not in allowed:
        raise SpecError(obj.at(key), f"{value!r} is not supported (one of {', '.join(allowed)})")
    return value


def col_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value.startswith("__"):
        raise SpecError(path, f"{value!r} is not a valid column name")
    return value


def interval_list(raw: Any, path: str) -> list[Interval]:
    """Druid's list of ``start/end`` intervals at ``path``, in the order given; a bad one
    is refused at its own index."""
    if not isinstance(raw, list):
        raise SpecError(path, "must be a list of 'start/end' strings")
    out = []
    for i, text in enumerate(raw):
        try:
            out.append(Interval.parse_druid(text))
        except ShuffleError as exc:
            raise SpecError(f"{path}[{i}]", exc.message) from None
    return out

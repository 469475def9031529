"""Domain errors shared by every layer.

Each error carries a machine-readable ``code`` and the HTTP status the server maps it to, so
the one error->HTTP mapping (``shuffled.server.errors``) stays a table lookup and the client
can rebuild the same exception from a JSON error body.
"""

from __future__ import annotations

from typing import Any


class ShuffleError(Exception):
    """Base of every error shuffled raises on purpose."""

    status: int = 500
    code: str = "internal"
    #: Whether an answer of this status without a known code is rebuilt as this class
    #: (a 502 from a proxy is no :class:`BadTierCopy`).
    by_status: bool = True

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_json(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": message, "code": code, ...details}``."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        body.update(self.details)
        return body


class BadRequest(ShuffleError):
    """The request is malformed: bad id, interval, partitionId, body or header."""

    status = 400
    code = "bad_request"


class InvalidId(BadRequest):
    code = "invalid_id"


class InvalidInterval(BadRequest):
    code = "invalid_interval"


class InvalidPartitionId(BadRequest):
    code = "invalid_partition_id"


class InvalidBody(BadRequest):
    """The body is not a complete Arrow IPC stream."""

    code = "invalid_body"


class UnsupportedEncoding(ShuffleError):
    """An upload with a ``Content-Encoding``: its Content-Length and Content-Digest would
    describe the encoded bytes, not the partial stored (RFC 9110 section 15.5.16)."""

    status = 415
    code = "unsupported_encoding"


class DigestMismatch(BadRequest):
    """The bytes do not match the CRC32C the sender (or the store) declared."""

    code = "digest_mismatch"


class Unauthorized(ShuffleError):
    status = 401
    code = "unauthorized"


class Forbidden(ShuffleError):
    """A valid token that does not open this task or this right (RFC 9110 section 15.5.4)."""

    status = 403
    code = "forbidden"


class RequestTimeout(ShuffleError):
    """The client stopped sending a request body (RFC 9110 section 15.5.9)."""

    status = 408
    code = "request_timeout"


class NotFound(ShuffleError):
    status = 404
    code = "not_found"


class Conflict(ShuffleError):
    """The request contradicts stored state (e.g. partial segments with incompatible schemas)."""

    status = 409
    code = "conflict"


class TaskFailed(ShuffleError):
    """The supervisor task was marked failed (or deleted) on the daemon: its partitions will
    never read as complete. A paged reader gets this instead of an empty partition."""

    status = 409
    code = "task_failed"


class TooLarge(ShuffleError):
    status = 413
    code = "too_large"


class RangeNotSatisfiable(ShuffleError):
    status = 416
    code = "range_not_satisfiable"


class Overloaded(ShuffleError):
    """Too much work in flight; retry after ``retry_after`` seconds."""

    status = 503
    code = "overloaded"

    def __init__(self, message: str, retry_after: int = 1, **details: Any) -> None:
        super().__init__(message, retry_after=retry_after, **details)
        self.retry_after = retry_after


class InsufficientStorage(ShuffleError):
    """No location can take the data (all full, over max size, or unhealthy)."""

    status = 507
    code = "insufficient_storage"


class QuotaExceeded(InsufficientStorage):
    """The task holds as much on this daemon as its quota allows (``quota`` names which)."""

    code = "quota_exceeded"


class SealedConflict(Conflict):
    """An upload to a sealed subtask or a failed task: what the seal committed never
    changes, and a failed task takes nothing more."""

    code = "sealed"


class ReadAgain(Conflict):
    """A paged reader passed partials of an attempt the seal left out: the pages it holds
    are not the committed data. Discard them and read again from token 0."""

    code = "read_again"


class LocationFailed(InsufficientStorage):
    """A disk location failed mid-operation; it has been marked unhealthy."""

    code = "location_failed"


class CorruptData(ShuffleError):
    """A stored partial segment no longer matches the CRC32C recorded when it was written
    (bit rot, tampering). Not retried: the same bytes would come back."""

    status = 500
    code = "corrupt_data"


class BadTierCopy(ShuffleError):
    """A lost daemon's copy in deep storage, served through ``/peers/{instance}``, is
    missing an object its manifest names or holds one that does not check: that copy is
    unusable (the reader needs another source; asking again returns the same). 502: the
    daemon answering is a gateway to the tier, and not the one that lost the bytes."""

    status = 502
    code = "bad_tier_copy"
    by_status = False


class ConfigError(ShuffleError):
    """A setting is invalid; the message names the setting."""

    code = "config"


class LocationLocked(ConfigError):
    """Another process holds the exclusive lock on a location."""

    code = "location_locked"


_BY_CODE: dict[str, type[ShuffleError]] = {}


def _register(cls: type[ShuffleError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(ShuffleError)


def error_from_json(status: int, body: dict[str, Any] | None) -> ShuffleError:
    """Rebuild the domain error a server answered with (used by the client)."""
    body = dict(body or {})
    message = str(body.pop("error", f"HTTP {status}"))
    code = str(body.pop("code", ""))
    cls = _BY_CODE.get(code)
    if cls is None or cls.status != status:
        cls = next((c for c in _BY_CODE.values() if c.status == status and c.by_status),
                   ShuffleError)
    if cls is Overloaded:
        retry_after = int(body.pop("retry_after", 1) or 1)
        return Overloaded(message, retry_after=retry_after, **body)
    err = cls(message, **body)
    if cls is ShuffleError:
        err.status = status
    return err


def error_codes() -> tuple[str, ...]:
    """Every ``code`` a :class:`ShuffleError` can carry (the ``reason`` label of rejected
    requests), so that metrics can export each at zero before it first happens."""
    seen: list[str] = []
    stack: list[type[ShuffleError]] = [ShuffleError]
    while stack:
        cls = stack.pop()
        if cls.__module__ == __name__ and cls.code not in seen:  # not the client's own
            seen.append(cls.code)
        stack.extend(cls.__subclasses__())
    return tuple(sorted(seen))

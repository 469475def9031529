"""The I/O boundary: OSError errno -> domain error with a remediation message."""

from __future__ import annotations

import errno

from shuffled.errors import (
    BadRequest,
    LocationFailed,
    NotFound,
    Overloaded,
    ShuffleError,
)

# Errors that say the disk itself is bad (or read-only): the location is taken out of service.
UNHEALTHY_ERRNOS = frozenset({errno.EIO, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENXIO,
                              errno.ENODEV, errno.ESTALE})
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def translate(exc: OSError, where: str, doing: str) -> ShuffleError:
    """Map ``exc`` raised while ``doing`` something at location ``where`` to a domain error."""
    code = exc.errno
    name = errno.errorcode.get(code or 0, "OSError")
    reason = exc.strerror or str(exc)
    if code in FULL_ERRNOS:
        # The location is taken out of service (see marks_unhealthy), so a retry of the same
        # request goes to another location: a retryable ``location_failed``, not a plain 507.
        return LocationFailed(
            f"location {where} ran out of space while {doing} ({name}); it takes no writes "
            f"until a health probe finds free space there again; free space there, lower its "
            f"max size, or add a location",
            location=where,
        )
    if code in (errno.EMFILE, errno.ENFILE):
        return Overloaded(
            f"too many open files while {doing} ({name}); raise the daemon's `ulimit -n`",
            retry_after=1,
        )
    if code == errno.ENAMETOOLONG:
        # The request's ids made a path the file system refuses: the client's problem,
        # never a reason to take the disk out of service.
        return BadRequest(f"ids too long for the file system at {where} ({name})")
    if code == errno.ENOENT:
        return NotFound(f"file vanished while {doing}", location=where)
    return LocationFailed(
        f"location {where} failed while {doing}: {reason} ({name}); it is taken out of "
        f"service until a health probe succeeds; check the disk and its permissions",
        location=where,
    )


def marks_unhealthy(exc: OSError) -> bool:
    """Whether ``exc`` means the location should stop taking writes until a probe succeeds:
    a failing or read-only disk, and a full one (ENOSPC/EDQUOT: the file system filled up
    under us, whatever the accounting said)."""
    return exc.errno not in (errno.ENOENT, errno.EMFILE, errno.ENFILE, errno.ENAMETOOLONG)

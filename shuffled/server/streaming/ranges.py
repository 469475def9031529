"""HTTP range requests for one stored file (RFC 9110 section 14 and 13.1.5 If-Range)."""

from __future__ import annotations

from dataclasses import dataclass

from shuffled.errors import RangeNotSatisfiable


@dataclass(frozen=True, slots=True)
class ByteRange:
    start: int
    length: int

    def content_range(self, size: int) -> str:
        return f"bytes {self.start}-{self.start + self.length - 1}/{size}"


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The single range ``header`` selects, or None to send the whole file.

    Multiple ranges and syntactically invalid headers are ignored (a server MAY ignore
    Range, RFC 9110 section 14.2); a valid but unsatisfiable range raises 416.
    """
    if not header:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    first, last = first.strip(), last.strip()
    if (first and not first.isdigit()) or (last and not last.isdigit()) or not (first or last):
        return None
    if not first:  # suffix range: the last N bytes (section 14.1.2)
        suffix = int(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(f"range {header!r} selects nothing of {size} bytes",
                                      size=size)
        start = max(0, size - suffix)
        return ByteRange(start, size - start)
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if last and int(last) < start:
        return None  # invalid range-spec: ignore the header
    if start >= size:
        raise RangeNotSatisfiable(f"range {header!r} starts past the end ({size} bytes)",
                                  size=size)
    return ByteRange(start, end - start + 1)


def if_range_allows(header: str | None, etag: str) -> bool:
    """RFC 9110 section 13.1.5: apply Range only if If-Range names the current entity tag.

    Our validators are strong ETags; a date in If-Range cannot be strong here, so it
    means 'send the whole representation'.
    """
    if header is None:
        return True
    return header.strip() == etag

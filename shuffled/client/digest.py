"""CRC32C helpers for the client: one-shot and incremental, plus the comparison that names the key."""

from __future__ import annotations

from typing import Any

from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch
from shuffled.protocol import crc_hex, parse_crc32c

CHUNK = 1 << 20  # 1 MiB: read/hash/write granularity


def crc32c_of(data: bytes | bytearray | memoryview) -> int:
    """The CRC32C (Castagnoli) of ``data`` as an unsigned 32-bit integer."""
    return crc32c(data)


class RunningCrc:
    """CRC32C computed incrementally over chunks as they arrive."""

    __slots__ = ("value", "length")

    def __init__(self) -> None:
        self.value = 0
        self.length = 0

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        """Fold ``chunk`` into the running CRC."""
        self.value = crc32c(chunk, self.value)
        self.length += len(chunk) if not isinstance(chunk, memoryview) else chunk.nbytes

    def reset(self) -> None:
        """Start over (the server restarted the representation from byte 0)."""
        self.value = 0
        self.length = 0


def check_crc(actual: int, expected: int | None, what: str) -> None:
    """Raise DigestMismatch naming ``what`` unless ``expected`` is None or equals ``actual``."""
    if expected is not None and actual != expected:
        raise DigestMismatch(
            f"{what}: CRC32C of the received bytes is {crc_hex(actual)}, "
            f"the server declared {crc_hex(expected)}",
            key=what,
            expected=crc_hex(expected),
            actual=crc_hex(actual),
        )


def crc_from_json(value: Any) -> int | None:
    """Best-effort reading of a ``crc32c`` field in a server JSON answer.

    Accepts an integer, an 8-digit hex string, or an RFC 9530 ``crc32c=:...:`` member;
    anything else gives None (not comparable, so not compared).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & 0xFFFFFFFF if 0 <= value <= 0xFFFFFFFF else None
    if isinstance(value, str):
        text = value.strip()
        if len(text) == 8:
            try:
                return int(text, 16)
            except ValueError:
                return None
        if text.lower().startswith("crc32c="):
            try:
                return parse_crc32c(text)
            except DigestMismatch:
                return None
    return None

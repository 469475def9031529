"""Bulk uploads (shuffled.framing, shuffled.framing2) in tests: keys on the test day, partials,
posting a batch to a test daemon and reading one partial back, and decoding a whole bulk body
with the shared functions as the daemon does."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from shuffled import framing, framing2
from shuffled.crc import crc32c
from shuffled.protocol import Interval, PartialKey
from tests.conftest import DAY, PREFIX, arrow_bytes, sample_table

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
MEDIA = {"Content-Type": framing.MEDIA_TYPE}


def key(sub: str, sup: str = "sup", pid: int = 0, day: int = 0) -> PartialKey:
    return PartialKey(sup, sub, Interval(INTERVAL.start + day * 86_400_000,
                                         INTERVAL.end + day * 86_400_000), pid)


def partials(sup: str, n: int = 6) -> list[tuple[PartialKey, bytes]]:
    return [(key(f"s{i % 3}", sup, pid=i % 2, day=i // 3), arrow_bytes(sample_table(20 + i, i)))
            for i in range(n)]


async def post(daemon: TestClient, sup: str, body: bytes, **headers: str) -> tuple[int, Any]:
    resp = await daemon.post(f"{PREFIX}/tasks/{sup}/partials", data=body,
                             headers={**MEDIA, **headers})
    return resp.status, await resp.json()


async def get(daemon: TestClient, k: PartialKey) -> tuple[int, bytes]:
    resp = await daemon.get(f"{PREFIX}/tasks/{k.supervisor_task_id}/{k.sub_task_id}/partition",
                            params={"start": k.interval.start_iso, "end": k.interval.end_iso,
                                    "partitionId": str(k.partition_id)})
    return resp.status, await resp.read()


def frames_of(body: bytes, sup: str = "sup") -> list[tuple[PartialKey | None, Any, bytes]]:
    """Decode a whole bulk body (format 1 or 2) with the shared functions: (key, crc, stream)
    per partial (format 2: the whole stream its schema and body stand for, and its CRC32C),
    (None, count, b"") for the END frame. The daemon does the same incrementally."""
    if body[:4] == framing2.MAGIC:
        return _frames_2(body, sup)
    out: list[tuple[PartialKey | None, Any, bytes]] = []
    at = 0
    while at < len(body):
        frame = framing.parse_fixed(body[at: at + framing.FIXED_LEN])
        at += framing.FIXED_LEN
        header = framing.parse_header(frame, body[at: at + frame.header_len])
        at += frame.header_len
        if frame.end:
            out.append((None, framing.end_count(header), b""))
            continue
        key, crc = framing.data_key(sup, header)
        out.append((key, crc, body[at: at + frame.body_len]))
        at += frame.body_len
    return out


def _frames_2(body: bytes, sup: str) -> list[tuple[PartialKey | None, Any, bytes]]:
    out: list[tuple[PartialKey | None, Any, bytes]] = []
    schemas: dict[int, bytes] = {}
    at = 0
    while at < len(body):
        frame = framing2.parse_fixed(body[at: at + framing.FIXED_LEN])
        at += framing.FIXED_LEN
        header = body[at: at + frame.header_len]
        framing2.check_header(frame, header)
        at += frame.header_len
        data = body[at: at + frame.body_len]
        at += frame.body_len
        if frame.kind == framing2.END:
            out.append((None, framing2.number(frame, header), b""))
        elif frame.kind == framing2.SCHEMA:
            schemas[framing2.number(frame, header)] = data
        else:
            key, schema_id, crc = framing2.partial_of(sup, header)
            assert crc32c(data) == crc
            whole = data if schema_id == framing2.WHOLE else (
                schemas[schema_id] + data + b"\xff\xff\xff\xff\0\0\0\0")
            out.append((key, crc32c(whole), whole))
    return out

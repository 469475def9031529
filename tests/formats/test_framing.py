"""The bulk framing (shuffled.framing) as pure functions over bytes: the documented byte
layout, round trips, and every way a frame is refused (docs/bulk-upload.md)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuffled import framing
from shuffled.crc import crc32c
from shuffled.framing import FramingError
from shuffled.protocol import Interval, PartialKey
from tests.helpers.bulk import frames_of

DAY = Interval.parse("2018-01-01T00:00:00.000Z", "2018-01-02T00:00:00.000Z")
KEY = PartialKey("sup", "s1", DAY, 3)


def with_header(header: dict[str, Any] | bytes, *, flags: int = 0, body_len: int = 0,
                magic: bytes = framing.MAGIC, reserved: bytes = b"\0\0\0") -> bytes:
    """A frame head with a correct header CRC around any header (to test what follows)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    fixed = framing.FIXED.pack(magic, flags, reserved, len(raw), body_len)
    return fixed + crc32c(raw, crc32c(fixed)).to_bytes(4, "little") + raw


def check(head: bytes) -> tuple[framing.Frame, dict[str, Any]]:
    frame = framing.parse_fixed(head[: framing.FIXED_LEN])
    return frame, framing.parse_header(frame, head[framing.FIXED_LEN:])


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def test_data_frame_layout_is_the_documented_table() -> None:
    body = b"arrow bytes"
    head = framing.encode(KEY, len(body), crc32c(body))
    assert head[0:4] == b"SHB1" and head[4] == 0 and head[5:8] == b"\0\0\0"
    header_len = struct.unpack_from("<I", head, 8)[0]
    assert struct.unpack_from("<Q", head, 12)[0] == len(body)
    assert len(head) == 24 + header_len == framing.FIXED_LEN + header_len
    assert struct.unpack_from("<I", head, 20)[0] == crc32c(head[0:20] + head[24:])
    header = json.loads(head[24:].decode("utf-8"))
    assert header == {"subTaskId": "s1", "start": "2018-01-01T00:00:00.000Z",
                      "end": "2018-01-02T00:00:00.000Z", "partitionId": 3,
                      "crc32c": f"{crc32c(body):08x}"}


def test_end_frame_layout() -> None:
    head = framing.encode_end(7)
    assert head[4] == framing.FLAG_END and struct.unpack_from("<Q", head, 12)[0] == 0
    frame, header = check(head)
    assert frame.end and header == {"count": 7} and framing.end_count(header) == 7


ids = st.from_regex(r"[A-Za-z0-9_:-][A-Za-z0-9_.:-]{0,20}", fullmatch=True)


@given(subs=st.lists(st.tuples(ids, st.integers(0, 2**31 - 1),
                               st.integers(0, 10**13), st.binary(max_size=64)), max_size=6))
def test_round_trip(subs: list[tuple[str, int, int, bytes]]) -> None:
    parts = [(PartialKey("sup", sub, Interval(start, start + 3_600_000), pid), body)
             for sub, pid, start, body in subs]
    stream = b"".join(framing.encode(k, len(b), crc32c(b)) + b for k, b in parts)
    decoded = frames_of(stream + framing.encode_end(len(parts)))
    assert decoded[:-1] == [(k, crc32c(b), b) for k, b in parts]
    assert decoded[-1] == (None, len(parts), b"")


def test_crc32c_is_optional_and_either_case() -> None:
    header = {"subTaskId": "s1", "start": DAY.start_iso, "end": DAY.end_iso, "partitionId": 3}
    assert framing.data_key("sup", header) == (KEY, None)
    assert framing.data_key("sup", {**header, "crc32c": "00ABcdEF"})[1] == 0x00ABCDEF


@pytest.mark.parametrize("head, mentions", [
    (with_header({"count": 0}, magic=b"SHB2"), "version '2'"),
    (with_header({"count": 0}, magic=b"PK\x03\x04"), "does not start"),
    (with_header({"count": 0}, flags=0x03), "flags"),
    (with_header({"count": 0}, flags=0x80), "flags"),
    (with_header({"count": 0}, reserved=b"\0\1\0"), "reserved"),
    (with_header(b"", flags=1), "header length 0"),
    (with_header({"count": 0}, flags=1, body_len=5), "END frame carries a body"),
])
def test_fixed_part_refusals(head: bytes, mentions: str) -> None:
    with pytest.raises(FramingError, match=mentions) as info:
        framing.parse_fixed(head[: framing.FIXED_LEN])
    assert info.value.status == 400 and info.value.code == "bad_framing"


def test_header_length_bound() -> None:
    fixed = framing.FIXED.pack(framing.MAGIC, 0, b"\0\0\0", framing.MAX_HEADER + 1, 0)
    with pytest.raises(FramingError, match="65536"):
        framing.parse_fixed(fixed + b"\0" * 4)
    fixed = framing.FIXED.pack(framing.MAGIC, 0, b"\0\0\0", framing.MAX_HEADER, 0)
    assert framing.parse_fixed(fixed + b"\0" * 4).header_len == framing.MAX_HEADER


def test_every_header_bit_is_covered_by_the_header_crc() -> None:
    head = framing.encode(KEY, 10, 0)
    for at in [*range(8, 20), *range(framing.FIXED_LEN, len(head))]:
        damaged = bytearray(head)
        damaged[at] ^= 0x10
        with pytest.raises(FramingError):
            check(bytes(damaged))


@pytest.mark.parametrize("raw, mentions", [
    (b"\xff\xfe{\x00}\x00", "not JSON"),  # UTF-16: json.loads would take it, the format not
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
])
def test_header_must_be_a_utf8_json_object(raw: bytes, mentions: str) -> None:
    with pytest.raises(FramingError, match=mentions):
        check(with_header(raw))


GOOD = {"subTaskId": "s1", "start": DAY.start_iso, "end": DAY.end_iso, "partitionId": 3,
        "crc32c": "0000abcd"}


@pytest.mark.parametrize("change, field", [
    ({"subTaskId": "../x"}, "subTaskId"),
    ({"subTaskId": None}, "subTaskId"),
    ({"subTaskId": 5}, "subTaskId"),
    ({"start": "yesterday"}, "start"),
    ({"end": DAY.start_iso}, None),  # empty interval
    ({"end": None}, "end"),
    ({"partitionId": -1}, "partitionId"),
    ({"partitionId": "3"}, "partitionId"),  # a JSON integer, not a string
    ({"partitionId": True}, "partitionId"),
    ({"partitionId": 2**31}, "partitionId"),
    ({"crc32c": "abc"}, "crc32c"),
    ({"crc32c": "0x12abcd"}, "crc32c"),
    ({"crc32c": "+1234567"}, "crc32c"),
    ({"crc32c": "1_234567"}, "crc32c"),
    ({"crc32c": " 1234567"}, "crc32c"),
    ({"crc32c": 1234}, "crc32c"),
])
def test_data_header_refusals(change: dict[str, Any], field: str | None) -> None:
    with pytest.raises(FramingError) as info:
        framing.data_key("sup", {**GOOD, **change})
    assert info.value.code == "bad_framing" and info.value.status == 400
    if field is not None:
        assert info.value.details.get("field") == field, info.value.to_json()


@pytest.mark.parametrize("header", [{}, {"count": -1}, {"count": True}, {"count": "2"},
                                    {"count": 1.0}])
def test_end_count_refusals(header: dict[str, Any]) -> None:
    with pytest.raises(FramingError, match="count"):
        framing.end_count(header)

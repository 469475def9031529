"""A slab's bytes, version 1 (docs/slab.md): on the wire (``POST .../slabs``) and at rest
(the daemon keeps the request's bytes as they came, one file per slab). Little-endian::

    0   4  magic b"SHS1" (the 1 is the version; another is refused, naming it)
    4   4  flags: KEY_HASH (hashed), KEY_TUPLE (range / single_dim), neither (dynamic)
    8   4  header_len: the JSON header
    12  8  index_len: the index section (an Arrow IPC stream, :data:`INDEX_SCHEMA`)
    20  8  stats_len: the statistics section (an Arrow IPC stream, sketch.STATS_SCHEMA)
    28  8  data_len: the data section (an Arrow IPC stream: schema, record batches, EOS)
    36  4  CRC32C of bytes [0, 36) and the header
    40  h  {"subTaskId", "slabId", "attempt", "rows", "crc32c": {"index", "stats", "data"}}

then the three sections back to back. Pure functions, no I/O; the daemon checks what a
client declares before it believes it (:func:`parse_prefix`, :func:`parse_header`,
:func:`check_index`).
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from shuffled.crc import crc32c
from shuffled.errors import InvalidBody
from shuffled.protocol import validate_id

MAGIC = b"SHS1"
VERSION = 1
PREFIX = struct.Struct("<4sIIQQQ")  # magic, flags, header_len, index_len, stats_len, data_len
PREFIX_LEN = PREFIX.size + 4  # and the CRC32C
MAX_HEADER = 4096
CONTENT_TYPE = "application/vnd.shuffled.slab"
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class KeyKind(enum.IntFlag):
    NONE = 0
    HASH = 1
    TUPLE = 2


#: The column a keyed slab carries its rows' keys in (:mod:`.keys` makes them).
KEY_COLUMN = "__key"
#: Registers of a chunk's HyperLogLog (:mod:`.sketch`).
LG_REGISTERS = 11
#: The statistics section: one row per time chunk (:mod:`.sketch` fills it). ``sample``
#: is written empty (docs/slab.md, the statistics section) and read by nothing.
STATS_SCHEMA = pa.schema([
    ("chunk_start", pa.int64()), ("chunk_end", pa.int64()), ("rows", pa.int64()),
    ("hll", pa.binary()), ("sample", pa.list_(pa.binary())),
])

INDEX_SCHEMA = pa.schema([
    ("chunk_start", pa.int64()), ("chunk_end", pa.int64()),
    ("key_lo", pa.binary()), ("key_hi", pa.binary()),
    ("rows", pa.int64()), ("offset", pa.int64()), ("length", pa.int64()),
    ("crc32c", pa.uint32()), ("partition", pa.int32()),
])


@dataclass(frozen=True)
class Prefix:
    kind: KeyKind
    header_len: int
    index_len: int
    stats_len: int
    data_len: int
    crc: int
    fixed: bytes

    @property
    def sections_at(self) -> int:
        return PREFIX_LEN + self.header_len

    @property
    def data_at(self) -> int:
        return self.sections_at + self.index_len + self.stats_len

    @property
    def total(self) -> int:
        return self.data_at + self.data_len


@dataclass(frozen=True)
class SlabHeader:
    sub_task_id: str
    slab_id: int
    attempt: int
    rows: int
    crc_index: int
    crc_stats: int
    crc_data: int

    def to_json(self) -> bytes:
        return json.dumps({"subTaskId": self.sub_task_id, "slabId": self.slab_id,
                           "attempt": self.attempt, "rows": self.rows,
                           "crc32c": {"index": self.crc_index, "stats": self.crc_stats,
                                      "data": self.crc_data}},
                          separators=(",", ":")).encode()


def encode_prefix(kind: KeyKind, header: SlabHeader, index_len: int, stats_len: int,
                  data_len: int) -> bytes:
    """The prefix and header (the sections follow them)."""
    head = header.to_json()
    fixed = PREFIX.pack(MAGIC, int(kind), len(head), index_len, stats_len, data_len)
    return fixed + crc32c(head, crc32c(fixed)).to_bytes(4, "little") + head


def parse_prefix(raw: bytes | memoryview, *, max_index: int, max_stats: int,
                 max_data: int) -> Prefix:
    """The first :data:`PREFIX_LEN` bytes, checked against the limits given."""
    if len(raw) < PREFIX_LEN:
        raise InvalidBody(f"a slab starts with {PREFIX_LEN} bytes of prefix; got {len(raw)}")
    magic, flags, header_len, index_len, stats_len, data_len = PREFIX.unpack_from(raw)
    if magic != MAGIC:
        if bytes(magic[:3]) == b"SHS":
            raise InvalidBody(f"slab version {magic[3:]!r} is not supported: this daemon "
                              f"reads slab version {VERSION} only")
        raise InvalidBody(f"a slab starts with {MAGIC!r}, not {bytes(magic)!r}")
    if flags not in (KeyKind.NONE, KeyKind.HASH, KeyKind.TUPLE):
        raise InvalidBody(f"slab flags {flags:#x} are not a key kind of version 1")
    for name, value, limit in (("header", header_len, MAX_HEADER), ("index", index_len, max_index),
                               ("statistics", stats_len, max_stats),
                               ("data", data_len, max_data)):
        if value > limit:
            raise InvalidBody(f"a slab's {name} section of {value} bytes is over the "
                              f"{limit} allowed")
    if header_len == 0 or index_len == 0 or data_len == 0:
        raise InvalidBody("a slab has a header, an index and a data section")
    crc = int.from_bytes(raw[PREFIX.size:PREFIX_LEN], "little")
    return Prefix(KeyKind(flags), header_len, index_len, stats_len, data_len, crc,
                  bytes(raw[:PREFIX.size]))


def _int(doc: dict[str, Any], name: str, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    value = doc.get(name)
    if type(value) is not int or not lo <= value <= hi:
        raise InvalidBody(f"slab header field {name!r} must be an integer in {lo}..{hi}",
                          field=name)
    return value


def parse_header(prefix: Prefix, raw: bytes) -> SlabHeader:
    if crc32c(raw, crc32c(prefix.fixed)) != prefix.crc:
        raise InvalidBody("a slab's prefix and header fail their CRC32C")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidBody(f"a slab's header is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("crc32c"), dict):
        raise InvalidBody("a slab's header is an object with subTaskId, slabId, attempt, "
                          "rows and crc32c {index, stats, data}")
    sub = doc.get("subTaskId")
    if not isinstance(sub, str):
        raise InvalidBody("slab header field 'subTaskId' must be a string", field="subTaskId")
    crcs = doc["crc32c"]
    return SlabHeader(validate_id(sub, "subTaskId"), _int(doc, "slabId", 0, (1 << 31) - 1),
                      _int(doc, "attempt", 0, (1 << 31) - 1), _int(doc, "rows"),
                      _int(crcs, "index", 0, 0xFFFFFFFF), _int(crcs, "stats", 0, 0xFFFFFFFF),
                      _int(crcs, "data", 0, 0xFFFFFFFF))


def check_index(index: pa.Table, header: SlabHeader, prefix: Prefix) -> None:
    """An index that matches :data:`INDEX_SCHEMA` and describes batches inside the data
    section, in order, not overlapping, adding up to the header's rows."""
    if not index.schema.equals(INDEX_SCHEMA):
        raise InvalidBody(f"a slab's index has schema {index.schema}, not version 1's")
    if index.num_rows == 0:
        if header.rows:
            raise InvalidBody("a slab's index has no batches for its rows")
        return
    cols = {name: index.column(name) for name in ("chunk_start", "chunk_end", "rows",
                                                   "offset", "length")}
    if any(c.null_count for c in cols.values()):
        raise InvalidBody("a slab's index has nulls")
    start, end, rows, offset, length = (np.asarray(cols[n]) for n in
                                        ("chunk_start", "chunk_end", "rows", "offset", "length"))
    if np.any(end <= start) or np.any(rows < 0) or np.any(length <= 0) or np.any(offset <= 0):
        raise InvalidBody("a slab's index has an empty chunk, a negative row count or an "
                          "empty batch")
    if np.any(offset[1:] < offset[:-1] + length[:-1]):
        raise InvalidBody("a slab's index batches overlap or are out of order")
    if int(offset[-1] + length[-1]) > prefix.data_len - len(EOS):
        raise InvalidBody("a slab's index points past its data section")
    if int(rows.sum()) != header.rows:
        raise InvalidBody(f"a slab's index counts {int(rows.sum())} rows, its header "
                          f"{header.rows}")


def read_ipc(data: bytes | memoryview, schema: pa.Schema, what: str) -> pa.Table:
    """A small section's Arrow stream, read whole (sections are bounded by settings)."""
    try:
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as exc:
        raise InvalidBody(f"a slab's {what} section is not an Arrow IPC stream: {exc}") from exc
    if not table.schema.equals(schema):
        raise InvalidBody(f"a slab's {what} section has schema {table.schema}")
    return table

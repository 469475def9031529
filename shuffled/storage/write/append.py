"""Appending partial segments to a pack: CRC while streaming, validate, or cut it off.

Every function here blocks; the store calls them from its I/O threads. An uploaded stream
is stored as storage format 3 has it (:class:`~shuffled.storage.ondisk.records.PartialMeta`): its schema message
once per pack and schema, its body, no end-of-stream marker. Nothing appended is visible
until the group commit (:mod:`shuffled.storage.commit.group`) records it in the catalog; a
refused partial is cut off the pack's end, so it leaves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence

from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch, ShuffleError
from shuffled.protocol import PartialKey, crc_hex
from shuffled.storage.ondisk import arrowfile, writeback
from shuffled.storage.ondisk.packs import Pack
from shuffled.storage.commit.written import Written


_START_WRITEBACK = writeback.START
WRITEBACK_STEP = 8 << 20  # bytes written between two writeback starts


def check_crc(crc: int, expected: int | None) -> None:
    if expected is not None and expected != crc:
        raise DigestMismatch(
            f"body CRC32C is {crc_hex(crc)} but the sender declared {crc_hex(expected)}: "
            f"the upload was corrupted in transit; retry it",
            received=crc_hex(crc), expected=crc_hex(expected),
        )


class Append:
    """A partial segment being streamed onto the end of ``pack``."""

    def __init__(self, pack: Pack, fsync: bool) -> None:
        self.pack = pack
        self.offset = pack.size
        self.fsync = fsync
        self.size = 0
        self.crc = 0
        self._synced = 0  # writeback started up to here (see WRITEBACK_STEP)
        # CRC32C of the stream between its schema message and its end-of-stream marker,
        # folded in as the bytes arrive so validation need not read them again.
        self._head = bytearray()  # the first 8 bytes: continuation marker + schema length
        self._schema_len: int | None = None  # -1: not a stream start (validation refuses)
        self._body_crc = 0
        self._hold = b""  # the last bytes seen (up to 8): maybe the end-of-stream marker

    def write(self, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        """Append ``chunks`` (all of them) and fold them into the running CRCs."""
        views = [memoryview(c) for c in chunks]
        for view in views:
            self.crc = crc32c(view, self.crc)
            self._fold_body(view)
            self.size += len(view)
        self.pack.write(views)
        fd = self.pack.fd
        if (self.fsync and _START_WRITEBACK and fd is not None
                and self.size - self._synced >= WRITEBACK_STEP):
            _START_WRITEBACK(fd, self.offset + self._synced, self.size - self._synced)
            self._synced = self.size

    def _fold_body(self, view: memoryview) -> None:
        """Fold the part of ``view`` past the schema message into the body CRC, holding
        back the last 8 bytes (the end-of-stream marker). ``view`` starts at ``self.size``."""
        if self._schema_len is None:
            self._head += view[: max(0, 8 - len(self._head))]
            if len(self._head) < 8:
                return
            meta_len = int.from_bytes(self._head[4:8], "little", signed=True)
            ok = bytes(self._head[:4]) == arrowfile.CONTINUATION and meta_len > 0
            self._schema_len = 8 + meta_len if ok else -1
        if self._schema_len < 0:
            return
        body = view[max(0, self._schema_len - self.size):]
        if not body:
            return
        eos = len(arrowfile.EOS)
        if len(body) >= eos:
            self._body_crc = crc32c(body[:-eos], crc32c(self._hold, self._body_crc))
            self._hold = bytes(body[-eos:])
        else:
            joined = self._hold + bytes(body)
            self._body_crc = crc32c(joined[:-eos], self._body_crc)
            self._hold = joined[-eos:]

    def finish(self, expected_crc: int | None) -> Written:
        """Check the digest and validate the Arrow stream, then cut its end-of-stream
        marker off (packs omit it); the caller cuts the whole on failure. The schema
        message stays where it came, in front of the body (a streamed partial is large:
        a shared copy would save nothing worth a second pass)."""
        check_crc(self.crc, expected_crc)
        body_crc = self._body_crc if self._schema_len and self._schema_len > 0 else None
        facts = arrowfile.inspect(str(self.pack.path), self.size, body_crc, self.offset)
        self.pack.cut(self.offset + self.size - len(arrowfile.EOS))
        self.pack.schemas.setdefault((facts.schema_crc, facts.schema_len), self.offset)
        return Written(pack=self.pack, offset=self.offset + facts.schema_len, size=self.size,
                       crc=self.crc, facts=facts, schema_at=self.offset,
                       stored=self.size - len(arrowfile.EOS))

    def discard(self) -> None:
        """Cut what was appended off the pack."""
        if self.pack.fd is not None and self.pack.size != self.offset:
            self.pack.cut(self.offset)


@dataclass(slots=True)
class Small:
    """A small partial held in memory: a whole stream (``schema`` None, ``crc`` its CRC32C
    if declared) or, sent as bulk format 2 has it, a body after ``schema`` (``crc`` the
    body's CRC32C if declared)."""

    data: memoryview
    crc: int | None
    schema: arrowfile.SchemaMessage | None = None


def start_writeback(pack: Pack) -> None:
    """Start writing back the pack's dirty pages once :data:`WRITEBACK_STEP` bytes are
    waiting (without waiting for it), so that the commit's fdatasync finds little left."""
    fd = pack.fd
    if _START_WRITEBACK and fd is not None and pack.size - pack.writeback >= WRITEBACK_STEP:
        _START_WRITEBACK(fd, pack.writeback, pack.size - pack.writeback)
        pack.writeback = pack.size


def append_small(pack: Pack, items: Sequence[Small], fsync: bool = False,
                 ) -> list[Written | ShuffleError]:
    """Validate small partials held in memory and append the good ones with one write: per
    schema, its message once per pack; per partial, its body. Bodies of one schema are
    validated together (:func:`~shuffled.storage.ondisk.arrowfile.validate_bodies`).

    Per item: a :class:`Written`, or the domain error refusing it (nothing of it written).
    """
    out: list[Written | ShuffleError | None] = [None] * len(items)
    parts: list[tuple[int, arrowfile.SchemaMessage, memoryview, int, int]] = []
    known: dict[bytes, arrowfile.SchemaMessage] = {}
    for i, item in enumerate(items):
        try:
            if item.schema is None:
                try:
                    head, body = arrowfile.split_stream(item.data)
                    schema = known.get(head) or known.setdefault(
                        head, arrowfile.SchemaMessage.parse(head))
                except ShuffleError:  # a damaged body is reported as damaged first
                    check_crc(crc32c(item.data), item.crc)
                    raise
                # The stream's CRC from its body's (the schema message's is known): one
                # pass over the bytes, not two.
                body_crc = crc32c(body)
                crc = schema.stream_crc(body_crc, len(body))
                check_crc(crc, item.crc)
            else:
                schema, body = item.schema, item.data
                body_crc = crc32c(body)
                check_crc(body_crc, item.crc)
                crc = schema.stream_crc(body_crc, len(body))
        except ShuffleError as exc:  # refused: reported for this item alone
            out[i] = exc
            continue
        parts.append((i, schema, body, crc, body_crc))
    by_schema: dict[int, list[int]] = {}
    for n, (_, schema, _, _, _) in enumerate(parts):
        by_schema.setdefault(id(schema), []).append(n)
    checked: dict[int, tuple[int, int] | ShuffleError] = {}
    for members in by_schema.values():
        schema = parts[members[0]][1]
        for n, got in zip(members, arrowfile.validate_bodies(
                schema, [parts[n][2] for n in members]), strict=True):
            checked[n] = got
    good: list[memoryview] = []
    start = at = pack.size
    for n, (i, schema, body, crc, body_crc) in enumerate(parts):
        facts = checked[n]
        if isinstance(facts, ShuffleError):
            out[i] = facts
            continue
        schema_len = len(schema.data)
        schema_at = pack.schemas.get((schema.crc, schema_len))
        stored = len(body)
        if schema_at is None:
            schema_at = pack.schemas[(schema.crc, schema_len)] = at
            good.append(memoryview(schema.data))
            at += schema_len
            stored += schema_len
        good.append(body)
        out[i] = Written(pack=pack, offset=at, size=schema_len + len(body) + len(arrowfile.EOS),
                         crc=crc, facts=schema.facts(facts[0], facts[1], body_crc),
                         schema_at=schema_at, stored=stored)
        at += len(body)
    if good:
        try:
            pack.write(good)
        except BaseException:
            if pack.fd is not None:
                pack.cut(start)
            raise
        if fsync:
            start_writeback(pack)
    return [o for o in out if o is not None]

"""Planning one page of a paged partition read (blocking: runs on the I/O threads).

A partition's partials are taken in commit order (their generation), so a position in it
stays valid while partials are added: new ones always come after. A position is a token,
``generation << 20 | batch``: the partial committed as ``generation``, from its record
batch ``batch`` on. Tokens grow monotonically through a partition (Presto's page tokens).

A page is a valid Arrow IPC stream of whole record batches taken from consecutive
partials: the first partial's schema message, every dictionary message the batches need
(all dictionary messages before the first batch taken, then those met on the way, in
order, so deltas and replacements apply as written), the batches, and an end-of-stream
marker. A page ends before a partial whose schema message differs from the page's, or
that has dictionaries (its dictionaries would not apply to the page's schema), and once
the next batch would pass the page's maximum size; it holds at least one batch, so a
single batch larger than the maximum makes a page by itself. Every piece is a byte range
of a pack, sent with sendfile where it can be; nothing is decoded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO
from dataclasses import dataclass, field

from shuffled.storage.ondisk.arrowfile import EOS
from shuffled.storage.ondisk.records import PartialMeta
from shuffled.crc import crc32c
from shuffled.storage.read.streams import crc_of, messages

BATCH_BITS = 20  # record batches addressable per partial: 1M
MAX_TOKEN = (1 << 128) - 1  # generations are wide (time-based), so tokens are too
# Set on every token handed out once the task is sealed. A token without it that has
# passed a partial of a subtask the seal left out belonged to a reader who was served that
# partial: it must read again from 0 (Store.view). Generations are nanoseconds (< 2**64),
# so a position never reaches this bit.
SEALED_FLAG = 1 << 120


def token_of(generation: int, batch: int) -> int:
    return generation << BATCH_BITS | batch


def position(token: int) -> tuple[int, int]:
    """(generation, batch) of ``token`` (its sealed flag ignored)."""
    token &= SEALED_FLAG - 1
    return token >> BATCH_BITS, token & ((1 << BATCH_BITS) - 1)


@dataclass
class Page:
    """What to send: pieces (index into the page's partials, offset, length; or bytes)."""

    pieces: list[tuple[int, int, int] | bytes] = field(default_factory=list)
    length: int = 0
    batches: int = 0
    next_token: int = 0
    pending_bytes: int = 0  # stored bytes of what is still to come after this page
    at_end: bool = False  # the reader has passed every partial there is now

    def add(self, piece: tuple[int, int, int] | bytes) -> None:
        self.pieces.append(piece)
        self.length += piece[2] if isinstance(piece, tuple) else len(piece)


def plan_page(metas: Sequence[PartialMeta], token: int, max_bytes: int) -> Page:
    """The page starting at ``token`` among ``metas`` (in generation order)."""
    generation, batch = position(token)
    p = 0
    while p < len(metas) and metas[p].generation < generation:
        p += 1
    if p < len(metas) and metas[p].generation != generation:
        batch = 0  # that partial was replaced (same key, newer generation): start here
    page = Page()
    first_meta: PartialMeta | None = None
    stop_at = 0  # offset in the pack where the next page starts, within metas[p]
    while p < len(metas):
        meta = metas[p]
        index = messages(meta)
        batches = [i for i, m in enumerate(index) if m.kind == "record batch"]
        if batch >= len(batches):
            p, batch = p + 1, 0
            continue
        if first_meta is not None and (meta.schema_crc != first_meta.schema_crc
                                       or meta.has_dictionaries or first_meta.has_dictionaries):
            stop_at = index[batches[batch]].offset if batch else meta.offset
            break
        start = batches[batch]
        if first_meta is None:
            first_meta = meta
            page.add((p, index[0].offset, index[0].length))
            for m in index[1:start]:
                if m.kind == "dictionary":
                    page.add((p, m.offset, m.length))
        full = False
        for m in index[start:]:
            if m.kind == "record batch":
                if page.batches and page.length + m.length + len(EOS) > max_bytes:
                    full = True
                    stop_at = m.offset
                    break
                page.batches += 1
                batch += 1
            page.add((p, m.offset, m.length))
        if full:
            break
        p, batch = p + 1, 0
    if page.batches:
        page.add(EOS)  # else the page is empty: no body at all (no schema to send)
    if p < len(metas):
        page.next_token = token_of(metas[p].generation, batch)
        here = metas[p]
        rest = (here.size if stop_at <= here.offset
                else here.offset + here.body_len + len(EOS) - stop_at)  # stream bytes left
        page.pending_bytes = rest + sum(m.size for m in metas[p + 1:])
    else:
        newest = metas[-1].generation + 1 if metas else generation
        page.next_token = token_of(max(newest, generation), 0)
        page.at_end = True
    return page


def page_crc(files: Mapping[int, IO[bytes]], page: Page) -> int:
    """The page's CRC32C (its ``Content-Digest``), read through in chunks on an I/O thread
    (``files``: the open pack of each partial index the pieces name). The digest goes in the
    headers, before the body, which then goes out by sendfile from the page cache; memory
    stays one chunk whatever the page's size."""
    crc = 0
    for piece in page.pieces:
        if isinstance(piece, bytes):
            crc = crc32c(piece, crc)
            continue
        index, offset, length = piece
        crc, got = crc_of(files[index].fileno(), offset, length, crc)
        if got != length:
            raise OSError(f"short read of a pack: {length - got} bytes missing")
    return crc

"""The body CRC an append folds in while streaming equals the one read back from the pack;
small partials validated in memory give the same facts; both are stored as format 3 has
them (schema message, body, no end-of-stream marker) and read back as the stream sent."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest

from shuffled.crc import crc32c
from shuffled.errors import DigestMismatch, InvalidBody
from shuffled.storage.ondisk import arrowfile, packs
from shuffled.storage.commit.written import Written
from shuffled.storage.write.append import Append, Small, append_small
from shuffled.storage.location import Location
from shuffled.storage.read.streams import stream_pieces
from shuffled.protocol import Interval, PartialKey
from tests.conftest import arrow_bytes, sample_table


@pytest.fixture
def location(tmp_path: Path):
    loc = Location(0, tmp_path / "loc", None, 0)
    loc.open()
    yield loc
    loc.close()


def _write(location: Location, body: bytes, cuts: list[int]) -> Written:
    pack = packs.create(location.path, 0, "sup", 1, fsync=False)
    pack.write([memoryview(b"x" * 100)])  # not at offset 0: offsets must be honoured
    append = Append(pack, fsync=False)
    at = 0
    for cut in [*cuts, len(body)]:
        append.write([body[at:cut]])
        at = cut
    try:
        return append.finish(None)
    except InvalidBody:
        append.discard()
        assert pack.size == 100, "a refused append is cut off the pack"
        raise


@pytest.mark.parametrize("seed", range(6))
def test_streamed_body_crc_equals_the_crc_read_back(location: Location, seed: int) -> None:
    rnd = random.Random(seed)
    body = arrow_bytes(sample_table(rnd.randint(1, 3000), seed=seed), batch_rows=rnd.randint(1, 500))
    # Cut anywhere: inside the 8-byte head, inside the schema, inside the end marker.
    cuts = sorted({rnd.choice([1, 3, 7, 8, 9]), *(rnd.randint(1, len(body) - 1) for _ in range(5)),
                   len(body) - rnd.randint(1, 8)})
    # No shortcut: the facts of the stream as sent, read from a file holding it alone.
    alone = location.path / "alone"
    alone.write_bytes(body)
    reread = arrowfile.inspect(str(alone), len(body))
    written = _write(location, body, cuts)
    head = reread.schema_len
    assert (written.schema_at, written.offset, written.size) == (100, 100 + head, len(body))
    assert written.facts == reread
    assert written.facts.body_crc != 0
    assert written.pack.size == 100 + len(body) - 8 == 100 + written.stored  # no end marker
    pack = packs.create(location.path, 0, "sup", 2, fsync=False)
    (small,) = append_small(pack, [Small(memoryview(body), None)])
    assert isinstance(small, Written) and small.facts == reread
    # Both read back as the stream that was sent: schema message + body + end marker.
    for w in (written, small):
        meta = w.meta(PartialKey("sup", "s", Interval(0, 1), 0), 1, 0, 0.0)
        stored = w.pack.path.read_bytes()
        assert b"".join(stored[r[0]: r[0] + r[1]] if isinstance(r, tuple) else r
                        for r in stream_pieces(meta)) == body


def test_small_partials_of_one_schema_share_its_message_in_a_pack(location: Location) -> None:
    bodies = [arrow_bytes(sample_table(50 + i, seed=i)) for i in range(5)]
    pack = packs.create(location.path, 0, "sup", 1, fsync=False)
    first = append_small(pack, [Small(memoryview(b), None) for b in bodies[:3]])
    later = append_small(pack, [Small(memoryview(b), None) for b in bodies[3:]])
    written = [w for w in [*first, *later] if isinstance(w, Written)]
    head = written[0].facts.schema_len
    assert {w.schema_at for w in written} == {0}
    assert pack.size == head + sum(len(b) - head - 8 for b in bodies)
    # Bodies are adjacent: the partition of these five is one range of the pack.
    assert [w.offset for w in written] == [head + sum(len(b) - head - 8 for b in bodies[:i])
                                           for i in range(5)]


def test_a_body_that_is_not_a_stream_is_still_refused(location: Location) -> None:
    body = b"\x00" * 64
    with pytest.raises(InvalidBody):
        _write(location, body, [3, 30])


def test_a_small_partials_declared_crc_is_the_whole_streams(location: Location) -> None:
    """The stream's CRC32C is derived from its body's in one pass; what a sender declares is
    still checked against the CRC of every byte sent, and a damaged body that is also not a
    stream is reported as damaged (the CRC) rather than as malformed."""
    body = arrow_bytes(sample_table(300, seed=4))
    pack = packs.create(location.path, 0, "sup", 1, fsync=False)
    (ok,) = append_small(pack, [Small(memoryview(body), crc32c(body))])
    assert isinstance(ok, Written) and ok.crc == crc32c(body)
    flipped = bytearray(body)
    flipped[len(body) // 2] ^= 0x01  # inside the body: still a stream's shape
    (bad,) = append_small(pack, [Small(memoryview(bytes(flipped)), crc32c(body))])
    assert isinstance(bad, DigestMismatch)
    junk = b"\x00" * 64
    (damaged,) = append_small(pack, [Small(memoryview(junk), crc32c(body))])
    assert isinstance(damaged, DigestMismatch)
    (malformed,) = append_small(pack, [Small(memoryview(junk), crc32c(junk))])
    assert isinstance(malformed, InvalidBody)
    assert pack.size == ok.stored, "only the good partial was written"


def test_schema_messages_are_remembered_within_a_bound() -> None:
    """A schema message read once is not read again, but the memory held for that is
    bounded in entries and in the size of a message a client can make it keep."""
    arrowfile._parsed.cache_clear()
    heads = [arrowfile.split_stream(memoryview(arrow_bytes(
        pa.table({f"c{i}": pa.array([1], pa.int64())}))))[0] for i in range(arrowfile.SCHEMA_MEMO + 8)]
    first = arrowfile.SchemaMessage.parse(heads[0])
    assert arrowfile.SchemaMessage.parse(bytes(heads[0])) is first
    assert first == arrowfile.SchemaMessage._read(heads[0])
    for head in heads:
        arrowfile.SchemaMessage.parse(head)
    assert arrowfile._parsed.cache_info().currsize == arrowfile.SCHEMA_MEMO
    wide = arrowfile.split_stream(memoryview(arrow_bytes(pa.table(
        {f"column_with_a_long_name_{i:05d}": pa.array([1]) for i in range(1500)}))))[0]
    assert len(wide) > arrowfile.SCHEMA_MEMO_BYTES
    before = arrowfile._parsed.cache_info()
    assert arrowfile.SchemaMessage.parse(wide).data == wide
    assert arrowfile._parsed.cache_info() == before, "a message over the bound is not kept"
    with pytest.raises(InvalidBody):
        arrowfile.SchemaMessage.parse(heads[0][:-8] + b"\xff" * 8)

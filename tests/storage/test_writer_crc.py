"""The body CRC an append folds in while streaming equals the one read back from the pack;
small partials validated in memory give the same facts; both are stored as format 3 has
them (schema message, body, no end-of-stream marker) and read back as the stream sent."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shuffled.errors import InvalidBody
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

"""The body CRC an append folds in while streaming equals the one read back from the pack;
small partials validated in memory give the same facts."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shuffled.errors import InvalidBody
from shuffled.storage import arrowfile, packs
from shuffled.storage.append import Append, Written, append_small
from shuffled.storage.location import Location
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
    written = _write(location, body, cuts)
    # No shortcut: reads the pack.
    reread = arrowfile.inspect(str(written.pack.path), written.size, None, written.offset)
    assert written.offset == 100
    assert written.facts == reread
    assert written.facts.body_crc != 0
    pack = packs.create(location.path, 0, "sup", 2, fsync=False)
    (small,) = append_small(pack, [(memoryview(body), None)])
    assert isinstance(small, Written) and small.facts == reread


def test_a_body_that_is_not_a_stream_is_still_refused(location: Location) -> None:
    body = b"\x00" * 64
    with pytest.raises(InvalidBody):
        _write(location, body, [3, 30])

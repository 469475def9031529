"""The body CRC the writer folds in while streaming equals the one read back from disk."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from shuffled.errors import InvalidBody
from shuffled.storage import arrowfile, writer
from shuffled.storage.location import Location
from tests.conftest import arrow_bytes, sample_table


@pytest.fixture
def location(tmp_path: Path):
    loc = Location(0, tmp_path / "loc", None, 0)
    loc.open()
    yield loc
    loc.close()


def _write(location: Location, body: bytes, cuts: list[int]) -> writer.Written:
    tmp = writer.TempPartial(location, None, fsync=False)
    at = 0
    for cut in [*cuts, len(body)]:
        tmp.write(body[at:cut])
        at = cut
    return tmp.finish(None)


@pytest.mark.parametrize("seed", range(6))
def test_streamed_body_crc_equals_the_crc_read_back(location: Location, seed: int) -> None:
    rnd = random.Random(seed)
    body = arrow_bytes(sample_table(rnd.randint(1, 3000), seed=seed), batch_rows=rnd.randint(1, 500))
    # Cut anywhere: inside the 8-byte head, inside the schema, inside the end marker.
    cuts = sorted({rnd.choice([1, 3, 7, 8, 9]), *(rnd.randint(1, len(body) - 1) for _ in range(5)),
                   len(body) - rnd.randint(1, 8)})
    written = _write(location, body, cuts)
    reread = arrowfile.inspect(str(written.tmp), written.size)  # no shortcut: reads the file
    assert written.facts == reread
    assert written.facts.body_crc != 0


def test_a_body_that_is_not_a_stream_is_still_refused(location: Location) -> None:
    body = b"\x00" * 64
    with pytest.raises(InvalidBody):
        _write(location, body, [3, 30])

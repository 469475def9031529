"""The slab's statistics (shuffled.slab.sketch): registers stored dense or sparse read back
the same; the HLL estimate is within its documented error (1.04/sqrt(2^11), Flajolet et
al. 2007) of the true distinct count; sparse bytes a writer could not have made are
refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from shuffled.slab import sketch


@pytest.mark.parametrize("distinct", [0, 1, 50, 600, 5_000, 200_000])
def test_registers_round_trip_and_estimate(distinct: int) -> None:
    values = pa.array([f"k{i}" for i in range(distinct)] * 2)  # each twice: distinct counts
    hashes = sketch.row_hashes([values]) if distinct else np.zeros(0, np.uint64)
    regs = sketch.registers(hashes, np.array([0, len(hashes)]))[0]
    raw = sketch.encode_registers(regs)
    assert np.array_equal(sketch.decode_registers(raw), regs)
    if distinct <= 600:
        assert len(raw) == 3 * np.count_nonzero(regs)  # sparse: bytes, not 2 KiB
    if distinct:
        error = 1.04 / np.sqrt(sketch.REGISTERS)
        assert abs(sketch.estimate(regs) - distinct) <= max(4 * error * distinct, 2)


def test_bytes_no_writer_makes_are_refused() -> None:
    with pytest.raises(ValueError):
        sketch.decode_registers(b"\x00" * 4)  # not a multiple of 3
    with pytest.raises(ValueError):
        sketch.decode_registers(b"\xff\xff\x01")  # register 65535


@pytest.mark.parametrize("column", [
    pa.array([None] * 100, pa.string()),  # a file without the dimension: read as nulls
    pa.array([None] * 100, pa.string()).dictionary_encode(),
    pa.array([None] * 3, pa.string()),
], ids=["plain", "dictionary", "short"])
def test_an_all_null_column_hashes_as_nulls_do(column: pa.Array) -> None:
    """A dimension missing from a file is all null in its rows: its dictionary is empty.
    Every row hashes as a null does in a column that has values too."""
    mixed = pa.array(["x"] + [None] * 99, pa.string())
    null_hash = sketch.row_hashes([mixed])[1]
    assert (sketch.row_hashes([column]) == null_hash).all()

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


@pytest.mark.parametrize(("alphabet", "longest"), [
    ("abz9", 0), ("abz9", 5), ("abz9", 15), ("a\u20ac\U0001F600", 3), ("abz9", 300)])
def test_values_hash_alike_by_length_groups_and_byte_by_byte(
        alphabet: str, longest: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value's hash is summed a length at a time (few byte lengths: all but the last
    case) or a byte at a time (many): the two give the same hashes, so slabs cut either
    way merge as one HLL."""
    rng = np.random.default_rng(longest)
    values = pa.array([None if rng.random() < 0.05 else
                       "".join(rng.choice(list(alphabet), int(rng.integers(0, longest + 1))))
                       for _ in range(3000)])
    lengths = {len(v.encode()) for v in values.to_pylist() if v is not None}
    assert (len(lengths) <= sketch.LENGTH_GROUPS) == (longest < 300)
    grouped = [sketch._bytes_hash(v) for v in (values, values.slice(7))]
    monkeypatch.setattr(sketch, "LENGTH_GROUPS", 0)
    assert all(np.array_equal(g, sketch._bytes_hash(v))
               for g, v in zip(grouped, (values, values.slice(7)), strict=True))


def test_a_slabs_registers_decode_at_once_as_one_at_a_time() -> None:
    """decode_all reads every chunk's registers of a statistics section in array passes:
    each as decode_registers reads it (dense, sparse at every count up to the dense
    threshold, empty: not sketched), also from a sliced array, and the bytes it refuses
    are the bytes decode_registers refuses."""
    rng = np.random.default_rng(8)
    raws = []
    for k in [0, 1, 5, 100, 681, 682, 683, 700, 2048, *rng.integers(0, 2049, 20).tolist()]:
        regs = np.zeros(sketch.REGISTERS, np.uint8)
        regs[rng.choice(sketch.REGISTERS, k, replace=False)] = rng.integers(1, 60, k)
        raws.append(sketch.encode_registers(regs))
    arr = pa.array(raws, pa.binary())
    for values in (arr, arr.slice(3)):
        got, held = sketch.decode_all(values)
        want = values.to_pylist()
        assert held.tolist() == [len(r) > 0 for r in want]
        assert all(np.array_equal(g, sketch.decode_registers(r)) for g, r in zip(got, want))
    for bad in (b"\x00" * 4, b"\xff\xff\x01", b"\x00" * 2049):
        with pytest.raises(ValueError):
            sketch.decode_registers(bad)
        with pytest.raises(ValueError):
            sketch.decode_all(pa.array([raws[1], bad], pa.binary()))


def test_a_date_column_hashes_as_its_day_numbers() -> None:
    """date32 is days since the epoch (Arrow's Schema.fbs): Arrow casts it to int32 but not
    to int64 directly, which the hash refused. Each date now hashes as its day number."""
    import datetime

    days = [datetime.date(2020, 1, 1), None, datetime.date(1969, 12, 31), datetime.date(2020, 1, 1)]
    as_dates = sketch.row_hashes([pa.array(days, pa.date32())])
    as_ints = sketch.row_hashes([pa.array([18262, None, -1, 18262], pa.int32())])
    assert (as_dates == as_ints).all()
    assert as_dates[0] == as_dates[3] and len({int(h) for h in as_dates}) == 3


def _flajolet(regs: np.ndarray) -> float:
    """HyperLogLog's estimate as Flajolet et al. 2007 state it, with linear counting below
    2.5m: the reference the vectorised estimate is held to."""
    m = float(len(regs))
    alpha = 0.7213 / (1 + 1.079 / m)
    raw = alpha * m * m / float(np.sum(np.exp2(-regs.astype(np.float64))))
    zeros = int(np.count_nonzero(regs == 0))
    return m * float(np.log(m / zeros)) if raw <= 2.5 * m and zeros else raw


def test_estimate_many_is_estimate_of_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """sketch.estimate_many (blocks of sketches at once) and estimate (one) give each row
    the paper's estimate: empty, small (linear counting), large and saturated sketches,
    across block boundaries."""
    monkeypatch.setattr(sketch, "ESTIMATE_BLOCK", 3)
    rng = np.random.default_rng(5)
    rows = [np.zeros(sketch.REGISTERS, np.uint8)]
    for distinct in [1, 10, 300, 5_000, 200_000]:
        hashes = rng.integers(0, 2**63, distinct, dtype=np.int64).astype(np.uint64) * 2 + 1
        rows.append(sketch.registers(hashes, np.array([0, distinct]))[0])
    rows.append(np.full(sketch.REGISTERS, 54, np.uint8))
    regs = np.stack(rows)
    got = sketch.estimate_many(regs)
    want = [_flajolet(r) for r in regs]
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    assert [sketch.estimate(r) for r in regs] == pytest.approx(want, rel=1e-12)


def _rho(h: int) -> int:
    """HyperLogLog's register value of a 64-bit hash: 1 + the leading zeros of the bits
    after the register's 11, a stop bit after them (so never over 54)."""
    rest = ((h << sketch.LG_REGISTERS) & (2**64 - 1)) | (1 << (sketch.LG_REGISTERS - 1))
    return 65 - rest.bit_length()


def _reference(hashes: list[int], bounds: list[int]) -> np.ndarray:
    out = np.zeros((len(bounds) - 1, sketch.REGISTERS), np.uint8)
    for c, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        for h in hashes[lo:hi]:
            at = h >> (64 - sketch.LG_REGISTERS)
            out[c, at] = max(out[c, at], _rho(h))
    return out


def test_registers_hold_each_hashs_leading_zeros_exactly() -> None:
    """A register holds 1 + the leading zeros of the hash's remaining bits, at most; hashes
    at the edges of float64's precision included: the remaining 53 bits all ones (rho 1;
    as a float64 they rounded up to 2^64, and the register stayed 0), all zeros but the
    last (53), all zeros (54)."""
    rng = np.random.default_rng(11)
    edge = [(5 << 53) | ((1 << 53) - 1), (6 << 53) | 1, 7 << 53, (8 << 53) | (1 << 52),
            (9 << 53) | ((1 << 52) - 1), 2**64 - 1, 0]
    hashes = edge + [int(x) for x in rng.integers(0, 2**63, 3000, dtype=np.int64)] \
        + [int(x) << 1 | 1 for x in rng.integers(0, 2**63, 3000, dtype=np.int64)]
    bounds = [0, 7, 7, 2000, 6007]  # an empty chunk too
    want = _reference(hashes, bounds)
    got = sketch.registers(np.array(hashes, np.uint64), np.array(bounds))
    assert np.array_equal(got, want)
    assert want[0, 5] == 1 and want[0, 6] == 53 and want[0, 7] == 54


def test_row_hashes_of_numbers_are_their_column_hashes_combined(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's hash: the first column's hash, then mix(h * 31 + hash) of each next one,
    whatever the columns (numbers hashed in steps of rows, strings a distinct value at a
    time), across the steps' edges."""
    monkeypatch.setattr(sketch, "STEP", 7)
    rng = np.random.default_rng(3)
    n = 100
    cols = [pa.array(rng.integers(-5, 5, n), pa.int64()),
            pa.array([None if i % 9 == 0 else f"v{i % 13}" for i in range(n)]),
            pa.array([None if i % 4 == 0 else float(i) / 3 for i in range(n)]),
            pa.array(rng.integers(0, 10**12, n), pa.timestamp("ms"))]
    want = sketch._column_hash(cols[0]).copy()
    with np.errstate(over="ignore"):
        for c in cols[1:]:
            want = sketch._mix(want * np.uint64(31) + sketch._column_hash(c))
    assert (sketch.row_hashes(cols) == want).all()

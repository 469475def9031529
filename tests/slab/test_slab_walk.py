"""A slab's data section is checked all at once (numpy gathers over every batch's
flatbuffer, :mod:`shuffled.storage.ondisk.messages`), not a message at a time. The
per-message reading (:mod:`shuffled.storage.ondisk.ipcshape`, which the partials path
walks) is the reference: on fuzzed metadata both give the same verdict."""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest

from shuffled.errors import InvalidBody
from shuffled.slab import wire
from shuffled.slab.wire import KeyKind
from shuffled.storage.ondisk import ipcshape
from shuffled.storage.slabs import check
from tests.helpers.slabs import make_slab, rows_table

_HEAD = struct.Struct("<Ii")


def _reference(data: bytes, kind: KeyKind, index: pa.Table) -> None:
    """The per-message walk this module replaced on the receive path (a Python loop a
    batch), kept as the oracle. It also refuses a record batch message without a header
    (the bulk check does: pyarrow cannot read one)."""
    end = len(data)
    schema, at = check._schema_at(memoryview(data), 0, end)
    check.schema_of(kind, schema)
    batch = ipcshape.layout(schema)
    offsets, lengths = index.column("offset").to_pylist(), index.column("length").to_pylist()
    rows = index.column("rows").to_pylist()
    for i in range(len(offsets)):
        if at != offsets[i] or at + 8 > end:
            raise InvalidBody("moved")
        marker, meta_len = _HEAD.unpack_from(data, at)
        if marker != 0xFFFFFFFF or meta_len <= 0 or at + 8 + meta_len > end:
            raise InvalidBody("not a message")
        meta = data[at + 8: at + 8 + meta_len]
        kind_, body_len = ipcshape.check_message(meta, batch, {})
        if kind_ != 3:
            raise InvalidBody("not a record batch")
        try:
            message = ipcshape._Table(meta, struct.unpack_from("<I", meta, 0)[0])
        except (struct.error, IndexError) as exc:
            raise InvalidBody("malformed") from exc
        if message.table(2) is None:
            raise InvalidBody("no header")
        nxt = at + 8 + meta_len + body_len
        if nxt - at != lengths[i] or nxt > end:
            raise InvalidBody("length")
        if ipcshape.record_batch_rows(meta) != rows[i]:
            raise InvalidBody("rows")
        at = nxt
    if data[at:] != wire.EOS:
        raise InvalidBody("eos")


class _Bytes:
    """A data section in memory (the daemon's is a file: ``receive.FileSection``)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.size = data, len(data)
        self.windows: list[int] = []

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset: offset + length]

    @contextlib.contextmanager
    def mapped(self, offset: int, length: int) -> Iterator[np.ndarray]:
        self.windows.append(length)
        yield np.frombuffer(self.data, np.uint8)[offset: offset + length]


def _bulk(data: bytes, kind: KeyKind, index: pa.Table, window: int = check.WINDOW) -> None:
    check.data_section(_Bytes(data), kind, index, window)


def _windowed(data: bytes, kind: KeyKind, index: pa.Table) -> None:
    """A window of 2 KiB: a few batches each, some batches larger than one."""
    _bulk(data, kind, index, 2048)


def _verdict(fn: Callable[[bytes, KeyKind, pa.Table], None], data: bytes, kind: KeyKind,
             index: pa.Table) -> str:
    try:
        fn(data, kind, index)
    except InvalidBody:
        return "refused"
    return "accepted"


def _slab(kind: KeyKind = KeyKind.HASH) -> tuple[bytes, pa.Table]:
    slab = make_slab(rows_table(600, seed=3), kind=kind, batch_rows=64)
    return slab.data.to_pybytes(), pa.ipc.open_stream(slab.index).read_all()


@pytest.mark.parametrize("kind", [KeyKind.HASH, KeyKind.TUPLE])
def test_a_slab_as_written_passes(kind: KeyKind) -> None:
    data, index = _slab(kind)
    assert index.num_rows > 5
    _reference(data, kind, index)
    section = _Bytes(data)
    assert check.data_section(section, kind, index, 2048).names[-1] == wire.KEY_COLUMN
    assert len(section.windows) > 3  # the windows cover the section between them
    assert sum(section.windows) == len(data) - index.column("offset")[0].as_py() - len(wire.EOS)


def test_fuzzed_metadata_gets_the_references_verdict() -> None:
    """600 mutants: bytes flipped in the batches' continuation markers, lengths and
    flatbuffers (never in bodies: those are the CRC's business): both walks refuse the
    same mutants, and the mutants both accept flipped padding or a field neither reads (a
    buffer's offset, a node's null count: pyarrow's own reader checks those against the
    body)."""
    data, index = _slab()
    offsets = index.column("offset").to_pylist()
    rng = random.Random(20261127)
    refused = accepted = 0
    for trial in range(600):
        mutant = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 3))):
            at = rng.choice(offsets)
            meta_len = struct.unpack_from("<i", data, at + 4)[0]
            pos = at + rng.randrange(8 + meta_len)
            mutant[pos] = rng.choice((0, 0xFF, rng.randrange(256), mutant[pos] ^ 1,
                                      mutant[pos] ^ 0x80))
        mutant_bytes = bytes(mutant)
        want = _verdict(_reference, mutant_bytes, KeyKind.HASH, index)
        got = _verdict(_bulk, mutant_bytes, KeyKind.HASH, index)
        assert got == want, f"trial {trial}"
        assert _verdict(_windowed, mutant_bytes, KeyKind.HASH, index) == want, f"trial {trial}"
        refused += want == "refused"
        accepted += want == "accepted"
    assert refused > 100 and accepted > 100  # both verdicts are exercised, often


@pytest.mark.parametrize("change", ["offset", "length", "rows", "drop_last", "swap"])
def test_an_index_that_lies_about_its_batches_is_refused(change: str) -> None:
    data, index = _slab()
    cols = {name: index.column(name).to_pylist() for name in index.column_names}
    if change == "offset":
        cols["offset"][2] += 8
    elif change == "length":
        cols["length"][1] -= 8
    elif change == "rows":
        cols["rows"][3] += 1
    elif change == "drop_last":
        cols = {k: v[:-1] for k, v in cols.items()}
    else:
        cols["rows"][0], cols["rows"][1] = cols["rows"][1], cols["rows"][0] + 1
    lying = pa.table(cols, schema=index.schema)
    with pytest.raises(InvalidBody):
        _reference(data, KeyKind.HASH, lying)
    with pytest.raises(InvalidBody, match="slab's"):
        _bulk(data, KeyKind.HASH, lying)
    with pytest.raises(InvalidBody, match="slab's"):
        _windowed(data, KeyKind.HASH, lying)


def test_a_batch_that_declares_rows_it_does_not_carry_is_refused_by_number() -> None:
    """The 224-byte attack (ipcshape's docstring): rows of a null-type column cost no body."""
    from shuffled.slab import build

    nulls = pa.table({"n": pa.nulls(1 << 22)})
    lying = build.build(nulls, np.zeros(1 << 22, np.int64), np.ones(1 << 22, np.int64),
                        kind=KeyKind.NONE, sub_task_id="s", slab_id=0, attempt=0,
                        batch_rows=1 << 22)
    index = pa.ipc.open_stream(lying.index).read_all()
    with pytest.raises(InvalidBody, match="declares 4194304 rows"):
        _bulk(lying.data, KeyKind.NONE, index)


def test_no_python_runs_per_batch() -> None:
    """The check's Python work does not grow with its batches: 20,000 batches (about 6 MiB
    of metadata) in one window cost a handful of calls more than ~20 do: one gather and one
    check per MiB of metadata (counted by the profiler's calls into this package, not
    timed). Windows, likewise, are per 4 MiB of data mapped, never per batch."""
    import cProfile
    import pstats

    def calls(batch_rows: int) -> tuple[int, int]:
        slab = make_slab(rows_table(20_000, seed=5), kind=KeyKind.HASH, batch_rows=batch_rows)
        index = pa.ipc.open_stream(slab.index).read_all()
        prof = cProfile.Profile()
        prof.runcall(check.data_section, _Bytes(slab.data), KeyKind.HASH, index, 1 << 30)
        stats = pstats.Stats(prof)
        count = sum(s[1] for (file, _, _), s in stats.stats.items()  # type: ignore[attr-defined]
                    if "shuffled" in file)
        return count, index.num_rows

    (few, twenty), (many, batches) = calls(1000), calls(1)
    assert twenty < 30 and batches == 20_000
    assert many - few <= 6 * 2 * 5, (few, many)  # per MiB: a gather, a check (5 calls each)


def test_declared_metadata_cannot_size_the_checks_memory() -> None:
    """A batch declaring 2 MiB of metadata (inside a batch the index says is that long) is
    refused before anything is gathered: the gather costs 5 bytes a byte of metadata."""
    from shuffled.storage.ondisk import messages

    data, index = _slab()
    first = index.column("offset")[0].as_py()
    meta = 2 << 20
    assert meta > messages.MAX_METADATA
    body = (data[:first] + b"\xff\xff\xff\xff" + meta.to_bytes(4, "little")
            + bytes(meta) + wire.EOS)
    cols = {name: index.column(name).to_pylist()[:1] for name in index.column_names}
    cols["length"] = [8 + meta]
    lying = pa.table(cols, schema=index.schema)
    with pytest.raises(InvalidBody, match="bytes of metadata"):
        _bulk(body, KeyKind.HASH, lying)

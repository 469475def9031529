"""Test data: real Arrow IPC streams of a given size (the daemon validates every body),
written once to files that both sides then serve or receive byte for byte."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

START, END = "2018-01-01T00:00:00.000Z", "2018-01-02T00:00:00.000Z"
_ROW_BYTES = 32  # four int64 columns
_BATCH_ROWS = 1 << 16


def arrow_stream(size: int, seed: int) -> bytes:
    """An Arrow IPC stream of about ``size`` bytes (four int64 columns, random values)."""
    rows = max(1, (size - 1024) // _ROW_BYTES)
    rng = np.random.default_rng(seed)
    schema = pa.schema([("__time", pa.int64()), ("dim", pa.int64()), ("count", pa.int64()),
                        ("sum", pa.int64())])
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema) as writer:
        for first in range(0, rows, _BATCH_ROWS):
            n = min(_BATCH_ROWS, rows - first)
            cols = [pa.array(1514764800000 + np.arange(first, first + n, dtype=np.int64))]
            cols += [pa.array(rng.integers(0, 1 << 40, n, dtype=np.int64)) for _ in range(3)]
            writer.write_batch(pa.record_batch(cols, schema=schema))
    return sink.getvalue()


@dataclass(frozen=True)
class PartialFile:
    """One partial segment's bytes on disk, and the ids it is stored under in shuffled."""

    path: Path
    sub: str
    size: int

    @property
    def name(self) -> str:
        return self.path.name


def write_partials(directory: Path, count: int, size: int, seed: int = 0) -> list[PartialFile]:
    """``count`` partial-segment files of ~``size`` bytes in ``directory`` (distinct data)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        body = arrow_stream(size, seed * 1_000_003 + i)
        path = directory / f"p{i:05d}.arrow"
        path.write_bytes(body)
        out.append(PartialFile(path, f"sub{i:05d}", len(body)))
    return out


def total(files: list[PartialFile]) -> int:
    """Bytes in ``files``."""
    return sum(f.size for f in files)

"""Validating a large streamed partial maps little of its pack at once (arrowfile.inspect).

A pack just written sits in the page cache in large folios, and a fault on a mapping maps
the whole folio: validating a 256 MiB partial through a plain memory map raised the
daemon's peak RSS by 50-100 MiB for a few milliseconds (comparison 4 of the bench, the
256 MiB PUT). The validated part is now dropped from the mapping as it goes.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from shuffled.storage.ondisk import arrowfile

MIB = 1 << 20


def _status(name: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(name)


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux peak RSS")
def test_inspect_of_a_large_partial_maps_little_at_once(tmp_path: Path) -> None:
    table = pa.table({"x": np.arange(24 * MIB, dtype=np.int64)})  # 192 MiB of values
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1 << 17):  # 1 MiB batches
            writer.write_batch(batch)
    del table, batch
    stream = sink.getbuffer()
    path = tmp_path / "1.pack"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:  # written as the daemon writes a pack: os.write in 1 MiB steps, after 3 bytes
        os.write(fd, b"abc")
        for at in range(0, len(stream), MIB):
            os.write(fd, stream[at: at + MIB])
    finally:
        os.close(fd)
    size = len(stream)
    del stream, sink
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # the peak counts from here
    before = _status("VmRSS")
    facts = arrowfile.inspect(str(path), size, body_crc=0, offset=3)
    grew = _status("VmHWM") - before
    assert facts.rows == 24 * MIB and facts.batches == 192
    # 12.2-12.4 MiB here through a plain map (the daemon's own packs: 50-100), 1.4 now.
    assert grew < 6 * MIB, f"validating mapped {grew / MIB:.1f} MiB at its peak"

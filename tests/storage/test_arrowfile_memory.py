"""Validating an upload does not make the file resident in the daemon (flat RSS).

Found by the benchmarks (bench/memory.py): checksumming the stream through a memory map
touched every page, so VmHWM grew by the size of every partial segment being validated.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

from shuffled.crc import crc32c
from shuffled.storage.ondisk import arrowfile

SIZE_MIB = 96

PROBE = """
import sys
from shuffled.storage.ondisk import arrowfile

def hwm():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:")) // 1024

path, size, small, small_size = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
arrowfile.inspect(small, small_size)  # first-use allocations happen before measuring
before = hwm()
facts = arrowfile.inspect(path, size)
print(hwm() - before, facts.rows)
"""


def _write_stream(path: Path, mib: int) -> int:
    rows = (mib << 20) // 16
    schema = pa.schema([("a", pa.int64()), ("b", pa.int64())])
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for first in range(0, rows, 1 << 16):
            n = min(1 << 16, rows - first)
            col = pa.array(np.arange(first, first + n, dtype=np.int64))
            writer.write_batch(pa.record_batch([col, col], schema=schema))
    return rows


def test_inspect_keeps_checksums_and_rss_flat(tmp_path: Path) -> None:
    path = tmp_path / "big.arrow"
    rows = _write_stream(path, SIZE_MIB)
    size = path.stat().st_size
    small = tmp_path / "small.arrow"
    _write_stream(small, 1)
    data = path.read_bytes()
    facts = arrowfile.inspect(str(path), size)
    eos = len(arrowfile.EOS)
    assert facts.rows == rows
    assert facts.schema_crc == crc32c(data[: facts.schema_len])
    assert facts.body_crc == crc32c(data[facts.schema_len: size - eos])
    del data
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), str(size), str(small),
         str(small.stat().st_size)],
        capture_output=True, text=True, timeout=120, check=True)
    growth_mib, seen_rows = (int(x) for x in probe.stdout.split())
    assert seen_rows == rows
    assert growth_mib < SIZE_MIB // 3, f"VmHWM grew {growth_mib} MiB validating {SIZE_MIB} MiB"

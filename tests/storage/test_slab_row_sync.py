"""A slab's catalog row commits without waiting for the WAL's fsync: the synced and renamed
file is the commit, and a row a power loss takes is rebuilt from the file at start
(``tests/slab/test_slab_crashes.py``). The partials' rows committed after it still wait
for theirs (``synchronous`` is FULL again), and a row that fails takes its file with it."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from shuffled.storage.catalog import Catalog
from shuffled.storage.ondisk.slabrows import SlabRow
from shuffled.storage.slabs.service import Slabs

ROWS = 20
_SCRIPT = """
import sys
from pathlib import Path
from shuffled.storage.catalog import Catalog
from shuffled.storage.ondisk import slabrows
from shuffled.storage.ondisk.slabrows import SlabRow
catalog = Catalog(Path(sys.argv[1]), fsync=True)
catalog.open()
print("opened", flush=True)
for i in range(int(sys.argv[3])):
    row = SlabRow("t", "s", i, 0, 1, 10, 1, 0, 10, 0, 0.0, b"", b"")
    if sys.argv[2] == "slab":
        catalog.insert_slab(row)
    else:  # as a slab's row was committed before: autocommit under synchronous=FULL
        slabrows.insert(catalog.writer, row)
print("synchronous", catalog.writer.execute("PRAGMA synchronous").fetchone()[0], flush=True)
"""


def _row(i: int) -> SlabRow:
    return SlabRow("t", "s", i, 0, 1, 10, 1, 0, 10, 0, 0.0, b"", b"")


def _syncs(root: Path, mode: str, tmp_path: Path) -> tuple[int, str]:
    """fsync/fdatasync calls of the script's inserts (strace), and what it printed."""
    trace = tmp_path / f"{mode}.trace"
    done = subprocess.run(
        ["strace", "-f", "-e", "trace=fsync,fdatasync,write", "-o", str(trace),
         sys.executable, "-c", _SCRIPT, str(root), mode, str(ROWS)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    lines = trace.read_text().splitlines()
    # Only the inserts' syncs: the catalog's creation and its checkpoint at exit sync
    # whatever the mode.
    opened = next(i for i, line in enumerate(lines) if "opened" in line)
    done_at = next(i for i, line in enumerate(lines) if "synchronous" in line)
    return sum(1 for line in lines[opened:done_at] if "sync(" in line), done.stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_slab_row_waits_for_no_wal_fsync_and_partials_still_do(tmp_path: Path) -> None:
    (tmp_path / "slab").mkdir()
    (tmp_path / "synced").mkdir()
    unsynced, said = _syncs(tmp_path / "slab", "slab", tmp_path)
    synced, _ = _syncs(tmp_path / "synced", "synced", tmp_path)
    assert synced >= ROWS  # the check can fail: a synced commit is one fsync at least
    assert unsynced == 0, unsynced
    assert "synchronous 2" in said  # FULL again for the partials' commits


def test_the_mode_is_restored_when_the_row_fails(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path, fsync=True)
    catalog.open()
    try:
        assert catalog.insert_slab(_row(1)) is True
        assert catalog.insert_slab(_row(1)) is False  # held: ignored, not replaced
        with pytest.raises(OSError):  # a value SQLite cannot bind: raised as the disk's error
            catalog.insert_slab(_row(2)._replace(idx=object()))  # type: ignore[arg-type]
        assert catalog.writer.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        catalog.close()


class _FailingCatalog(Catalog):
    def insert_slab(self, row: SlabRow) -> bool:
        raise OSError(errno.EIO, "catalog: disk I/O error")


def test_a_row_that_fails_takes_its_file_with_it(tmp_path: Path) -> None:
    """No row, no file: the upload fails as a whole, nothing left to rebuild at start."""
    catalog = _FailingCatalog(tmp_path, fsync=True)
    catalog.open()
    try:
        (tmp_path / "t").mkdir()
        tmp, final = tmp_path / "t" / ".s.0.0.slab.x.tmp", tmp_path / "t" / "s.0.0.slab"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"slab bytes")
        owner = SimpleNamespace(settings=SimpleNamespace(fsync=True),
                                disks=[SimpleNamespace(catalog=catalog)])
        with pytest.raises(OSError):
            Slabs._commit(owner, 0, fd, tmp, final, _row(1))  # type: ignore[arg-type]
        assert list((tmp_path / "t").iterdir()) == []
    finally:
        catalog.close()

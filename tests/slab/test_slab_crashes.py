"""A slab is whole or absent across a SIGKILL at any point of its upload, and the slab
files are the source of truth: a catalog that lags them is rebuilt at start, a row whose
file is gone is dropped. Real daemon processes (``python -m shuffled serve``), real files."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from shuffled.client import ShuffleClient
from shuffled.errors import ShuffleError
from shuffled.protocol import Interval
from shuffled.slab.wire import KeyKind
from tests.helpers.clients import FAST
from tests.helpers.procs import DaemonProcess
from tests.helpers.slabs import HOUR, make_slab, rows_table

SLABS_EACH = 8


def _rows(url: str, sup: str) -> int | None:
    """All rows of the task's slab (three chunks, no key bounds), or None when absent."""
    with ShuffleClient(url, retry=FAST) as client:
        try:
            client.seal(sup, ["sub0"])
        except ShuffleError:
            return None
        total = 0
        for c in range(3):
            read = client.read_shard(sup, Interval(c * HOUR, (c + 1) * HOUR), None, None)
            if read.slabs == 0:
                return None
            total += read.rows
        return total


def _tmp_files(roots: list[Path]) -> list[Path]:
    return [p for root in roots for p in root.rglob(".*.tmp")]


@pytest.mark.parametrize("round_", range(3))
def test_sigkill_during_uploads_leaves_each_slab_whole_or_absent(tmp_path: Path,
                                                                  round_: int) -> None:
    rng = random.Random(round_)
    roots = [tmp_path / "a", tmp_path / "b"]
    slabs = {f"crash{i}": make_slab(rows_table(20_000, seed=i), kind=KeyKind.HASH, batch_rows=64)
             for i in range(SLABS_EACH)}
    acked: list[str] = []
    reached = threading.Event()
    kill_after = rng.randrange(SLABS_EACH - 2)  # acknowledged slabs before the kill
    daemon = DaemonProcess(roots, log_path=tmp_path / "d.log")
    url = daemon.start()

    def upload() -> None:
        with ShuffleClient(url, retry=FAST) as client:
            for sup, slab in slabs.items():
                try:
                    client.put_slab(sup, slab)
                except (ShuffleError, OSError):
                    return
                acked.append(sup)
                if len(acked) > kill_after:
                    reached.set()

    worker = threading.Thread(target=upload, daemon=True)
    worker.start()
    assert reached.wait(timeout=60)
    time.sleep(rng.uniform(0.0, 0.01))  # a random point inside the next upload
    daemon.kill()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(acked) < SLABS_EACH  # the kill came before the last upload was answered
    with DaemonProcess(roots, log_path=tmp_path / "d2.log") as again:
        for sup, slab in slabs.items():
            got = _rows(again.url, sup)
            if sup in acked:
                assert got == slab.rows, (sup, got)
            else:
                assert got in (None, slab.rows), (sup, got)  # whole or nothing
        assert _tmp_files(roots) == []


def test_the_catalog_follows_the_slab_files(tmp_path: Path) -> None:
    roots = [tmp_path / "a"]
    kept, lost = make_slab(rows_table(900, seed=1)), make_slab(rows_table(700, seed=2))
    with DaemonProcess(roots) as daemon, ShuffleClient(daemon.url, retry=FAST) as client:
        client.put_slab("kept", kept)
        client.put_slab("lost", lost)
    catalog = roots[0] / ".shuffled" / "catalog.sqlite"
    conn = sqlite3.connect(catalog)
    try:  # a crash between the rename and the row: the row never landed
        conn.execute("DELETE FROM slabs WHERE sup = 'kept'")
        conn.commit()
    finally:
        conn.close()
    for f in (roots[0] / "lost").glob("*.slab"):
        f.unlink()  # and a file gone under its row (fsync off and a power loss)
    with DaemonProcess(roots) as daemon:
        assert _rows(daemon.url, "kept") == kept.rows
        assert _rows(daemon.url, "lost") is None
        with ShuffleClient(daemon.url) as client:
            listing = client.task("kept")
            assert listing is not None and listing["files"] == 1

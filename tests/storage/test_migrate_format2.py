"""Storage format 2 (shuffled 0.1.0) is refused at start, naming ``shuffled migrate``, and
migrated in place without loss: the fixture is a location written by 0.1.0 itself
(tests/data/make_format2_location.py says how), so this is the upgrade a user makes."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from shuffled.client import ShuffleClient
from shuffled.errors import SealedConflict
from shuffled.protocol import Interval, PartialKey, PartitionKey
from shuffled.storage.lifecycle import migrate
from shuffled.storage.ondisk import layout
from shuffled.storage.lifecycle.migrate import migrate_location
from tests.conftest import catalog_rows, pack_files
from tests.helpers.procs import DaemonProcess

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = DATA.parent.parent


def _location(tmp_path: Path) -> Path:
    with tarfile.open(DATA / "format2-location.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "loc"


def _key(text: str) -> PartialKey:
    """A key as ``str(PartialKey)`` writes it: ``sup/sub start/end partition N``."""
    ids, interval, _, pid = text.split(" ")
    sup, sub = ids.split("/")
    start, end = interval.split("/")
    return PartialKey(sup, sub, Interval.parse(start, end), int(pid))


def _serve(loc: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shuffled", "serve", "--port", "0",
                           "--location", str(loc)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_a_format_2_location_is_refused_then_migrated_in_place(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    loc = _location(tmp_path)
    expected = {_key(k): v for k, v in json.loads(
        (DATA / "format2-expected.json").read_text()).items()}
    packs_before = {p.name: p.read_bytes() for p in pack_files(loc)}
    assert layout.read_format(loc) == 2

    refused = _serve(loc)
    assert refused.returncode == 2, refused.stderr
    assert "storage format 2" in refused.stderr and "shuffled migrate" in refused.stderr

    # Interrupted after the catalog was rewritten, before the format mark: still refused,
    # and a rerun does not shift the offsets a second time.
    def crash(root: Path, fsync: bool) -> None:
        raise OSError(5, "simulated crash before the format mark")

    monkeypatch.setattr(migrate.layout, "write_format", crash)
    with pytest.raises(OSError, match="simulated crash"):
        migrate_location(loc)
    monkeypatch.undo()
    assert "shuffled migrate" in _serve(loc).stderr
    done = subprocess.run([sys.executable, "-m", "shuffled", "migrate", "--location", str(loc)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and "format 2 -> 3: 8 partial segments" in done.stdout, done
    assert layout.read_format(loc) == layout.FORMAT_VERSION
    # No data moved: the packs are as 0.1.0 left them (the daemon cuts only the last
    # stream's end-of-stream marker, which format 3 does not store).
    assert {p.name: p.read_bytes() for p in pack_files(loc)} == packs_before

    with DaemonProcess([loc], log_path=tmp_path / "d.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for k, facts in expected.items():  # every partial byte for byte, digest-checked
            body = client.get_partial(k)
            assert (len(body), zlib.crc32(body)) == (facts["bytes"], facts["crc32"]), k
        for pid in range(3):  # the aggregate of a partition, zero-copy path
            part = PartitionKey("task1", Interval.parse("2018-01-01T00:00:00Z",
                                                        "2018-01-02T00:00:00Z"), pid)
            assert client.get_partition(part)
        both = PartitionKey("task2", Interval.parse("2018-01-02T00:00:00Z",
                                                    "2018-01-03T00:00:00Z"), 1)
        assert client.get_partition(both)  # dictionaries: the re-encoding path
        assert client.task_state("task1")["state"] == "sealed"  # the seal is kept
        listing = client.task("task1")
        assert listing is not None and listing["files"] == 6
        # An ordinary location now: a replace (of the unsealed task: a sealed subtask's
        # partials never change) and a delete work.
        sealed = next(k for k in expected if k.supervisor_task_id == "task1")
        with pytest.raises(SealedConflict):
            client.put_partial(sealed, client.get_partial(sealed))
        k = next(k for k in expected if k.supervisor_task_id == "task2")
        client.put_partial(k, client.get_partial(_key(str(k))))
        client.delete_task("task2")
        assert not (loc / "task2").exists() and catalog_rows(loc, "task2") == []
    again = subprocess.run([sys.executable, "-m", "shuffled", "migrate", "--location", str(loc)],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout

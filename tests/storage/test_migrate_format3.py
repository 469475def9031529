"""Storage format 3 (the release before slabs) is refused at start, naming
``shuffled migrate``, and migrated in place without loss: the fixture is a location written
by that release itself (tests/data/make_format3_location.py says how)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval
from shuffled.storage.ondisk import layout
from tests.conftest import pack_files
from tests.helpers.procs import DaemonProcess
from tests.helpers.slabs import HOUR, make_slab, rows_table
from tests.storage.test_migrate_format2 import _key

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = DATA.parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shuffled", *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_a_format_3_location_is_refused_then_migrated_in_place(tmp_path: Path) -> None:
    with tarfile.open(DATA / "format3-location.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    loc = tmp_path / "loc"
    expected = {_key(k): v for k, v in json.loads(
        (DATA / "format3-expected.json").read_text()).items()}
    packs_before = {p.name: p.read_bytes() for p in pack_files(loc)}
    assert layout.read_format(loc) == 3

    refused = _run("serve", "--port", "0", "--location", str(loc))
    assert refused.returncode == 2, refused.stderr
    assert "storage format 3" in refused.stderr and "shuffled migrate" in refused.stderr

    done = _run("migrate", "--location", str(loc))
    assert done.returncode == 0 and "format 3 -> 4" in done.stdout, done
    assert "format 4 -> 5" in done.stdout, done
    assert layout.read_format(loc) == 5
    assert {p.name: p.read_bytes() for p in pack_files(loc)} == packs_before  # nothing moved

    with DaemonProcess([loc], log_path=tmp_path / "d.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for k, facts in expected.items():  # every partial byte for byte
            body = client.get_partial(k)
            assert (len(body), zlib.crc32(body)) == (facts["bytes"], facts["crc32"]), k
        assert client.task_state("task1")["state"] == "sealed"  # the seal is kept
        # A format-5 location: it takes slabs beside the partials it kept.
        rows = rows_table(300)
        client.put_slab("task3", make_slab(rows))
        client.seal("task3", ["sub0"])
        read = client.read_shard("task3", Interval(0, HOUR), None, None)
        assert read.rows == sum(1 for t in rows["__time"].to_pylist() if t < HOUR)
    again = _run("migrate", "--location", str(loc))
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout

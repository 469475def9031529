"""Commit records (storage format 5): a group commit syncs each pack once, its partials and
the record naming them, and the catalog's transaction no longer waits for the WAL. So the
pack is the truth, and a catalog a power loss left behind is brought up to date from the
records at start. A power loss is modelled by putting back a copy of the catalog taken
before the writes it lost (the packs keep what their fdatasync made durable); a SIGKILL
loop with that model is in test_packs.py (the ``lost`` case)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from shuffled.client import ShuffleClient
from shuffled.crc import crc32c
from shuffled.protocol import Interval, PartialKey
from shuffled.storage.ondisk import commits, layout
from shuffled.storage.ondisk.records import CatalogRow
from tests.conftest import arrow_bytes, catalog_rows, pack_files, pack_records, sample_table
from tests.helpers.procs import DaemonProcess
from tests.helpers.slabs import HOUR, rows_table

INTERVAL = Interval.parse("2018-01-01T00:00:00Z", "2018-01-02T00:00:00Z")


def key(sub: str, pid: int = 0) -> PartialKey:
    return PartialKey("sup", sub, INTERVAL, pid)


def _row(sub: str, generation: int = 7, offset: int = 100) -> CatalogRow:
    return CatalogRow("sup", 0, 3_600_000, 2, sub, generation, 1, offset, 500, 10, 0xDEAD,
                      120, 0xBEEF, 0xCAFE, 0, 1.5, 0)


# --- the record itself -------------------------------------------------------------------


def _pack_with(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / "1.pack"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


def test_records_are_read_back_between_other_bytes(tmp_path: Path) -> None:
    k = secrets.token_bytes(commits.KEY_LEN)
    rows = [_row("a"), _row("é-b", generation=9, offset=700)]
    first = commits.encode(k, "sup", 1, 50, rows)
    second = commits.encode(k, "sup", 1, 50 + len(first) + 30, rows[:1])
    fd = _pack_with(tmp_path, os.urandom(50) + first + os.urandom(30) + second + os.urandom(9))
    try:
        found = commits.scan(fd, 0, os.fstat(fd).st_size, k, "sup", 1)
    finally:
        os.close(fd)
    assert [(r.at, r.end) for r in found] == [
        (50, 50 + len(first)), (80 + len(first), 80 + len(first) + len(second))]
    assert found[0].rows == rows and found[1].rows == rows[:1]


@pytest.mark.parametrize("change", ["another key", "another offset", "another pack",
                                    "torn", "a flipped byte", "a huge length"])
def test_a_record_is_taken_only_where_and_as_it_was_written(tmp_path: Path,
                                                             change: str) -> None:
    """What a client can put in a body (a record made without the location's key, or a
    copy of one at another place) and what a power loss can leave (a record cut short or
    damaged) is never read as a commit."""
    k = secrets.token_bytes(commits.KEY_LEN)
    at, number = 40, 1
    if change == "another key":
        record = commits.encode(secrets.token_bytes(commits.KEY_LEN), "sup", 1, at, [_row("a")])
    elif change == "another offset":
        record = commits.encode(k, "sup", 1, at + 8, [_row("a")])
    elif change == "another pack":
        record = commits.encode(k, "sup", 1, at, [_row("a")])
        number = 2
    else:
        record = commits.encode(k, "sup", 1, at, [_row("a")])
        if change == "torn":
            record = record[: len(record) - 5]
        elif change == "a flipped byte":
            record = record[:30] + bytes([record[30] ^ 1]) + record[31:]
        else:  # the payload's length field: past the file, never read as one
            record = record[:8] + (1 << 31).to_bytes(4, "little") + record[12:]
    fd = _pack_with(tmp_path, os.urandom(at) + record)
    try:
        assert commits.scan(fd, 0, os.fstat(fd).st_size, k, "sup", number) == []
    finally:
        os.close(fd)


# --- a catalog older than its packs --------------------------------------------------------


def _save_catalog(loc: Path, to: Path) -> None:
    to.mkdir()
    for f in layout.meta_dir(loc).glob(layout.CATALOG_NAME + "*"):
        shutil.copy(f, to / f.name)


def _put_back_catalog(loc: Path, saved: Path) -> None:
    """What a power loss leaves of a catalog whose last transactions were not synced."""
    for f in layout.meta_dir(loc).glob(layout.CATALOG_NAME + "*"):
        f.unlink()
    for f in saved.iterdir():
        shutil.copy(f, layout.meta_dir(loc) / f.name)


def _empty_location(tmp_path: Path) -> Path:
    """A location made by a daemon that took nothing; its empty catalog saved in
    ``tmp_path / "saved"`` (what a power loss may leave after the writes that follow)."""
    loc = tmp_path / "a"
    with DaemonProcess([loc], "--fsync", "true", log_path=tmp_path / "d1.log"):
        pass
    _save_catalog(loc, tmp_path / "saved")
    return loc


def _served(url: str, keys: list[PartialKey]) -> dict[str, bytes]:
    with ShuffleClient(url) as client:
        held = {s["subTaskId"] for p in client.task("sup")["partitions"] for s in p["subTasks"]}
        return {k.sub_task_id: client.get_partial(k) for k in keys if k.sub_task_id in held}


def _forged(loc: Path, victim: str) -> bytes:
    """An Arrow stream whose column holds a commit record naming ``victim``'s bytes under
    the key "forged", made without the location's key (a client cannot know it)."""
    row = next(r for r in catalog_rows(loc, "sup") if r[0] == victim)
    sub, start, end, pid, generation, pack, offset, size, crc, body_end, schema_at = row
    data = (loc / "sup" / f"{pack}.pack").read_bytes()
    schema_len = size - (body_end - offset) - 8
    # Every digest right: only the MAC stands between this and a restored row.
    named = [CatalogRow("sup", start, end, pid, "forged", generation * 2, pack, offset, size,
                        1, crc, schema_len, crc32c(data[schema_at: schema_at + schema_len]),
                        crc32c(data[offset: body_end]), 0, 0.0, schema_at)]
    record = commits.encode(secrets.token_bytes(commits.KEY_LEN), "sup", pack, 0, named)
    table = pa.table({"__time": pa.array([1514764800000], pa.int64()),
                      "blob": pa.array([record], pa.binary())})
    return arrow_bytes(table)


def test_a_catalog_older_than_its_packs_is_brought_up_to_date(tmp_path: Path) -> None:
    loc = tmp_path / "a"
    bodies = {f"s{i}": arrow_bytes(sample_table(40 + i, seed=i)) for i in range(3)}
    with DaemonProcess([loc], "--fsync", "true", log_path=tmp_path / "d1.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for sub, body in bodies.items():
            client.put_partial(key(sub), body)
    _save_catalog(loc, tmp_path / "saved")
    # What the saved catalog will not know: a replacement, new single PUTs, a bulk upload
    # (one record for many partials), and a body carrying a record a client made.
    later = {"s1": arrow_bytes(sample_table(90, seed=41)), "s3": arrow_bytes(sample_table(7)),
             "attack": _forged(loc, "s0")}
    bulk = {f"b{i}": arrow_bytes(sample_table(5 + i, seed=50 + i)) for i in range(30)}
    with DaemonProcess([loc], "--fsync", "true", log_path=tmp_path / "d2.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for sub, body in later.items():
            client.put_partial(key(sub), body)
        answers = client.put_partials("sup", [(key(s), b) for s, b in bulk.items()])
        assert [a["status"] for a in answers] == ["created"] * len(bulk), answers
    _put_back_catalog(loc, tmp_path / "saved")
    assert {r[0] for r in catalog_rows(loc, "sup")} == set(bodies)  # it lags
    expected = {**bodies, **later, **bulk}
    with DaemonProcess([loc], log_path=tmp_path / "d3.log") as daemon:
        got = _served(daemon.url, [key(s) for s in [*expected, "forged"]])
    assert got == expected  # s1 replaced, nothing forged, every byte as sent
    restored = re.findall(r"restored (\d+) partial segment", (tmp_path / "d3.log").read_text())
    assert sum(map(int, restored)) == 33  # s1, s3, attack and the bulk upload's 30 partials
    # Restored rows are durable rows: a second start restores nothing more.
    with DaemonProcess([loc], log_path=tmp_path / "d4.log") as daemon:
        assert _served(daemon.url, [key(s) for s in expected]) == expected
    assert "from the pack's commit records" not in (tmp_path / "d4.log").read_text()


@pytest.mark.parametrize("damage", ["its record torn", "its body torn", "its schema torn"])
def test_a_group_commit_torn_by_a_power_loss_is_not_restored(tmp_path: Path,
                                                              damage: str) -> None:
    """The last group's record and bodies are synced together, before its answer: a record
    cut short, or bodies or a schema message that fail their CRC32C, mean that sync did not
    finish and nothing of the group was acknowledged. Every group before it is restored."""
    loc = _empty_location(tmp_path)
    bodies = {f"s{i}": arrow_bytes(sample_table(30 + i, seed=i)) for i in range(3)}
    # The last one of another schema: its schema message is written in its own group.
    last_table = sample_table(33, seed=3)
    bodies["s3"] = arrow_bytes(last_table.append_column("extra", pa.array([1] * 33)))
    with DaemonProcess([loc], "--fsync", "true", log_path=tmp_path / "d2.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for sub, body in bodies.items():  # one at a time: one pack, one record each
            client.put_partial(key(sub), body)
    (pack,) = pack_files(loc, "sup")
    records = pack_records(pack)
    assert len(records) == 4 and records[-1].end == pack.stat().st_size
    last = records[-1]
    if damage == "its record torn":
        os.truncate(pack, last.end - 7)
    else:
        (row,) = last.rows
        at = row.offset + 10 if damage == "its body torn" else row.schema_at + 10
        assert row.schema_at >= records[-2].end  # its own schema message, in its group
        with open(pack, "r+b") as fh:
            fh.seek(at)
            byte = fh.read(1)
            fh.seek(at)
            fh.write(bytes([byte[0] ^ 0xFF]))
    _put_back_catalog(loc, tmp_path / "saved")
    with DaemonProcess([loc], log_path=tmp_path / "d3.log") as daemon:
        got = _served(daemon.url, [key(s) for s in bodies])
    assert got == {s: b for s, b in bodies.items() if s != "s3"}
    # Cut back to the end of the last good record: nothing of the torn group stays.
    assert pack.stat().st_size == records[-2].end


# --- format 4, written by the release before records ------------------------------------------


DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = DATA.parent.parent


def test_a_format_4_location_is_refused_then_migrated_in_place(tmp_path: Path) -> None:
    """tests/data/make_format4_location.py says how the fixture was made, by that release."""
    import json
    import sys
    import tarfile
    import zlib

    with tarfile.open(DATA / "format4-location.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    loc = tmp_path / "loc"
    expected = json.loads((DATA / "format4-expected.json").read_text())
    packs_before = {p: p.read_bytes() for p in pack_files(loc)}
    slabs_before = {p: p.read_bytes() for p in loc.glob("*/*.slab")}
    assert layout.read_format(loc) == 4 and slabs_before

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "shuffled", *args], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)

    refused = run("serve", "--port", "0", "--location", str(loc))
    assert refused.returncode == 2, refused.stderr
    assert "storage format 4" in refused.stderr and "shuffled migrate" in refused.stderr
    done = run("migrate", "--location", str(loc))
    assert done.returncode == 0 and "format 4 -> 5" in done.stdout, done
    assert layout.read_format(loc) == 5
    assert len(commits.key_path(loc).read_bytes()) == commits.KEY_LEN
    assert {p: p.read_bytes() for p in pack_files(loc)} == packs_before  # nothing moved
    assert {p: p.read_bytes() for p in loc.glob("*/*.slab")} == slabs_before
    again = run("migrate", "--location", str(loc))
    assert again.returncode == 0, again

    with DaemonProcess([loc], log_path=tmp_path / "d.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        for name, facts in expected.items():
            sup, rest = name.split("/", 1)
            sub, iv, _, pid = rest.split(" ")
            start, end = iv.split("/")
            body = client.get_partial(PartialKey(sup, sub, Interval.parse(start, end), int(pid)))
            assert (len(body), zlib.crc32(body)) == (facts["bytes"], facts["crc32"]), name
        assert client.task_state("task1")["state"] == "sealed"
        assert client.task_state("task3")["state"] == "sealed"
        rows = rows_table(300)  # the slab the fixture holds (see make_format4_location.py)
        read = client.read_shard("task3", Interval(0, HOUR), None, None)
        assert read.rows == sum(1 for t in rows["__time"].to_pylist() if t < HOUR)
        # Format 5 from here: its packs get records.
        client.put_partial(key("new"), arrow_bytes(sample_table(12)))
    (new_pack,) = [p for p in pack_files(loc, "sup")]
    assert len(pack_records(new_pack)) == 1


def test_a_start_reads_back_only_the_bodies_the_catalog_lacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clean restart finds each pack's last record past the last body the catalog knows
    (the record naming that body): its rows are held, so no body is read again."""
    from shuffled.storage.catalog import Catalog
    from shuffled.storage.lifecycle import reconcile

    loc = _empty_location(tmp_path)
    bulk = {f"b{i}": arrow_bytes(sample_table(5 + i, seed=i)) for i in range(20)}
    with DaemonProcess([loc], "--fsync", "true", log_path=tmp_path / "d2.log") as daemon, \
            ShuffleClient(daemon.url) as client:
        client.put_partials("sup", [(key(s), b) for s, b in bulk.items()])
    read: list[str] = []
    checked = reconcile._body_ok

    def counting(fd: int, row: CatalogRow, size: int) -> bool:
        read.append(row.sub)
        return checked(fd, row, size)
    monkeypatch.setattr(reconcile, "_body_ok", counting)
    commit_key = commits.key_path(loc).read_bytes()

    def start() -> int:
        catalog = Catalog(loc, fsync=True)
        catalog.open()
        try:
            return reconcile.reconcile(loc, catalog, key=commit_key).restored
        finally:
            catalog.close()
    assert start() == 0 and read == []  # the catalog is current
    _put_back_catalog(loc, tmp_path / "saved")
    assert start() == len(bulk) and sorted(read) == sorted(bulk)

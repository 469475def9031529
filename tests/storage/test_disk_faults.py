"""A location turns read-only or fills up mid-run, for real.

The daemon runs in a private mount namespace (``unshare --mount --propagation private``), so
a test can bind-mount one of its locations read-only, or give it a small tmpfs and fill it,
without touching the host's mounts; everything vanishes with the daemon. Needs root (or
CAP_SYS_ADMIN); skipped where mount namespaces are not available.

What must hold: the location is marked unhealthy (``/status`` and
``shuffled_location_healthy``), new writes go to the other location, reads of its existing
data still work, the health probe keeps it out while the fault lasts, and it returns to
service once the fault is gone; no temp file is left behind.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled.client import ShuffleClient
from shuffled.client.http import NO_RETRY
from shuffled.crc import crc32c
from shuffled.errors import ShuffleError
from shuffled.protocol import Interval, PartialKey, PartitionKey, format_crc32c
from tests.conftest import (
    DAY, PREFIX, arrow_bytes, catalog_rows, committed_bytes, data_size, files_under,
    pack_files, packed_size, sample_table,
)
from tests.helpers.procs import DaemonProcess, host_port, http_get, metric_value, wait_for

INTERVAL = Interval.parse(DAY["start"], DAY["end"])
QUERY = "start=2018-01-01&end=2018-01-02&partitionId=0"


def _mount_namespaces_work(tmp: Path) -> bool:
    probe = tmp / "ns-probe"
    probe.mkdir()
    script = f"mount -t tmpfs -o size=1m shuffled-test {probe} && umount {probe}"
    try:
        done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               script], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="module")
def namespaces(tmp_path_factory: pytest.TempPathFactory) -> None:
    if not _mount_namespaces_work(tmp_path_factory.mktemp("ns")):
        pytest.skip("needs mount namespaces (root or CAP_SYS_ADMIN) for a real read-only or "
                    "full file system")


# Each pack's length but its commit records, printed a line each (run in the namespace).
_DATA_SIZES = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
               "from pathlib import Path; "
               "from tests.conftest import data_size; "
               "print(*(data_size(p) for p in Path(sys.argv[1]).glob('*/*.pack')), sep='\\n')")


def in_ns(pid: int, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` inside the daemon's mount namespace."""
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *cmd], capture_output=True,
                          text=True, timeout=30, check=check)


def key(sub: str) -> PartialKey:
    return PartialKey("sup", sub, INTERVAL, 0)


class Watch:
    """The daemon's view of one location, from /status and /metrics."""

    def __init__(self, url: str, location: Path) -> None:
        self.url = url
        self.location = str(location)

    def status(self) -> dict[str, Any]:
        body = json.loads(http_get(f"{self.url}/status")[2])
        (loc,) = [x for x in body["locations"] if x["path"] == self.location]
        return loc

    def gauge(self) -> float | None:
        text = http_get(f"{self.url}/metrics")[2].decode()
        return metric_value(text, "shuffled_location_healthy", location=self.location)

    def probe_failed(self) -> bool:
        return (self.status()["lastError"] or "").startswith("probe failed")

    def healthy(self) -> bool:
        return bool(self.status()["healthy"])


@pytest.fixture
def start_ns_daemon(namespaces: None, tmp_path: Path) -> Iterator[Any]:
    started: list[DaemonProcess] = []

    def start(setup: str = "", *extra: str) -> DaemonProcess:
        script = (setup + " && " if setup else "") + 'exec "$@"'
        daemon = DaemonProcess(
            [tmp_path / "a", tmp_path / "b"], "--sweep-period", "0.1", *extra,
            wrapper=["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                     script, "sh"],
            log_path=tmp_path / "daemon.log")
        started.append(daemon)
        daemon.start()
        return daemon

    yield start
    for daemon in started:
        daemon.kill()


def put_all(client: ShuffleClient, subs: list[str], seed: int = 0) -> dict[str, tuple[bytes, str]]:
    """Upload one small partial per sub; {sub: (body, location it landed on)}."""
    out = {}
    for i, sub in enumerate(subs):
        body = arrow_bytes(sample_table(300 + i, seed=seed + i))
        out[sub] = (body, client.put_partial(key(sub), body)["location"])
    return out


def check_reads(client: ShuffleClient, stored: dict[str, tuple[bytes, str]]) -> None:
    for sub, (body, _) in stored.items():
        assert client.get_partial(key(sub)) == body
    assert client.get_partition(PartitionKey("sup", INTERVAL, 0), sorted(stored))


def test_read_only_location_is_taken_out_then_returns(start_ns_daemon: Any,
                                                      tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    daemon = start_ns_daemon()
    watch = Watch(daemon.url, a)
    with ShuffleClient(daemon.url) as client:
        before = put_all(client, [f"before{i}" for i in range(4)])
        assert {loc for _, loc in before.values()} == {str(a), str(b)}  # round-robin
        for i in range(2):  # a second task, on both locations, deleted while a is read-only
            client.put_partial(PartialKey("doomed", f"s{i}", INTERVAL, 0),
                               arrow_bytes(sample_table(50, seed=i)))
        in_ns(daemon.pid, "sh", "-c", f"mount --bind {a} {a} && mount -o remount,bind,ro {a}")
        assert in_ns(daemon.pid, "touch", f"{a}/.tmp/x", check=False).returncode != 0  # real

        during = put_all(client, [f"during{i}" for i in range(6)], seed=10)
        assert {loc for _, loc in during.values()} == {str(b)}  # every new write went to b
        status = watch.status()
        assert status["healthy"] is False and "Read-only" in status["lastError"]
        assert watch.gauge() == 0.0
        check_reads(client, {**before, **during})  # its existing data is still served
        with ShuffleClient(daemon.url, retry=NO_RETRY) as once:
            with pytest.raises(ShuffleError) as failed:  # never a success that left files
                once.delete_task("doomed")
        assert failed.value.status == 507 and str(a) in str(failed.value)
        assert (a / "doomed").exists() and not (b / "doomed").exists()
        wait_for(watch.probe_failed, "a failed probe while read-only")
        assert not watch.healthy()

        in_ns(daemon.pid, "umount", "-l", str(a))
        wait_for(watch.healthy, "the location to return to service")
        assert watch.gauge() == 1.0 and watch.status()["lastError"] is None
        after = put_all(client, [f"after{i}" for i in range(4)], seed=20)
        assert str(a) in {loc for _, loc in after.values()}  # it takes writes again
        check_reads(client, {**before, **during, **after})
        # Back in service, the daemon finishes the failed DELETE by itself (each sweep).
        wait_for(lambda: not (a / "doomed").exists(), "the leftovers of the failed DELETE to go")
        assert client.task("doomed") is None
    assert daemon.stop() == 0
    for loc in (a, b):
        assert list((loc / ".tmp").iterdir()) == []
        assert all(p.suffix == ".pack" for p in files_under(loc))
    # The packs hold exactly the partials stored (each key once), nothing of a failed write.
    stored = {**before, **during, **after}
    assert sum(data_size(p) for loc in (a, b) for p in pack_files(loc, "sup")) == sum(
        committed_bytes(loc, "sup") for loc in (a, b))
    assert sorted(r[0] for loc in (a, b) for r in catalog_rows(loc, "sup")) == sorted(stored)


def test_full_location_is_taken_out_then_returns(start_ns_daemon: Any, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    # A 16 MiB file system with a 4 MiB free-space reserve: once full, the upload's own
    # bytes (3 MiB, cut off its pack after the failure) do not free enough to bring it back.
    daemon = start_ns_daemon(f"mount -t tmpfs -o size=16m shuffled-test {shlex.quote(str(a))}",
                             "--free-space-reserve", str(4 << 20))
    watch = Watch(daemon.url, a)
    host, port = host_port(daemon.url)
    with ShuffleClient(daemon.url) as client:
        before = put_all(client, ["before0", "before1"])
        if before["before1"][1] == str(a):  # make the next round-robin choice a
            before.update(put_all(client, ["before2"], seed=2))
        # An upload lands on a with room to spare; then the file system fills up under it.
        big = arrow_bytes(sample_table(200_000, seed=7))
        assert 3 << 20 < len(big) < 6 << 20
        sock = socket.create_connection((host, port), timeout=30)
        try:
            sock.sendall(
                f"PUT {PREFIX}/tasks/sup/filling/partition?{QUERY} HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(big)}\r\nContent-Digest: {format_crc32c(crc32c(big))}"
                f"\r\n\r\n".encode() + big[: 3 << 20])
            wait_for(lambda: in_ns(daemon.pid, "find", f"{a}/sup", "-name", "*.pack",
                                   "-size", "+1M").stdout,
                     "the upload's bytes arriving in a pack on a")
            in_ns(daemon.pid, "sh", "-c", f"dd if=/dev/zero of={a}/filler bs=64k 2>/dev/null; "
                  "true")
            sock.sendall(big[3 << 20:])
            reply = sock.recv(65536).decode()
        finally:
            sock.close()
        assert reply.startswith("HTTP/1.1 507"), reply
        assert '"location_failed"' in reply  # retryable: another location may take it

        status = watch.status()
        # The failed write's ENOSPC, or the free-space probe's verdict if it ran since
        # (it did under a loaded machine: pytest-xdist -n 2).
        assert status["healthy"] is False and re.search(
            r"No space left|probe failed: only \d+ bytes free", status["lastError"]), status
        assert watch.gauge() == 0.0
        during = put_all(client, ["filling", "during0", "during1", "during2"], seed=10)
        assert {loc for _, loc in during.values()} == {str(b)}
        check_reads(client, {**before, **during})
        wait_for(watch.probe_failed, "a failed probe while full")

        in_ns(daemon.pid, "rm", f"{a}/filler")
        wait_for(watch.healthy, "the location to return to service")
        assert watch.gauge() == 1.0
        after = put_all(client, ["after0", "after1", "after2"], seed=20)
        assert str(a) in {loc for _, loc in after.values()}
        check_reads(client, {**before, **during, **after})
        assert in_ns(daemon.pid, "find", f"{a}/.tmp", "-type", "f").stdout == ""
        # Nothing of the upload the full disk refused is left in a's packs: they hold the
        # partials stored on a, byte for byte their sizes.
        packed = in_ns(daemon.pid, sys.executable, "-c", _DATA_SIZES, str(a)).stdout
        stored = {**before, **during, **after}
        assert sum(int(n) for n in packed.split()) == packed_size(
            [body for body, where in stored.values() if where == str(a)], len(packed.split()))
    assert daemon.stop() == 0
    assert sum(data_size(p) for p in pack_files(b, "sup")) == sum(
        committed_bytes(loc, "sup") for loc in (b,))


def test_concurrent_uploads_cannot_overrun_the_free_space(namespaces: None,
                                                          tmp_path: Path) -> None:
    """Sixteen 3 MiB uploads at once to the only location, a 24 MiB file system with a
    2 MiB reserve: each is stored or refused with a plain 507, the free-space check counts
    the writes under way (before, they each saw the same free space, ran into ENOSPC and
    took the location out of service until the next sweep). Space a DELETE frees takes
    uploads again at once, with the sweeper an hour away."""
    a = tmp_path / "a"
    a.mkdir()
    setup = f"mount -t tmpfs -o size=24m shuffled-test {shlex.quote(str(a))}"
    daemon = DaemonProcess(
        [a], "--free-space-reserve", str(2 << 20), "--sweep-period", "3600",
        "--max-concurrent-uploads", "32",
        wrapper=["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                 setup + ' && exec "$@"', "sh"],
        log_path=tmp_path / "daemon.log")
    daemon.start()
    try:
        watch = Watch(daemon.url, a)
        body = arrow_bytes(sample_table(120_000, seed=3))
        assert 2 << 20 < len(body) < 4 << 20
        outcomes: list[Any] = [None] * 16

        def put(i: int) -> None:
            with ShuffleClient(daemon.url, retry=NO_RETRY) as c:
                try:
                    outcomes[i] = "created" if c.put_partial(key(f"c{i}"), body)["bytes"] else None
                except ShuffleError as exc:
                    outcomes[i] = (exc.status, exc.code)

        threads = [threading.Thread(target=put, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert all(o is not None for o in outcomes), outcomes
        stored = [o for o in outcomes if o == "created"]
        assert stored and len(stored) < 16, outcomes
        assert {o for o in outcomes if o != "created"} == {(507, "insufficient_storage")}, \
            outcomes
        assert watch.healthy(), watch.status()
        with ShuffleClient(daemon.url) as c:
            c.delete_task("sup")
            assert c.put_partial(key("after"), body)["bytes"] == len(body)
    finally:
        daemon.kill()


_FULL_CATALOG = """
import errno, os, sys
from pathlib import Path
from shuffled.storage.catalog import Catalog
root = Path(sys.argv[1])
catalog = Catalog(root, fsync=True)
catalog.open()
row = ("sup", 0, 1, 0, "s{}", 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
with open(root / "filler", "wb") as fh:  # the file system full, to the last block
    try:
        while True:
            fh.write(b"\\0" * 65536)
    except OSError:
        pass
try:
    for i in range(2000):
        catalog.commit([(row[0], row[1], row[2], row[3], f"s{i}" * 40, i, *row[6:])])
except OSError as exc:
    print(exc.errno == errno.ENOSPC, exc)
else:
    print("no error")
"""


def test_a_full_disk_under_the_catalog_is_reported_as_full(namespaces: None,
                                                           tmp_path: Path) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL; the catalog's own ROLLBACK
    then failed and its "cannot rollback - no transaction is active" (EIO) hid the cause."""
    from shuffled.storage.catalog import COLUMNS
    assert len(COLUMNS) == 17  # the row the script writes
    root = tmp_path / "cat"
    root.mkdir()
    script = (f"mount -t tmpfs -o size=256k shuffled-test {shlex.quote(str(root))} && "
              f'exec "$@"')
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
         sys.executable, "-c", _FULL_CATALOG, str(root)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("True"), done.stdout
    assert "full" in done.stdout and "cannot rollback" not in done.stdout, done.stdout

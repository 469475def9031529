"""A daemon SIGKILLed mid-offload resumes after a restart (issue 24): a real ``shuffled
serve`` process with deep storage on a moto S3 server on loopback, its offload slowed to
one pack at a time at 300 KB/s, killed once the first pack is in the bucket; started again
on the same locations it copies only the rest, writes the manifest last, and every object
decrypts to the local pack it was copied from."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled.client import ShuffleClient
from shuffled.protocol import Interval, PartialKey
from shuffled.storage.deep import crypt, manifest
from tests.conftest import DAY, pack_files
from tests.helpers.procs import DaemonProcess
from tests.helpers.s3 import deep_tier
from tests.storage.test_deep_storage import _arrow, _objects, _table

pytest.importorskip("moto.server", reason="moto[server] is not installed (test extras)")

WAIT = 60.0


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with deep_tier(tmp_path, "kill") as made:
        yield made


def offload_completes(url: str, sup: str, instance: str) -> None:
    """Wait (at most WAIT s, long polls on the task's state) until the daemon at ``url``
    says the offload of ``sup`` is complete, under the daemon instance ``instance``."""
    with ShuffleClient(url) as client:
        state: dict[str, Any] = {}
        deadline = time.monotonic() + WAIT
        while state.get("deepStorage", {}).get("offload") != "complete":
            assert time.monotonic() < deadline, state
            state = client.task_state(sup, known=state.get("tag"), max_wait=5)
        assert state["deepStorage"]["instance"] == instance


def test_sigkill_mid_offload_resumes_after_restart(tier: dict[str, Any],
                                                   tmp_path: Path) -> None:
    locations = [tmp_path / "l0", tmp_path / "l1"]
    slow = ["--pack-max-bytes", "64KiB", "--deep-storage-concurrency", "1",
            "--deep-storage-bandwidth", "300KB"]
    daemon = DaemonProcess(locations, *tier["args"], *slow, log_path=tmp_path / "d.log")
    url = daemon.start()
    prefix = f"{tier['base']}/kill-1"
    interval = Interval.parse(DAY["start"], DAY["end"])
    try:
        with ShuffleClient(url) as client:
            for s in range(2):
                for p in range(4):
                    client.put_partial(PartialKey("kill-1", f"sub{s}", interval, p),
                                       _arrow(_table(s * 10 + p, blob=100_000)))
            answer = client.seal("kill-1", ["sub0", "sub1"])
        instance = answer["deepStorage"]["instance"]
        packs = sum(len(pack_files(loc, "kill-1")) for loc in locations)
        assert packs >= 4
        # Bounded: at 300 KB/s the first ~100 KB pack lands well within a second.
        deadline = time.monotonic() + WAIT
        while not any(n.endswith(".pack") for n in _objects(tier["fs"], prefix)):
            assert time.monotonic() < deadline, "no pack reached the tier"
            time.sleep(0.02)
        daemon.kill()
        assert daemon.proc is not None and daemon.proc.returncode == -9
        before = _objects(tier["fs"], prefix)
        assert f"{instance}/{manifest.MANIFEST_NAME}" not in before  # cut short
        assert len([n for n in before if n.endswith(".pack")]) < packs

        again = DaemonProcess(locations, *tier["args"], log_path=tmp_path / "d2.log")
        url = again.start()
        try:
            offload_completes(url, "kill-1", instance)  # under the same name again
        finally:
            again.stop()
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()
    objects = _objects(tier["fs"], prefix)
    assert {n.split("/")[0] for n in objects} == {instance}
    assert f"{instance}/{manifest.MANIFEST_NAME}" in objects
    key = crypt.task_key(tier["key_file"].read_bytes().strip(), "kill-1")
    local = sorted(p.read_bytes() for loc in locations for p in pack_files(loc, "kill-1"))
    assert sorted(crypt.decrypt(key, "kill-1", f"kill-1/{n}", d)
                  for n, d in objects.items() if n.endswith(".pack")) == local
    assert os.path.exists(tmp_path / "d2.log")

"""A daemon SIGKILLed while it copies slabs to deep storage (docs/slab.md,
docs/deep-storage.md): real ``shuffled serve`` processes on a moto S3 server on loopback,
the copy slowed (one object at a time, 1 MB/s), killed at a random point of it (after a
random number of slab objects landed, plus a random delay) in three rounds. Each time:

- until the offload completes, a survivor reading the lost daemon's shards through
  ``/peers/<instance>`` gets nothing (404: the manifest is written last), never part;
- started again on the same locations, the daemon resumes, copies what is missing (a slab
  cut short is copied again), writes the manifest; every slab object then decrypts to its
  local file, and the survivor answers exactly the shards the daemon answered.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuffled.client import ShuffleClient
from shuffled.errors import NotFound
from shuffled.storage.deep import crypt
from tests.helpers.procs import DaemonProcess
from tests.helpers.s3 import deep_tier
from tests.helpers.slabs import make_slab, rows_table
from tests.storage.test_deep_slabs import SHARDS, _rows
from tests.storage.test_deep_sigkill import offload_completes
from tests.storage.test_deep_storage import _objects

pytest.importorskip("moto.server", reason="moto[server] is not installed (test extras)")

WAIT = 60.0
SLABS = 6  # of about 400 KB each: ~2.5 s of copying at 1 MB/s


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with deep_tier(tmp_path, "slabkill") as made:
        yield made


def _shards(url: str, sup: str) -> list[Any]:
    with ShuffleClient(url) as client:
        return [(_rows(r.table), r.slabs) for r in client.read_shards(sup, SHARDS)]


def _until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while not (got := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return got


def test_sigkill_mid_slab_offload_resumes_and_readers_see_whole_or_nothing(
        tier: dict[str, Any], tmp_path: Path) -> None:
    rng = random.Random(20261127)
    locations = [tmp_path / "l0", tmp_path / "l1"]
    slow = ["--deep-storage-concurrency", "1", "--deep-storage-bandwidth", "1MB"]
    survivor = DaemonProcess([tmp_path / "s0"], *tier["args"], log_path=tmp_path / "s.log")
    survivor.start()
    cut = 0
    try:
        for round_ in range(3):
            sup = f"slabkill-{round_}"
            daemon = DaemonProcess(locations, *tier["args"], *slow,
                                   log_path=tmp_path / f"d{round_}.log")
            url = daemon.start()
            try:
                with ShuffleClient(url) as client:
                    for i in range(SLABS):
                        client.put_slab(sup, make_slab(rows_table(10_000, seed=round_ * 10 + i),
                                                       sub=f"s{i % 3}", slab_id=i))
                    answer = client.seal(sup, ["s0", "s1", "s2"])
                instance = answer["deepStorage"]["instance"]
                before = _shards(url, sup)
                prefix = f"{tier['base']}/{sup}/{instance}"
                landed = rng.randrange(SLABS)  # slab objects to wait for, then a delay
                _until(lambda: len([n for n in _objects(tier["fs"], prefix)
                                    if n.startswith("slabs/")]) >= landed,
                       f"{landed} slab objects in the tier")
                time.sleep(rng.uniform(0, 0.3))
                daemon.kill()
            finally:
                daemon.kill()
            assert daemon.proc is not None and daemon.proc.returncode == -9
            peer = f"{survivor.url}/peers/{instance}"
            if "manifest.json" not in _objects(tier["fs"], prefix):  # cut short: nothing
                cut += 1
                with pytest.raises(NotFound, match="no complete copy"):
                    _shards(peer, sup)
            again = DaemonProcess(locations, *tier["args"], log_path=tmp_path / f"a{round_}.log")
            url = again.start()
            try:
                offload_completes(url, sup, instance)
            finally:
                again.stop()
            objects = _objects(tier["fs"], prefix)
            key = crypt.task_key(tier["key_file"].read_bytes().strip(), sup)
            local = sorted(p.read_bytes() for loc in locations for p in (loc / sup).glob("*.slab"))
            assert sorted(crypt.decrypt(key, sup, f"{sup}/{instance}/{n}", d)
                          for n, d in objects.items() if n.startswith("slabs/")) == local
            assert _shards(peer, sup) == before  # whole, from the tier
        assert cut == 3  # each kill came before the offload completed
    finally:
        survivor.stop()

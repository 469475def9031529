"""The late plan with ``shuffleDurability: "deep"`` (docs/slab.md, docs/deep-storage.md):
the slabs of every sealed daemon are in deep storage before phase 2, so a daemon SIGKILLed
after the seal, or while phase 2 reads, is read from the tier through a survivor's
``/peers/<instance>`` route, nothing re-run; a daemon lost in phase 1, before any copy of
its seal, is re-run as before, and so is one whose copy in the tier turns out to lack its
slabs (the survivor answers 502, the driver gives the copy up). Real Spark (local), three real daemon processes with deep
storage on a moto S3 server on loopback; rows checked against DuckDB's rollup of the
input; the bucket is empty after the driver's DELETE."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from shuffled.spark import run_ingestion
from tests.helpers.hooks import StopDaemons
from tests.helpers.ingestion import (  # noqa: F401  (fixtures)
    assert_matches,
    base_spec,
    expected_rollup,
    held_tasks,
    json_input,
    read_output,
    spark,
)
from tests.helpers.procs import DaemonProcess
from tests.helpers.s3 import deep_tier

pytestmark = pytest.mark.spark
pytest.importorskip("moto.server", reason="moto[server] is not installed (test extras)")

HASHED = {"type": "hashed", "targetRowsPerSegment": 300}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    return json_input(tmp_path_factory.mktemp("late-deep"), 12000, seed=7, parts=4)


@pytest.fixture
def deep(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with deep_tier(tmp_path, "late") as tier:
        started: list[DaemonProcess] = []
        try:
            for i in range(3):
                d = DaemonProcess([tmp_path / f"loc{i}"], *tier["args"],
                                  log_path=tmp_path / f"daemon{i}.log")
                d.start()
                started.append(d)
            yield {"fs": tier["fs"], "base": tier["base"], "daemons": started}
        finally:
            for d in started:
                d.kill()


def _objects(fs: Any, base: str) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=True))
    return [i.path for i in infos if i.type == pafs.FileType.File]


def ingest_losing(dataset: Any, deep: dict[str, Any], out: Path, when: str,
                  hooks: StopDaemons | None = None) -> dict[str, Any]:
    """Ingest with durability deep while the hook SIGKILLs daemon 0 ``when``; checks the
    late plan was taken, the victim died, every row is published once, the survivors hold
    nothing after and the bucket is empty; returns the task report."""
    base, good = dataset
    three = deep["daemons"]
    spec = base_spec(base, HASHED, maxNumConcurrentSubTasks=4, shuffleRetrySeconds=2,
                     maxRowsInMemory=1000, maxBytesInMemory=1 << 16,
                     shuffleDurability="deep")
    victim = three[0]
    hooks = hooks or StopDaemons(**{when: [victim.pid]}, sig=int(signal.SIGKILL),
                                 phase2_sig=int(signal.SIGKILL), partition=3,
                                 after_uploads=1)
    result = run_ingestion(spec, shuffle_servers=[d.url for d in three], output_dir=str(out),
                           hooks=hooks, keepalive_seconds=0.5)
    assert victim.proc.wait(timeout=30) == -signal.SIGKILL
    report = result.report
    assert report["status"] == "SUCCESS"
    assert report["phases"]["determinePartitions"]["method"] == "latePlan"
    _, table = read_output(out)
    assert_matches(table, expected_rollup(good))  # every row once: none lost, none twice
    assert list(report["recovery"]["lostDaemons"]) == [victim.url]
    for d in three[1:]:
        assert held_tasks(d.url) == []
    assert _objects(deep["fs"], deep["base"]) == []  # the DELETE took every copy
    return report


@pytest.mark.parametrize("when", ["sealed", "in_phase2"],
                         ids=["after-the-seal", "during-phase2"])
def test_a_daemon_lost_after_a_deep_seal_is_read_from_the_tier(
        spark: Any, dataset: Any, deep: dict[str, Any], tmp_path: Path, when: str) -> None:
    report = ingest_losing(dataset, deep, tmp_path / "out", when)
    rec = report["recovery"]
    victim = deep["daemons"][0].url
    assert rec["subtasksRecomputed"] == 0
    assert rec["readFromTier"] == [victim]
    assert any(r.get("readFromTier") == [victim] for r in rec["rounds"])


def test_a_daemon_lost_before_its_copy_is_re_run(
        spark: Any, dataset: Any, deep: dict[str, Any], tmp_path: Path) -> None:
    """Lost in phase 1, the daemon never sealed: no copy of it is in the tier (no
    manifest), so the subtasks that stored slabs there run again, as with local."""
    report = ingest_losing(dataset, deep, tmp_path / "out", "in_phase1")
    rec = report["recovery"]
    assert rec["readFromTier"] == []
    assert 1 <= rec["subtasksRecomputed"] <= len(report["subtasks"])


@dataclass
class LoseTheCopy(StopDaemons):
    """After the seal (every copy complete): remove the victim's slab objects from the
    tier, then SIGKILL it. Its manifest still names them."""

    base: str = ""
    instance: str = ""

    def lost(self, path: str) -> bool:
        """Whether the tier object at ``path`` is one this scenario removes."""
        return f"/{self.instance}/slabs/" in path

    def after_seal(self) -> None:
        fs = pafs.S3FileSystem(access_key=os.environ["AWS_ACCESS_KEY_ID"],
                               secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                               region="us-east-1", scheme="http",
                               endpoint_override=os.environ["AWS_ENDPOINT_URL_S3"]
                               .split("://", 1)[1])
        gone = [i.path for i in fs.get_file_info(pafs.FileSelector(self.base, recursive=True))
                if i.type == pafs.FileType.File and self.lost(i.path)]
        assert gone, "the victim copied none of what this scenario removes"
        for path in gone:
            fs.delete_file(path)
        super().after_seal()


def test_a_tier_copy_missing_its_slabs_is_given_up_and_re_run(
        spark: Any, dataset: Any, deep: dict[str, Any], tmp_path: Path) -> None:
    """The victim's manifest names slabs the tier lacks: phase 2's reads through the
    survivor answer 502 bad_tier_copy (never other rows); the driver gives that copy up
    and re-runs what the victim held, and every row is published once."""
    three = deep["daemons"]
    victim = three[0]
    instance = (victim.locations[0] / ".shuffled" / "instance-id").read_text().strip()
    hooks = LoseTheCopy(sealed=[victim.pid], sig=int(signal.SIGKILL), base=deep["base"],
                        instance=instance)
    report = ingest_losing(dataset, deep, tmp_path / "out", "sealed", hooks=hooks)
    rec = report["recovery"]
    assert rec["readFromTier"] == []  # tried, given up: not read from the tier
    assert 1 <= rec["subtasksRecomputed"] <= len(report["subtasks"])
    assert any(r.get("readFromTier") == [victim.url] for r in rec["rounds"])  # tried first


@dataclass
class LoseThePacks(LoseTheCopy):
    """The partials path's :class:`LoseTheCopy`: the victim's pack objects go."""

    def lost(self, path: str) -> bool:
        return f"/{self.instance}/" in path and path.endswith(".pack")


def test_a_tier_copy_missing_its_packs_is_given_up_and_re_run(
        spark: Any, dataset: Any, deep: dict[str, Any], tmp_path: Path) -> None:
    """The JVM reader (the partials path: numShards read natively goes as slabs): the
    victim's manifest names packs the tier lacks;
    the survivor's peer route answers 502 bad_tier_copy, the driver gives that copy up and
    re-runs what the victim held, and every row is published once."""
    base, good = dataset
    three = deep["daemons"]
    victim = three[0]
    instance = (victim.locations[0] / ".shuffled" / "instance-id").read_text().strip()
    hooks = LoseThePacks(sealed=[victim.pid], sig=int(signal.SIGKILL), base=deep["base"],
                         instance=instance)
    spec = base_spec(base, {"type": "hashed", "numShards": 2}, maxNumConcurrentSubTasks=4,
                     shuffleRetrySeconds=2, maxRowsInMemory=1000, maxBytesInMemory=1 << 16,
                     shuffleDurability="deep")
    out = tmp_path / "out"
    result = run_ingestion(spec, shuffle_servers=[d.url for d in three], output_dir=str(out),
                           hooks=hooks, keepalive_seconds=0.5, reader="jvm")
    assert victim.proc.wait(timeout=30) == -signal.SIGKILL
    report = result.report
    assert report["status"] == "SUCCESS"
    assert report["phases"]["partialSegmentGeneration"]["partials"]
    _, table = read_output(out)
    assert_matches(table, expected_rollup(good))  # every row once: none lost, none twice
    rec = report["recovery"]
    assert list(rec["lostDaemons"]) == [victim.url]
    assert rec["readFromTier"] == []  # tried, given up: not read from the tier
    assert 1 <= rec["subtasksRecomputed"] <= len(report["subtasks"])
    assert any(r.get("readFromTier") == [victim.url] for r in rec["rounds"])  # tried first
    for d in three[1:]:
        assert held_tasks(d.url) == []
    assert _objects(deep["fs"], deep["base"]) == []

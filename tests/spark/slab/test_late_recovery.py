"""A daemon lost under the late plan (issue 36: "reruns and failover keep working ... under
the late plan"): the phase-1 subtasks that stored slabs on it run again on the survivors
(new attempts, new subtask ids), their old slabs are left out of every read, and every
row is published once. Real Spark (local), three real daemon processes, one SIGKILLed by
the test's hook between the phases (the seal finds it) or after the seal (phase 2 finds
it, when the survivors are already sealed with the old attempts: they must be left out,
not read twice). The rows are checked against DuckDB's rollup of the input."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    return json_input(tmp_path_factory.mktemp("late-recovery"), 12000, seed=7, parts=4)


@pytest.fixture
def three(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    started = []
    try:
        for i in range(3):
            d = DaemonProcess([tmp_path / f"loc{i}"], log_path=tmp_path / f"daemon{i}.log")
            d.start()
            started.append(d)
        yield started
    finally:
        for d in started:
            d.kill()


HASHED = {"type": "hashed", "targetRowsPerSegment": 300}


def ingest_losing(dataset: Any, three: list[DaemonProcess], out: Path, when: str,
                  partitions: dict[str, Any], **tuning: Any) -> dict[str, Any]:
    """Ingest through ``three`` while the hook SIGKILLs the first ``when``; checks the run
    took the late plan, the victim died, every row is published once (DuckDB's rollup of
    the input) and the survivors hold nothing after; returns the task report."""
    base, good = dataset
    spec = base_spec(base, partitions, maxNumConcurrentSubTasks=4, shuffleRetrySeconds=2,
                     maxRowsInMemory=1000, maxBytesInMemory=1 << 16, **tuning)
    victim = three[0]
    # Subtask 3 flushes a slab per day it holds (3), the first to daemon 0 (its ring's
    # first: 3 % 3); daemon 0 is killed after that one, so in phase 1 the rest fail over
    # to a survivor.
    hooks = StopDaemons(**{when: [victim.pid]}, sig=int(signal.SIGKILL), partition=3,
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
    assert report["cleanup"][victim.url] == "lost"
    for d in three[1:]:
        assert held_tasks(d.url) == []  # the survivors' slabs, old attempts too: deleted
    return report


@pytest.mark.parametrize("when,partitions", [
    # In phase 1, subtask 3's slabs on the survivor are superseded by its re-run and must
    # be left out of the reads (sealed or not), or its rows would be merged twice.
    ("in_phase1", HASHED),
    ("between", HASHED),
    ("sealed", HASHED),
    ("in_phase1", {"type": "range", "partitionDimensions": ["country", "device"],
                   "targetRowsPerSegment": 300}),
], ids=["hashed-in-phase1", "hashed-at-seal", "hashed-in-phase2", "range-in-phase1"])
def test_a_lost_daemon_is_recomputed_under_the_late_plan(
        spark: Any, dataset: Any, three: list[DaemonProcess], tmp_path: Path, when: str,
        partitions: dict[str, Any]) -> None:
    report = ingest_losing(dataset, three, tmp_path / "out", when, partitions)
    assert 1 <= report["recovery"]["subtasksRecomputed"] <= len(report["subtasks"])


@pytest.mark.parametrize("when", ["in_phase1", "sealed"])
def test_two_replicas_of_each_slab_ride_through_a_loss_without_recompute(
        spark: Any, dataset: Any, three: list[DaemonProcess], tmp_path: Path,
        when: str) -> None:
    """``shuffleReplicas`` 2 takes the late plan too: each slab is stored on two daemons and
    read from one (a subtask whole from one daemon, the others told to leave it out), so
    no row is read twice; a lost daemon's subtasks are read from their other copies,
    nothing is re-run."""
    report = ingest_losing(dataset, three, tmp_path / "out", when, HASHED, shuffleReplicas=2)
    phase1 = report["phases"]["partialSegmentGeneration"]
    assert phase1["replicas"] == 2 and phase1["bytesReplicated"] > 0
    assert report["recovery"]["subtasksRecomputed"] == 0

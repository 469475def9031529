"""The Python workers' allocator setting (``sparksession.WORKER_ENV``): Arrow's pool keeps
freed pages for ten seconds instead of 10 ms, so a task reuses what earlier tasks of its
worker freed; and ``release_free_memory`` still hands all of it back at once (the merge
budget's check does so at each task's start, through a test hook, so that a task's peak
memory measures its own use)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from shuffled.spark.driver.sparksession import WORKER_ENV, worker_conf
from tests.helpers.ingestion import spark  # noqa: F401  (fixture)

_PROBE = r"""
import pyarrow as pa
from shuffled.spark.rows import memory

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) // 1024

before = anon()
bufs = [pa.allocate_buffer(1 << 16) for _ in range(4096)]  # 256 MiB in Arrow's pool
for b in bufs:
    memoryview(b).cast("B")[::4096] = b"\x01" * 16  # touched: resident
held = anon()
del bufs
memory.release_free_memory()
print(before, held, anon())
"""


def test_a_release_hands_back_what_the_pool_kept() -> None:
    env = {**os.environ, **WORKER_ENV}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    before, held, after = map(int, out)
    assert held - before >= 200  # the buffers were resident
    assert after - before < 32, (before, held, after)  # and handed back by the release


def test_the_workers_run_with_the_setting(spark: Any) -> None:
    """The session's Python workers (local mode here) get the environment through
    ``spark.executorEnv``, as a cluster's executors do."""
    assert {k: v for k, v in worker_conf().items() if k.startswith("spark.executorEnv.")} == \
        {f"spark.executorEnv.{k}": os.environ.get(k, v) for k, v in WORKER_ENV.items()}
    got = (spark.sparkContext.parallelize([0], 1)
           .map(lambda _: {k: os.environ.get(k) for k in WORKER_ENV}).collect())
    assert got == [{k: os.environ.get(k, v) for k, v in WORKER_ENV.items()}]

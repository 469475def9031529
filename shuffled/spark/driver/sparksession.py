"""The SparkSession the pipeline runs on, and per-job SQL settings."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

#: SQL settings a job needs; set for the job's duration, then restored.
JOB_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def get_session(master: str | None) -> tuple[SparkSession, bool]:
    """The active session (reused as is), else a new one on ``master`` (default local[*]).

    Returns the session and whether this call created it (then the caller stops it).
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    # Python workers (and the data source planner) must run this interpreter, which has
    # pyarrow; Spark reads PYSPARK_PYTHON when the JVM starts.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName("shuffled-ingest").master(master or "local[*]")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    # Python workers run the interpreter running the driver (the one with pyarrow).
    builder = builder.config("spark.pyspark.python", sys.executable)
    builder = builder.config("spark.pyspark.driver.python", sys.executable)
    if (master or "local").startswith("local"):
        # Local mode needs no reachable driver: keep the driver and its UI on loopback
        # instead of Spark's default of the external interface.
        builder = builder.config("spark.driver.host", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
    return builder.getOrCreate(), True


@contextmanager
def job_conf(spark: SparkSession) -> Iterator[None]:
    """Apply :data:`JOB_CONF` to the session for the duration of a job (and leave no job
    group of ours on the caller's thread after it)."""
    saved: dict[str, str | None] = {}
    for key, value in JOB_CONF.items():
        saved[key] = spark.conf.get(key, None)
        spark.conf.set(key, value)
    try:
        yield
    finally:
        sc = spark.sparkContext
        for prop in ("spark.jobGroup.id", "spark.job.description"):
            sc.setLocalProperty(prop, None)  # type: ignore[arg-type]  # None unsets it
        for key, old in saved.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)

"""The SparkSession the pipeline runs on, and per-job SQL settings.

A session started here runs its driver JVM with ``-XX:+ExitOnOutOfMemoryError``: Spark
survives an ``OutOfMemoryError`` in some of its own threads (``task-result-getter``) by
losing what that thread was doing, so the job waits forever for a result (issue 36). A
JVM that exits instead fails the driver's call at once, and :mod:`.sparkfailure` names
the cause from its exit code. Driver Java options in ``PYSPARK_SUBMIT_ARGS`` replace
this one (spark-submit keeps the last of them; ``shuffled ingest`` therefore passes the
user's, its own and this one together, :func:`shuffled.cli.ingest.submit_args`); the stall
watchdog still ends a job stuck that way (:mod:`.watchdog`).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

log = logging.getLogger("shuffled.spark")

#: The driver JVM's options when this module starts it (see the module docstring).
DRIVER_JAVA_OPTIONS = "-XX:+ExitOnOutOfMemoryError"

#: The environment of the Python workers of a session started here (Spark's
#: ``spark.executorEnv.*``, which local mode's workers get too), each unless this process's
#: environment sets it. Arrow's allocator (mimalloc) gives freed pages back to the system
#: 10 ms after a free by default; a phase-1 or phase-2 task frees and allocates the same
#: buffers over and over, so the kernel faulted them in and zeroed them again (17.6% of
#: phase-2 workers' CPU in ``clear_page_erms``, docs/benchmarks.md). Ten seconds keeps
#: them for a task's run and for the worker's next task (phase 2 after phase 1): a task no
#: longer starts by handing back what earlier ones freed, whose pages the next faulted in
#: again (~3.7 ms a 2 MiB page on this VM; docs/benchmarks.md), so a task's reported RSS
#: growth leaves out what it reused.
WORKER_ENV: dict[str, str] = {"MIMALLOC_PURGE_DELAY": "10000"}

#: SQL settings a job needs; set for the job's duration, then restored.
JOB_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


#: The Python workers' daemon: PySpark's, with pyspark imported from its installed,
#: compiled copy rather than the source zips Spark puts first on the workers' path
#: (:mod:`shuffled.pysparkdaemon`: a new worker's imports, 0.6-0.9 s -> ~0.15 s).
DAEMON_MODULE = "shuffled.pysparkdaemon"


def worker_conf() -> dict[str, str]:
    """The Spark settings of the Python workers: :data:`WORKER_ENV`, and
    :data:`DAEMON_MODULE` as their daemon; each unless spark-submit's arguments set it
    (``PYSPARK_SUBMIT_ARGS``: ``shuffled ingest --conf``), whose value then stands (a
    session builder's setting would replace it)."""
    ours = {"spark.python.daemon.module": DAEMON_MODULE,
            **{f"spark.executorEnv.{name}": os.environ.get(name, value)
               for name, value in WORKER_ENV.items()}}
    given = {a.split("=", 1)[0] for a in shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
             if "=" in a}
    return {k: v for k, v in ours.items() if k not in given}


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
    builder = builder.config("spark.driver.extraJavaOptions", DRIVER_JAVA_OPTIONS)
    # Python workers run the interpreter running the driver (the one with pyarrow).
    builder = builder.config("spark.pyspark.python", sys.executable)
    builder = builder.config("spark.pyspark.driver.python", sys.executable)
    for key, value in worker_conf().items():
        builder = builder.config(key, value)
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
        try:
            sc = spark.sparkContext
            for prop in ("spark.jobGroup.id", "spark.job.description"):
                sc.setLocalProperty(prop, None)  # type: ignore[arg-type]  # None unsets it
            for key, old in saved.items():
                if old is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, old)
        except Exception as exc:  # the JVM is gone (it ran out of memory): nothing to restore
            log.warning("could not restore the session's settings: %s", exc)


def kill_jvm(spark: SparkSession) -> None:
    """End the driver JVM this process started (a job it cannot stop any other way): the
    driver's calls into it fail at once."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def stop_session(spark: SparkSession) -> None:
    """Stop a session this module started; one whose JVM is gone is only forgotten."""
    try:
        spark.stop()
    except Exception as exc:
        log.warning("stopping Spark failed (its JVM is gone?): %s", exc)

"""The Python workers' daemon (``shuffled.pysparkdaemon``): Spark's source zips of what
is installed come off the workers' path, so a new worker imports pyspark's compiled
copy; anything else Spark put there stays."""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pyspark

from shuffled.pysparkdaemon import installed_copies
from shuffled.spark.driver.sparksession import DAEMON_MODULE, worker_conf
from tests.helpers.ingestion import spark  # noqa: F401  (fixture)

PACKAGE = Path(pyspark.__file__).parent  # pip's layout: SPARK_HOME is the package
SITE = str(PACKAGE.parent)
ZIPS = PACKAGE / "python" / "lib"


def test_the_installed_packages_zips_are_found_and_nothing_else(tmp_path: Path) -> None:
    pyspark_zip = str(ZIPS / "pyspark.zip")
    py4j_zip = str(ZIPS / f"py4j-{metadata.version('py4j')}-src.zip")
    assert Path(pyspark_zip).is_file() and Path(py4j_zip).is_file()
    # A SPARK_HOME whose pyspark is only its zip (no package beside it), another py4j.
    home = tmp_path / "spark" / "python" / "lib"
    home.mkdir(parents=True)
    elsewhere = [str(home / "pyspark.zip"), str(home / "py4j-0.0.1-src.zip"),
                 str(tmp_path / "other.zip")]
    path = ["", pyspark_zip, py4j_zip, *elsewhere, SITE]
    assert installed_copies(path) == [pyspark_zip, py4j_zip]
    # The package's zip counts only while the package itself can be imported.
    assert installed_copies([pyspark_zip, str(tmp_path)]) == []


def test_a_conf_of_the_users_stands(monkeypatch: Any) -> None:
    """``shuffled ingest --conf spark.python.daemon.module=...`` reaches spark-submit through
    PYSPARK_SUBMIT_ARGS; the session's own setting would replace it, so it is left out."""
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.python.daemon.module=pyspark.daemon "
                       "--conf 'spark.executor.memory=1g' pyspark-shell")
    got = worker_conf()
    assert "spark.python.daemon.module" not in got
    assert any(k.startswith("spark.executorEnv.") for k in got)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    assert worker_conf()["spark.python.daemon.module"] == DAEMON_MODULE


def test_a_worker_imports_the_compiled_pyspark(spark: Any) -> None:  # noqa: F811
    """The session's workers (tests use shuffled's worker settings) run the daemon and
    import pyspark from the package, not from a zip Spark put on their path."""
    assert worker_conf()["spark.python.daemon.module"] == DAEMON_MODULE
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON_MODULE

    def probe(_: Any) -> list[tuple[str, list[str], str]]:
        import pyspark as p
        import pyspark.worker as w
        return [(p.__file__ or "", [e for e in sys.path if e.endswith(".zip")],
                 os.environ.get("PYTHONPATH", ""))]

    (file, zips, pythonpath), = spark.sparkContext.parallelize([0], 1).mapPartitions(
        probe).collect()
    assert "pyspark.zip" in pythonpath  # Spark still puts its zip first ...
    assert file == pyspark.__file__  # ... and the worker imported the package
    assert not any(z in zips for z in installed_copies([*zips, SITE]))

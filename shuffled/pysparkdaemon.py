"""PySpark's Python worker daemon (``pyspark.daemon``), run with pyspark imported from its
installed, compiled copy: the sessions shuffled starts name this module as
``spark.python.daemon.module`` (:func:`shuffled.spark.driver.sparksession.worker_conf`).

Why: Spark puts ``pyspark.zip`` and py4j's source zip first on its Python workers' path,
and Python compiles a module imported from a zip from source in every new process
(zipimport keeps no bytecode). A new worker's imports of pyspark (its worker loop, and
``pyspark.sql`` through the tasks' functions) took 0.64-0.88 s from the zips against
0.13-0.15 s from the installed package. PySpark ends a worker idle for a minute, so the
first ingestion of a session, and any after a pause of a minute, started its workers
again and paid it in phase 1: comparison 7 ran 5.2-7.5 s right after the bench's Spark
side against 4.2-5.4 otherwise (docs/benchmarks.md, nineteenth session).

Only zips that are copies of what is installed are taken off the path: ``pyspark.zip``
under the installed pyspark package's ``python/lib`` (pip's layout, where ``SPARK_HOME``
is the package), and ``py4j-<version>-src.zip`` when that py4j version is installed. A
cluster whose pyspark comes only from ``SPARK_HOME``'s zips keeps them. Nothing else is
imported before the daemon forks its workers (pyspark's own rule: pyarrow starts threads
when imported), so this module imports no more than the standard library.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib import metadata


def installed_copies(path: Sequence[str]) -> list[str]:
    """The entries of ``path`` that are zips of packages installed outside them."""
    out = []
    for entry in path:
        name = os.path.basename(entry)
        if name == "pyspark.zip":
            lib = os.path.dirname(os.path.abspath(entry))
            package = os.path.dirname(os.path.dirname(lib))  # <package>/python/lib
            if (os.path.basename(package) == "pyspark" and os.path.basename(lib) == "lib"
                    and os.path.isfile(os.path.join(package, "daemon.py"))
                    and _on_path(os.path.dirname(package), path)):
                out.append(entry)
        elif name.startswith("py4j-") and name.endswith("-src.zip"):
            version = name[len("py4j-"):-len("-src.zip")]
            try:
                if metadata.version("py4j") == version:
                    out.append(entry)
            except metadata.PackageNotFoundError:
                pass
    return out


def _on_path(directory: str, path: Sequence[str]) -> bool:
    real = os.path.realpath(directory)
    return any(os.path.realpath(p or ".") == real for p in path if not p.endswith(".zip"))


def main() -> None:
    drop = set(installed_copies(sys.path))
    sys.path[:] = [p for p in sys.path if p not in drop]
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()

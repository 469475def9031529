"""Phase 1 as a Spark 4 Python data source sink: ``df.write.format("shuffled_phase1")``.

The JVM hands each Spark partition's rows to :func:`~.tasks.run_task` as Arrow batches; the
task RETURNS the list of partials it uploaded as its commit message. Spark's commit
coordinator lets exactly one attempt per partition commit and hands only those messages to
the driver-side ``commit``, so the driver's list names exactly the committed attempts
(docs/exactly-once.md).
"""

from __future__ import annotations

import base64
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from shuffled.spark.phase1.tasks import Phase1Config, run_task


@dataclass
class Phase1Message(WriterCommitMessage):
    """What one committed phase-1 attempt reports: its partials and its stats (JSON lines)."""

    lines: list[str]


class Phase1Writer(DataSourceArrowWriter):
    """Executors: :func:`run_task`. Driver: ``commit`` gets exactly one message per Spark
    partition (the committed attempt's) and writes their lines to ``result_path``."""

    def __init__(self, cfg: Phase1Config, result_path: str) -> None:
        self.cfg = cfg
        self.result_path = result_path

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Phase1Message:
        return Phase1Message(run_task(self.cfg, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        tmp = self.result_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for m in messages:
                if isinstance(m, Phase1Message):
                    fh.writelines(line + "\n" for line in m.lines)
        os.replace(tmp, self.result_path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo here: the driver DELETEs the whole supervisor task's data."""


class ShuffleDataSource(DataSource):
    """``df.write.format("shuffled_phase1")``: phase 1 as a Python data source sink.

    Options: ``config`` (base64 pickle of :class:`Phase1Config`) and ``result_path``.
    """

    @classmethod
    def name(cls) -> str:
        return "shuffled_phase1"

    def writer(self, schema: StructType, overwrite: bool) -> Phase1Writer:
        cfg = pickle.loads(base64.b64decode(self.options["config"]))
        return Phase1Writer(cfg, self.options["result_path"])


def encode_config(cfg: Phase1Config) -> str:
    # cloudpickle (Spark's): what a test registered to travel by value (its hooks,
    # shuffled.spark.hooks) reaches executors that cannot import the test's modules.
    return base64.b64encode(cloudpickle.dumps(cfg)).decode("ascii")

"""Seams where an ingestion calls out at a point a test wants to act: fail a phase-1 attempt
after some uploads, stop a daemon mid-phase, between the phases.

Production passes none (:data:`NONE`, every method a no-op); a test passes a subclass
(tests/helpers/hooks.py). A hooks object travels to the executors inside the phases' configs,
so it must pickle: keep its state data (pids, numbers), not closures. The code it runs lives in
the test, never behind a flag in the pipeline.
"""

from __future__ import annotations


class Hooks:
    """The no-op seams (see the module docstring)."""

    def task_started(self) -> None:
        """A phase-1 or merge task starts on its Python worker, before the task reads the
        worker's resident size it reports its growth against."""

    def phase1_uploaded(self, partition: int, attempt_number: int, uploads: int) -> None:
        """A phase-1 task (``partition``, attempt ``attempt_number``) has ``uploads``
        partials answered so far (called after each)."""

    def phase2_fetched(self, batches: int) -> None:
        """A merge task has fetched its ``batches``-th batch of partitions (or began a
        streamed partition after the first)."""

    def phase2_lost(self, partition: int, servers: tuple[str, ...], why: str) -> None:
        """A merge task reports a partition lost: no replica of a source answers on
        ``servers`` (called as the Lost record is made)."""

    def between_phases(self) -> None:
        """The driver: phase 1 committed, the daemons not sealed yet."""

    def after_seal(self) -> None:
        """The driver: the daemons sealed (with shuffleDurability deep, their copies in
        deep storage too), phase 2 not started."""

    def before_commit(self, attempt: int) -> None:
        """The driver: every data file of an Iceberg output durable in the table's location,
        commit ``attempt`` (0 first) planned against the table as loaded, not yet made."""


NONE = Hooks()

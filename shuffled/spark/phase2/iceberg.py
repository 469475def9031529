"""Publishing to an Apache Iceberg table: ``--output iceberg://CATALOG/NAMESPACE.TABLE``.

The catalog is configured the pyiceberg way (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__*``
variables); a catalog name configured nowhere gets the embedded default, a SQL catalog on a
SQLite file beside a local warehouse under ``$SHUFFLED_ICEBERG_HOME`` (``~/.shuffled/iceberg``).

Phase 2 writes its segments as usual; they are the table's data files, as they are (no
rewrite): in the table's location (``<location>/data/<version>/``) when it is local, staged on
local disk and uploaded there before the commit when it is on S3. Then ONE catalog commit:
the table created from the segments' schema on first use (partitioned by the Iceberg
transform of ``__time`` that matches segmentGranularity), new columns added, a changed column
type refused by name; one snapshot that adds every data file and (``appendToExisting``
false) removes the files whose rows lie in the new segments' intervals. The snapshot summary
carries the segment version and task id; a data file's name is its segment
(``<start>_<end>_<partition>.a<attempt>.parquet``). A conflicting commit (another ingestion
committed first) is re-planned on the new table state and retried; nothing of a failed
ingestion is referenced. See docs/iceberg.md.

pyiceberg is imported here only (the daemon never loads this module).
"""

from __future__ import annotations

import os
import random
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq

from shuffled.spark.fs import remote
from shuffled.spark.hooks import NONE, Hooks
from shuffled.spark.phase2.publish import describe, remove_unpublished
from shuffled.spark.records import Segment

SCHEME = "iceberg"
TIME = "__time"
RETRIES = 8
#: segmentGranularity -> the coarsest Iceberg transform whose every bucket holds a whole
#: segment interval (week has none: a week crosses days, months and years).
TRANSFORMS: dict[str, str | None] = {
    "none": "hour", "second": "hour", "minute": "hour", "fifteen_minute": "hour",
    "thirty_minute": "hour", "hour": "hour", "six_hour": "day", "day": "day", "week": None,
    "month": "month", "quarter": "year", "year": "year",
}


class IcebergRefused(ValueError):
    """The ingestion cannot be committed to the table as it is (names what and why)."""


def is_iceberg(uri: str) -> bool:
    """Whether ``uri`` names an Iceberg table (``iceberg://...``)."""
    return uri.lower().startswith(f"{SCHEME}://")


@dataclass(frozen=True)
class IcebergTarget:
    """A parsed ``iceberg://CATALOG/NAMESPACE.TABLE`` (the namespace may be dotted)."""

    catalog: str
    namespace: str
    table: str

    @property
    def identifier(self) -> str:
        return f"{self.namespace}.{self.table}"

    def __str__(self) -> str:
        return f"{SCHEME}://{self.catalog}/{self.identifier}"


def parse_uri(uri: str) -> IcebergTarget:
    """Parse ``iceberg://CATALOG/NAMESPACE.TABLE``; ValueError naming the form otherwise."""
    parts = urllib.parse.urlsplit(uri)
    name = parts.path.strip("/")
    namespace, _, table = name.rpartition(".")
    if (parts.scheme.lower() != SCHEME or not parts.netloc or not namespace or not table
            or "/" in name or parts.query or parts.fragment):
        raise ValueError(f"--output {uri} is not iceberg://CATALOG/NAMESPACE.TABLE "
                         "(e.g. iceberg://default/druid.wikipedia)")
    return IcebergTarget(parts.netloc, namespace, table)


def default_home() -> str:
    """Where the embedded default catalog keeps its SQLite file and warehouse."""
    return os.environ.get("SHUFFLED_ICEBERG_HOME") or os.path.expanduser("~/.shuffled/iceberg")


def load_catalog(name: str) -> Any:
    """The pyiceberg catalog ``name`` as configured; the embedded default if none is."""
    from pyiceberg.catalog import load_catalog as load
    from pyiceberg.utils.config import Config

    conf = Config().get_catalog_config(name)  # read now: pyiceberg's own is read at import
    if conf is not None:
        return load(name, **{k: v for k, v in conf.items() if isinstance(v, str)})
    from pyiceberg.catalog.sql import SqlCatalog

    home = os.path.abspath(default_home())
    os.makedirs(os.path.join(home, "warehouse"), exist_ok=True)
    return SqlCatalog(name, uri=f"sqlite:///{home}/catalog.db",
                      warehouse=f"file://{home}/warehouse")


def partition_transform(segment_granularity: str) -> str | None:
    """The Iceberg transform of ``__time`` the table is partitioned by (None: unpartitioned)."""
    return TRANSFORMS.get(segment_granularity)


def _local(uri: str) -> str | None:
    """The local path of a ``file://`` or plain location, None for an object store."""
    scheme = remote.scheme(uri)
    if scheme == "file":
        return urllib.parse.unquote(urllib.parse.urlsplit(uri).path)
    return uri if scheme == "" else None


class IcebergOutput:
    """One ingestion's Iceberg table: where its data files go, and its one commit."""

    def __init__(self, uri: str, version: str, task_id: str, segment_granularity: str) -> None:
        self.target = parse_uri(uri)
        self.version, self.task_id = version, task_id
        self.transform = partition_transform(segment_granularity)
        self.catalog = load_catalog(self.target.catalog)
        self.catalog.create_namespace_if_not_exists(self.target.namespace)
        table = self._load()
        location = (table.location() if table is not None else
                    self.catalog._resolve_table_location(None, self.target.namespace,
                                                         self.target.table))
        self.location = location.rstrip("/")
        if remote.scheme(self.location) not in ("", "file", "s3"):
            raise IcebergRefused(f"the table location {self.location} is neither local nor "
                                 "s3://: shuffled writes data files to those only")
        stamp = version.replace(":", "").replace("-", "")
        self.data_uri = f"{self.location}/data/{stamp}-{task_id[-8:]}"
        self.local_data_dir = _local(self.data_uri)
        self.uploaded: list[str] = []
        self.data_files_of: list[tuple[str, str]] = []
        self.metadata_location = ""  # the table's metadata file after the commit

    @property
    def report_dir(self) -> str:
        """Where the task reports go: beside the table's data and metadata."""
        local = _local(self.location)
        return os.path.join(local, "shuffled") if local else f"{self.location}/shuffled"

    def _load(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self.target.identifier)
        except NoSuchTableError:
            return None

    def data_files(self, staged: list[Segment]) -> list[tuple[str, str]]:
        """(local path, final URI) of each segment; uploads them when the table is remote
        (in parallel: every file is durable in the store before the commit)."""
        pairs = []
        for seg in staged:
            name = os.path.basename(seg.path)
            if self.local_data_dir:  # written in place: named as the location names it
                pairs.append((seg.path, f"{self.data_uri}/{name}"))
            else:
                pairs.append((seg.path, f"{self.data_uri}/{name.replace(':', '')}"))
        if not self.local_data_dir:
            def up(pair: tuple[str, str]) -> None:
                remote.upload(pair[0], pair[1])
                self.uploaded.append(pair[1])
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(up, pairs))
        return pairs

    def discard(self) -> None:
        """Delete the uploaded data files of an ingestion that committed nothing."""
        for uri in self.uploaded:
            try:
                remote.delete(uri)
            except OSError:
                pass
        self.uploaded.clear()

    def commit(self, staged: list[Segment], data_source: str, append: bool,
               hooks: Hooks = NONE) -> str:
        """The one commit: every staged segment becomes a data file of the table; returns the
        table's new metadata location. Retries a conflicting commit on the new state."""
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

        pairs = self.data_files(staged)
        self.data_files_of = pairs
        schema = pq.read_schema(pairs[0][0])
        intervals = sorted({(s.start, s.end) for s in staged})
        props = {"shuffled.version": self.version, "shuffled.task-id": self.task_id,
                 "shuffled.data-source": data_source, "shuffled.segments": str(len(staged)),
                 "shuffled.append": str(append).lower(), "shuffled.data-dir": self.data_uri}
        for attempt in range(RETRIES):
            table = self._load()
            try:
                tx = self._transaction(table, schema)
                files = _data_files(tx.table_metadata, staged, [u for _, u in pairs], schema)
                _replace(tx, table, files, [] if append else intervals, props)
                hooks.before_commit(attempt)
                committed = tx.commit_transaction()
                return str(committed.metadata_location)
            except (CommitFailedException, TableAlreadyExistsError):
                if attempt == RETRIES - 1:
                    raise IcebergRefused(
                        f"{self.target}: {RETRIES} commits in a row conflicted with other "
                        "writers' commits; nothing of this ingestion was committed: run it "
                        "again") from None
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def _transaction(self, table: Any, schema: Any) -> Any:
        """The table's transaction (a creating one on first use), its schema evolved."""
        from pyiceberg.table import TableProperties

        if table is None:
            tx = self.catalog.create_table_transaction(
                self.target.identifier, schema=schema, location=self.location)
            if self.transform:
                with tx.update_spec() as spec:
                    spec.add_field(TIME, _transform(self.transform), f"{TIME}_{self.transform}")
        else:
            tx = table.transaction()
            _evolve(tx, schema, self.target)
        if tx.table_metadata.name_mapping() is None:
            mapping = tx.table_metadata.schema().name_mapping.model_dump_json()
            tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING: mapping})
        return tx


def _transform(name: str) -> Any:
    from pyiceberg import transforms

    return {"hour": transforms.HourTransform, "day": transforms.DayTransform,
            "month": transforms.MonthTransform, "year": transforms.YearTransform}[name]()


def _same_type(a: Any, b: Any) -> bool:
    from pyiceberg.types import ListType

    if isinstance(a, ListType) and isinstance(b, ListType):
        return _same_type(a.element_type, b.element_type)
    return bool(a == b)


def _evolve(tx: Any, arrow_schema: Any, target: IcebergTarget) -> None:
    """Add the columns the table lacks; refuse a column whose type changed, by name."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow

    new: Any = visit_pyarrow(arrow_schema, _ConvertToIcebergWithoutIDs())
    current = tx.table_metadata.schema()
    added = []
    for field in new.fields:
        try:
            have = current.find_field(field.name)
        except ValueError:
            have = None
        if have is None:
            added.append(field)
        elif not _same_type(have.field_type, field.field_type):
            raise IcebergRefused(
                f"column {field.name!r} of {target} is {have.field_type} but this ingestion "
                f"writes {field.field_type}: a metric or dimension cannot change type in "
                "place; ingest into a new table, or rename the metric")
    if added:
        with tx.update_schema() as update:
            for field in added:
                update.add_column(field.name, field.field_type, doc=field.doc)


def _data_files(metadata: Any, staged: list[Segment], uris: list[str],
                sample: Any) -> list[Any]:
    """The Iceberg DataFiles of the segments, built from what phase 2 reported (rows, size,
    interval): no footer is read (a Druid-shaped job commits thousands of files, and
    pyiceberg's footer statistics cost seconds there). ``__time``'s bounds are the
    segment's interval (Iceberg's bounds need not be tight), which is what time pruning and
    an overwrite's choice of files use; per-column counts are left out (engines then read
    the footers). ``sample``: one segment's Arrow schema, checked against the table's (an
    ingestion writes every segment with one schema)."""
    from pyiceberg.conversions import to_bytes
    from pyiceberg.io.pyarrow import _check_pyarrow_schema_compatible
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record
    from pyiceberg.types import TimestamptzType

    schema, spec = metadata.schema(), metadata.spec()
    _check_pyarrow_schema_compatible(schema, sample, format_version=metadata.format_version)
    time_id = schema.find_field(TIME).field_id
    ts = TimestamptzType()
    transforms = [f.transform.transform(schema.find_field(f.source_id).field_type)
                  for f in spec.fields]
    out = []
    for seg, uri in zip(staged, uris):
        lo, hi = seg.start * 1000, (seg.end - 1) * 1000  # ms -> µs, the end exclusive
        out.append(DataFile.from_args(
            content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
            partition=Record(*(t(lo) for t in transforms)), record_count=seg.rows,
            file_size_in_bytes=seg.bytes, lower_bounds={time_id: to_bytes(ts, lo)},
            upper_bounds={time_id: to_bytes(ts, hi)}, sort_order_id=None,
            spec_id=metadata.default_spec_id, equality_ids=None, key_metadata=None))
    return out


def _interval_filter(intervals: list[tuple[int, int]]) -> Any:
    from pyiceberg import expressions

    ex: Any = expressions  # its classes are pydantic models mypy sees through poorly
    expr: Any = ex.AlwaysFalse()
    for start, end in intervals:  # ms -> Iceberg's µs
        expr = ex.Or(expr, ex.And(ex.GreaterThanOrEqual(TIME, start * 1000),
                                  ex.LessThan(TIME, end * 1000)))
    return expr


def _replace(tx: Any, table: Any, files: list[Any], intervals: list[tuple[int, int]],
             props: dict[str, str]) -> None:
    """One snapshot adding ``files``, and removing the files whose every row lies in
    ``intervals`` (Druid's overshadowing). A file only partly inside (the table's older
    rows at a coarser segmentGranularity) has its rows in the intervals deleted first by
    pyiceberg (a rewrite: then the commit holds two snapshots)."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.types import TimestamptzType

    whole, partly = [], False
    if table is not None and intervals and table.current_snapshot() is not None:
        field_id = table.schema().find_field(TIME).field_id
        for task in table.scan(row_filter=_interval_filter(intervals)).plan_files():
            lo_b, hi_b = (task.file.lower_bounds or {}).get(field_id), \
                (task.file.upper_bounds or {}).get(field_id)
            if lo_b is None or hi_b is None:
                partly = True
                continue
            lo = int(from_bytes(TimestamptzType(), lo_b)) // 1000
            hi = int(from_bytes(TimestamptzType(), hi_b)) // 1000
            if any(s <= lo and hi < e for s, e in intervals):
                whole.append(task.file)
            else:
                partly = True
    if partly:
        tx.delete(_interval_filter(intervals), snapshot_properties=props)
        whole = []  # the delete above removed (or rewrote) them all
    snapshot = tx.update_snapshot(snapshot_properties=props)
    with snapshot.overwrite() if whole else snapshot.fast_append() as producer:
        for data_file in whole:
            producer.delete_data_file(data_file)
        for data_file in files:
            producer.append_data_file(data_file)


def publish_iceberg(out: IcebergOutput, spec: Any, version: str, staged: list[Segment],
                    shard_spec: Any, hooks: Hooks = NONE) -> list[dict[str, Any]]:
    """Commit ``staged`` to the table (:meth:`IcebergOutput.commit`); returns the segment
    descriptors for the task report, each ``path`` its data file's URI. Without a segment
    nothing is committed (the directory publisher drops nothing then either)."""
    if not staged:
        return []
    moves = describe(spec.data_source, version, staged, shard_spec, os.path.dirname(staged[0].path))
    out.metadata_location = out.commit(staged, spec.data_source, spec.append_to_existing,
                                       hooks)
    uris = dict(out.data_files_of)
    published = []
    for source, desc in moves:
        published.append({**desc, "path": uris[source]})
    if out.local_data_dir:
        remove_unpublished({source for source, _ in moves})  # attempts that did not commit
    return published

"""The Python API of the main job: ingestion with an embedded daemon when none is given."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any


def ingest(spec: Any, *, master: str | None = None,
           shuffle_servers: Sequence[str] | None = None, output_dir: str = "segments",
           token: str | None = None, ca_file: str | None = None,
           progress: Callable[[str], None] | None = None, show_rows: int = 0,
           reader: str = "auto", signing_secret: bytes | None = None,
           output: str | None = None, stall_seconds: float | None = None) -> Any:
    """Run a Druid ``index_parallel`` spec on Spark through shuffled.

    With no ``shuffle_servers`` an embedded daemon runs on a free loopback port with a
    temporary location for the job's lifetime. ``reader`` is phase 1's input reader (see
    :func:`shuffled.spark.run_ingestion`). ``signing_secret``: the daemons' signing secret
    (per-task tokens, docs/security.md). ``output`` (when given, instead of
    ``output_dir``): a directory, ``s3://bucket/prefix`` or an Apache Iceberg table
    ``iceberg://CATALOG/NAMESPACE.TABLE`` (docs/iceberg.md). ``stall_seconds``: how long
    a Spark job may make no progress before the ingestion fails (None: the default).
    Returns the pipeline's IngestResult.
    """
    output_dir = output or output_dir
    from shuffled.spark import parse_spec, run_ingestion
    from shuffled.spark.driver.watchdog import DEFAULT_STALL_SECONDS

    stall = DEFAULT_STALL_SECONDS if stall_seconds is None else stall_seconds

    parsed = parse_spec(spec)  # refuse a bad spec before any daemon or Spark starts
    say = progress or (lambda line: None)
    if shuffle_servers:
        result = run_ingestion(parsed, shuffle_servers=list(shuffle_servers), master=master,
                               output_dir=output_dir, token=token, ca_file=ca_file,
                               progress=progress, reader=reader,
                               signing_secret=signing_secret, stall_seconds=stall)
    else:
        from shuffled.server.embedded import EmbeddedDaemon

        with tempfile.TemporaryDirectory(prefix="shuffled-embedded-") as tmp:
            secrets = (signing_secret,) if signing_secret else ()
            with EmbeddedDaemon([tmp], auth_token=token, signing_secrets=secrets) as url:
                say(f"embedded shuffle daemon at {url} (location {tmp})")
                result = run_ingestion(parsed, shuffle_servers=[url], master=master,
                                       output_dir=output_dir, token=token, ca_file=ca_file,
                                       progress=progress, reader=reader,
                                       signing_secret=signing_secret, stall_seconds=stall)
    if show_rows:
        _show_rows(output_dir, show_rows, say)
    return result


def _show_rows(output_dir: str, limit: int, say: Callable[[str], None]) -> None:
    import pathlib

    if output_dir.lower().startswith("iceberg://"):
        _show_table(output_dir, limit, say)
        return
    import pyarrow.parquet as pq

    files = sorted(pathlib.Path(output_dir).rglob("*.parquet"))
    shown = 0
    for path in files:
        table = pq.read_table(path)
        say(f"-- {path.relative_to(output_dir)}: {table.num_rows} rows")
        for row in table.slice(0, max(0, limit - shown)).to_pylist():
            say("   " + ", ".join(f"{k}={v}" for k, v in row.items()))
            shown += 1
        if shown >= limit:
            break


def _show_table(uri: str, limit: int, say: Callable[[str], None]) -> None:
    """The first rows of an Iceberg table as pyiceberg reads it back."""
    from shuffled.spark.phase2.iceberg import load_catalog, parse_uri

    target = parse_uri(uri)
    table = load_catalog(target.catalog).load_table(target.identifier)
    rows = table.scan(limit=limit).to_arrow()
    say(f"-- {uri} read back by pyiceberg ({table.location()}): "
        f"{len(table.snapshots())} snapshot(s), first {rows.num_rows} rows")
    for row in rows.to_pylist():
        say("   " + ", ".join(f"{k}={v}" for k, v in row.items()))

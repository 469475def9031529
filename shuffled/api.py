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
        _show_rows(result, show_rows, say)
    return result


def _show_rows(result: Any, limit: int, say: Callable[[str], None]) -> None:
    """The first rows of what ``result``'s ingestion published, read through the manifest
    it wrote (local or ``s3://``): the segments it lists for this ingestion, never other
    files under the output (another dataSource, a version replaced, a file no manifest
    names)."""
    if result.table is not None:
        _show_table(result.table, limit, say)
        return
    import io
    import json
    import posixpath

    import pyarrow.parquet as pq

    from shuffled.spark.fs import remote

    base = posixpath.dirname(result.manifest_path)
    if remote.is_remote(result.manifest_path):
        body = remote.read_bytes(result.manifest_path)
        manifest = json.loads(body) if body else {"segments": []}
    else:
        with open(result.manifest_path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    ours = {(s["interval"], s["version"], s["partitionNum"]) for s in result.segments}
    shown = 0
    for seg in manifest["segments"]:
        if (seg["interval"], seg["version"], seg["partitionNum"]) not in ours:
            continue
        where = f"{base}/{seg['path']}"
        if remote.is_remote(where):
            table = pq.read_table(io.BytesIO(remote.read_bytes(where) or b""))
        else:
            table = pq.read_table(where)
        say(f"-- {result.data_source}/{seg['path']}: {table.num_rows} rows")
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

"""Shared fixtures: real daemons on loopback with real temp directories."""

from __future__ import annotations

import io
import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from shuffled.config import Settings, load_settings
from shuffled.server import make_app
from shuffled.server.embedded import EmbeddedDaemon

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Helpers shared by test modules (tests/helpers/) give assertion messages as tests do.
pytest.register_assert_rewrite("tests.helpers")

PREFIX = "/druid/worker/v1/shuffle"
DAY = {"start": "2018-01-01T00:00:00.000Z", "end": "2018-01-02T00:00:00.000Z"}


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """The current value of one sample (``name`` as exported: a counter's ends in
    ``_total``), read through prometheus-client's public API; it must be exported."""
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels or ''} is not exported"
    return value


def arrow_bytes(table: pa.Table, batch_rows: int | None = None) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=batch_rows)
    return sink.getvalue()


def sample_table(rows: int = 10, seed: int = 0) -> pa.Table:
    return pa.table({
        "__time": pa.array([1514764800000 + i * 1000 for i in range(rows)], pa.int64()),
        "dim": pa.array([f"d{(i + seed) % 7}" if i % 5 else None for i in range(rows)]),
        "count": pa.array([seed + i for i in range(rows)], pa.int64()),
    })


def files_under(root: Path) -> list[Path]:
    """Every data file in a location: packs and anything else, but not the lock nor the
    catalog and format mark under ``.shuffled/`` (temp dir included: it must be empty)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != ".lock"
                  and ".shuffled" not in p.relative_to(root).parts)


def packed_size(bodies: Iterable[bytes], packs: int = 1) -> int:
    """Bytes ``packs`` packs hold for these Arrow streams appended to them (storage format
    3): each distinct schema message once per pack, each body, no end-of-stream marker."""
    from shuffled.storage.ondisk.arrowfile import inspect_bytes

    schemas: dict[int, int] = {}
    total = 0
    for body in bodies:
        facts = inspect_bytes(body)
        schemas[facts.schema_crc] = facts.schema_len
        total += len(body) - facts.schema_len - 8
    return total + packs * sum(schemas.values())


def pack_records(pack: Path) -> list[Any]:
    """The commit records in a pack file (storage format 5), read with its location's key:
    ``shuffled.storage.ondisk.commits.Record``s, in file order."""
    from shuffled.storage.ondisk import commits

    root = pack.parent.parent
    key = commits.key_path(root).read_bytes()
    fd = os.open(pack, os.O_RDONLY)
    try:
        return commits.scan(fd, 0, os.fstat(fd).st_size, key, pack.parent.name, int(pack.stem))
    finally:
        os.close(fd)


def data_size(pack: Path) -> int:
    """A pack file's length but its commit records: what :func:`packed_size` counts."""
    return pack.stat().st_size - sum(r.end - r.at for r in pack_records(pack))


def pack_ends(root: Path, sup: str = "sup") -> dict[int, int]:
    """Per pack of ``sup`` the catalog names: the end of its last committed partial, or of
    the commit record after it (storage format 5). A pack no row names is not listed."""
    ends: dict[int, int] = {}
    for row in catalog_rows(root, sup):
        ends[row[5]] = max(ends.get(row[5], 0), row[9])
    for pack in pack_files(root, sup):
        records = pack_records(pack)
        number = int(pack.stem)
        if records and number in ends:
            ends[number] = max(ends[number], records[-1].end)
    return ends


def committed_bytes(root: Path, sup: str) -> int:
    """Bytes the committed partials of ``sup`` take in a location's packs (catalog): each
    body, and each schema message they refer to once. A pack holding more has a refused
    or uncommitted upload's bytes in it."""
    rows = catalog_rows(root, sup)
    schemas = {(r[5], r[10]): r[7] - (r[9] - r[6]) - 8 for r in rows}
    return sum(r[9] - r[6] for r in rows) + sum(schemas.values())


def stored_stream(root: Path, sup: str, row: tuple[Any, ...]) -> bytes:
    """The Arrow stream a :func:`catalog_rows` row stands for, read from its pack: schema
    message + body + end-of-stream marker."""
    _, _, _, _, _, pack, offset, size, _, body_end, schema_at = row
    schema_len = size - (body_end - offset) - 8
    with open(root / sup / f"{pack}.pack", "rb") as fh:
        data = fh.read()
    return data[schema_at: schema_at + schema_len] + data[offset: body_end] + b"\xff" * 4 + b"\0" * 4


def pack_files(root: Path, sup: str | None = None) -> list[Path]:
    """The pack files of a location (of one supervisor task if named)."""
    return sorted(p for p in root.glob(f"{sup or '*'}/*.pack") if p.is_file())


def catalog_rows(root: Path, sup: str) -> list[tuple[Any, ...]]:
    """A location's catalog rows of ``sup`` (read-only): (sub, start, end, pid, generation,
    pack, offset, size, crc, body end, schema at): ``offset`` is where the body starts in
    the pack, ``size`` the stream's length, ``body end`` where its stored bytes end
    (storage format 3: the end-of-stream marker is not stored)."""
    db = root / ".shuffled" / "catalog.sqlite"
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(
            'SELECT sub, start, "end", pid, generation, pack, "offset", size, crc, '
            '"offset" + size - schema_len - 8, schema_at '
            "FROM partials WHERE sup = ? ORDER BY start, \"end\", pid, sub", (sup,)).fetchall()
    finally:
        conn.close()


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def factory(locations: int | list[str] = 2, **overrides: Any) -> Settings:
        if isinstance(locations, int):
            locations = [str(tmp_path / f"loc{i}") for i in range(locations)]
        values: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "locations": locations,
                                  "free_space_reserve": 0, "access_log": False}
        values.update(overrides)
        return load_settings(environ={}, overrides=values)

    return factory


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings()


@pytest.fixture
async def start_daemon() -> AsyncIterator[Callable[..., Any]]:
    """Start real daemons (aiohttp TestServer on 127.0.0.1); all stopped at the end."""
    clients: list[TestClient] = []

    async def start(settings: Settings, **kwargs: Any) -> TestClient:
        app = make_app(settings, registry=kwargs.pop("registry", CollectorRegistry()), **kwargs)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in reversed(clients):
        await client.close()


@pytest.fixture
async def daemon(start_daemon: Callable[..., Any], settings: Settings) -> TestClient:
    return await start_daemon(settings)


@pytest.fixture
def daemon_url(tmp_path: Path) -> Iterator[str]:
    """A real daemon on a background thread, for synchronous clients."""
    with EmbeddedDaemon([tmp_path / "emb0", tmp_path / "emb1"], free_space_reserve=0) as url:
        yield url


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark standalone cluster (master and two workers on loopback) for every test that
    needs one (test_failover, test_spark_cluster): started once, its JVMs' start being
    most of a small job's time; stopped by pid at the end of the session."""
    from tests.helpers.spark_cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("cluster")) as master:
        yield master

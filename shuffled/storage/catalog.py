"""One location's catalog: every partial segment held there, in SQLite.

Why SQLite (stdlib ``sqlite3``) and not a manifest per pack: a restart opens the file
instead of parsing one record per partial (1M partials: ready in well under a second, not
tens of seconds), memory stays at SQLite's page cache whatever the count, a page of a task
listing is an index range scan, and one transaction commits any number of partials with
one WAL fsync (the group commit's second half). Measured in bench/scale.py.

Two connections: the writer, used only on the location's writer thread (commits, deletes,
recovery), and the reader, used only on the event loop thread for point and range queries.
In WAL mode a reader never waits for the writer and sees only committed transactions.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from shuffled.storage.ondisk import layout
from shuffled.storage.ondisk.records import CatalogRow, slot_key
from shuffled.storage.ondisk import slabrows
from shuffled.storage.ondisk.slabrows import SlabRow

#: Storage format 3: ``offset`` is where the body starts, ``schema_at`` where the schema
#: message is, ``size`` the whole stream's length (:class:`~shuffled.storage.ondisk.records.PartialMeta`).
COLUMNS = CatalogRow._fields
_COLS = ", ".join(f'"{c}"' for c in COLUMNS)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS partials (
    sup TEXT NOT NULL, start INTEGER NOT NULL, "end" INTEGER NOT NULL, pid INTEGER NOT NULL,
    sub TEXT NOT NULL, generation INTEGER NOT NULL, pack INTEGER NOT NULL,
    "offset" INTEGER NOT NULL, size INTEGER NOT NULL, rows INTEGER NOT NULL,
    crc INTEGER NOT NULL, schema_len INTEGER NOT NULL, schema_crc INTEGER NOT NULL,
    body_crc INTEGER NOT NULL, dicts INTEGER NOT NULL, created REAL NOT NULL,
    schema_at INTEGER NOT NULL,
    PRIMARY KEY (sup, start, "end", pid, sub)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS partials_by_pack ON partials (sup, pack, "offset");
"""
_KEY = 'sup = ? AND start = ? AND "end" = ? AND pid = ?'
_BODY_END = '"offset" + size - schema_len - 8'  # where a partial's body ends in its pack
_INSERT = f"INSERT OR REPLACE INTO partials ({_COLS}) VALUES ({', '.join('?' * len(COLUMNS))})"
_INSERT_NEW = _INSERT.replace("INSERT OR REPLACE", "INSERT OR IGNORE")
_COLS_P = ", ".join(f'p."{c}"' for c in COLUMNS)
_IN_LIMIT = 500  # subtask ids named in one IN (...); more are filtered in Python
_FIND_BATCH = 1000  # keys per batched lookup (5 parameters each, under SQLite's limit)

Row = CatalogRow


class KeyGeneration(NamedTuple):
    """A partial's identity and one generation of it (the columns of a catalog row that
    name one copy: what a forget removes)."""

    sup: str
    start: int
    end: int
    pid: int
    sub: str
    generation: int


class SharedKey(NamedTuple):
    """A key two locations both hold: its copy here, and the generation of the copy
    there."""

    here: KeyGeneration
    there: int


def _named(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> CatalogRow:
    return CatalogRow._make(row)


def _rows(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
    """``conn.execute`` of a query selecting every column: rows come back named."""
    cur = conn.cursor()
    cur.row_factory = _named
    return cur.execute(sql, args)
F = TypeVar("F", bound=Callable[..., Any])

# SQLite's result codes that mean the disk, not the query: as the errno the I/O boundary
# (shuffled.storage.oserrors) already maps to a domain error and a location's health.
_ERRNO = {"SQLITE_READONLY": errno.EROFS, "SQLITE_FULL": errno.ENOSPC,
          "SQLITE_CANTOPEN": errno.EACCES, "SQLITE_PERM": errno.EACCES}


def as_os_error(exc: sqlite3.Error) -> OSError:
    """A catalog failure as the OSError the store handles for any other disk failure."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    base = "_".join(name.split("_")[:2])  # SQLITE_IOERR_WRITE -> SQLITE_IOERR
    code = _ERRNO.get(base, errno.EIO)
    return OSError(code, f"catalog: {exc} ({name or 'sqlite error'})")


def _disk_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except sqlite3.Error as exc:
            raise as_os_error(exc) from exc
    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on failure. SQLite rolls a
    transaction back by itself on some errors (SQLITE_FULL among them): the ROLLBACK is
    then skipped, so the error raised is the disk's ("database or disk is full"), not
    "cannot rollback - no transaction is active"."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the first error is the one to report
        raise


@contextlib.contextmanager
def _no_wal_sync(conn: sqlite3.Connection) -> Iterator[None]:
    """Commits in this block do not wait for the WAL's fsync (``synchronous=NORMAL``): for
    rows whose truth is synced elsewhere (a slab file, a pack's commit record). The next
    synced commit carries them to disk anyway."""
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        yield
    finally:
        conn.execute("PRAGMA synchronous=FULL")


def _newer_than_held(conn: sqlite3.Connection, row: Row) -> bool:
    """Whether ``row``'s key is not held at its generation or a newer one."""
    held = conn.execute(f"SELECT generation FROM partials WHERE {_KEY} AND sub = ?",
                        row.key).fetchone()
    return held is None or held[0] < row.generation


def _connect(path: Path, fsync: bool) -> sqlite3.Connection:
    # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    # FULL: a COMMIT returns once the WAL is fsynced, so an acknowledged partial survives a
    # power loss. OFF when the daemon runs with fsync off (its data files are not synced).
    conn.execute(f"PRAGMA synchronous={'FULL' if fsync else 'OFF'}")
    conn.execute("PRAGMA cache_size=-8192")  # 8 MiB per connection, whatever the count
    conn.execute("PRAGMA temp_store=MEMORY")
    return conn


class Catalog:
    """The SQLite index of one location (see the module docstring for threading)."""

    def __init__(self, root: Path, fsync: bool) -> None:
        self.root = root
        self.path = layout.catalog_path(root)
        self.fsync = fsync
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None

    # -- lifecycle (blocking) ------------------------------------------------------------

    @_disk_errors
    def open(self) -> None:
        self.path.parent.mkdir(exist_ok=True)
        self._writer = _connect(self.path, self.fsync)
        self._writer.executescript(_SCHEMA + slabrows.SCHEMA)
        self._reader = _connect(self.path, self.fsync)

    def close(self) -> None:
        for conn in (self._reader, self._writer):
            if conn is not None:
                conn.close()
        self._reader = self._writer = None

    @property
    def writer(self) -> sqlite3.Connection:
        assert self._writer is not None, "catalog not open"
        return self._writer

    @property
    def reader(self) -> sqlite3.Connection:
        assert self._reader is not None, "catalog not open"
        return self._reader

    # -- writes (writer thread) ----------------------------------------------------------

    @_disk_errors
    def commit(self, rows: Sequence[Row], *, recorded: bool = False) -> list[int | None]:
        """Insert or replace ``rows`` in one transaction; per row the size of the partial
        it replaced (None if new). Durable on return when fsync is on, unless ``recorded``:
        their packs hold synced commit records naming them (storage.ondisk.commits), the
        truth a lagging catalog is brought up to date from at start, so the transaction
        does not wait for the WAL's fsync (``synchronous=NORMAL`` for it alone). The next
        synced transaction carries it to disk anyway."""
        if recorded and self.fsync:
            with _no_wal_sync(self.writer):
                return self.commit(rows)
        conn = self.writer
        old: list[int | None] = [None] * len(rows)
        with _transaction(conn):
            before = conn.total_changes
            conn.executemany(_INSERT_NEW, rows)
            if conn.total_changes - before != len(rows):
                # Some keys were there already (a replace): those rows were ignored. Find
                # them by their generation and replace, one by one (a key may come twice).
                for i, row in enumerate(rows):
                    held = conn.execute(f"SELECT generation, size FROM partials WHERE {_KEY} "
                                        f"AND sub = ?", row.key).fetchone()
                    if held is not None and held[0] != row.generation:
                        old[i] = held[1]
                        conn.execute(_INSERT, row)
        return old

    @_disk_errors
    def insert_slab(self, row: SlabRow) -> bool:
        """The row of a slab whose file is synced and renamed; False if the key was held.
        Its commit does not wait for the WAL's fsync (``synchronous=NORMAL`` for this
        one statement): the file is the commit, and a row a power loss takes is rebuilt
        from it at start (:func:`shuffled.storage.slabs.service.reconcile_slabs`). So a
        slab costs the file's sync and its directory's, not a third. The next synced
        commit carries the row to disk anyway."""
        conn = self.writer
        if not self.fsync:
            return slabrows.insert(conn, row)
        with _no_wal_sync(conn):
            return slabrows.insert(conn, row)

    def connect_reader(self) -> sqlite3.Connection:
        """A read connection for the calling thread (another location's writer)."""
        return _connect(self.path, self.fsync)

    def find(self, conn: sqlite3.Connection, rows: Sequence[Row]) -> list[Row]:
        """The rows held here under the keys of ``rows`` (batched lookups)."""
        out: list[Row] = []
        for at in range(0, len(rows), _FIND_BATCH):
            chunk = rows[at: at + _FIND_BATCH]
            values = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
            args = [v for row in chunk for v in row.key]
            out.extend(_rows(
                conn, f'WITH k(sup, start, "end", pid, sub) AS (VALUES {values}) '
                f"SELECT {_COLS_P} FROM partials p JOIN k USING (sup, start, \"end\", pid, sub)",
                args).fetchall())
        return out

    @_disk_errors
    def delete_task(self, sup: str) -> None:
        with _transaction(self.writer):
            self.writer.execute("DELETE FROM partials WHERE sup = ?", (sup,))
            slabrows.delete_task(self.writer, sup)

    @_disk_errors
    def forget(self, row: Row) -> None:
        """Remove exactly this generation of a partial (replaced by one in another
        location); a newer one written here since is kept."""
        self.writer.execute(f"DELETE FROM partials WHERE {_KEY} AND sub = ? AND generation = ?",
                            (*row.key, row.generation))

    @_disk_errors
    def drop_past(self, sup: str, pack: int, end: int) -> int:
        """Forget partials of a pack whose body extends past ``end`` (its bytes are gone)."""
        cur = self.writer.execute(
            f"DELETE FROM partials WHERE sup = ? AND pack = ? AND {_BODY_END} > ?",
            (sup, pack, end))
        return cur.rowcount

    @_disk_errors
    def drop_pack(self, sup: str, pack: int) -> int:
        cur = self.writer.execute("DELETE FROM partials WHERE sup = ? AND pack = ?", (sup, pack))
        return cur.rowcount

    @_disk_errors
    def lacking(self, rows: Sequence[Row]) -> list[Row]:
        """Those of ``rows`` whose key is not held at their generation or a newer one."""
        return [row for row in rows if _newer_than_held(self.writer, row)]

    @_disk_errors
    def restore(self, rows: Sequence[Row]) -> int:
        """Rows read back from commit records at start: each inserted unless this key is
        held at the same or a newer generation (one transaction, synced); the number
        inserted."""
        conn = self.writer
        restored = 0
        with _transaction(conn):
            for row in rows:
                if _newer_than_held(conn, row):
                    conn.execute(_INSERT, row)
                    restored += 1
        return restored

    @_disk_errors
    def insert_many(self, rows: Iterable[Row]) -> None:
        """Bulk insert in one transaction (migration)."""
        conn = self.writer
        with _transaction(conn):
            conn.executemany(_INSERT, rows)

    # -- recovery (writer thread, before serving) ----------------------------------------

    @_disk_errors
    def make_durable(self) -> None:
        """Checkpoint the WAL into the database, syncing both (with fsync on): every
        committed row is then durable, those of ``recorded`` commits included."""
        self.writer.execute("PRAGMA wal_checkpoint(FULL)").fetchall()

    def pack_tail(self, sup: str, pack: int) -> tuple[int, int, int] | None:
        """The last body of one pack: (offset, length, CRC32C), or None if it holds none
        (a schema message is always before the bodies that refer to it)."""
        tail: tuple[int, int, int] | None = self.writer.execute(
            f'SELECT "offset", size - schema_len - 8, body_crc FROM partials '
            f'WHERE sup = ? AND pack = ? ORDER BY "offset" DESC LIMIT 1', (sup, pack)).fetchone()
        return tail

    @_disk_errors
    def shared_keys(self, other: Path) -> list[SharedKey]:
        """Keys this catalog and ``other`` (another location's) both hold. A crash between
        a replace landing in one location and the older copy being forgotten in the other
        leaves both."""
        conn = self.writer
        conn.execute("ATTACH DATABASE ? AS other", (str(other),))
        try:
            return [SharedKey(KeyGeneration(*r[:6]), r[6]) for r in conn.execute(
                'SELECT p.sup, p.start, p."end", p.pid, p.sub, p.generation, o.generation '
                'FROM main.partials p JOIN other.partials o USING (sup, start, "end", pid, sub)')]
        finally:
            conn.execute("DETACH DATABASE other")

    @_disk_errors
    def forget_many(self, rows: Sequence[KeyGeneration]) -> None:
        """:meth:`forget` each of ``rows`` in one transaction."""
        conn = self.writer
        with _transaction(conn):
            conn.executemany(  # a KeyGeneration's fields are the statement's parameters
                f"DELETE FROM partials WHERE {_KEY} AND sub = ? AND generation = ?", rows)

    def packs(self) -> set[tuple[str, int]]:
        return set(self.writer.execute("SELECT DISTINCT sup, pack FROM partials").fetchall())

    def task_figures(self) -> list[tuple[str, int, int, int]]:
        """Per supervisor task: (sup, partials, bytes, newest generation)."""
        return self.writer.execute(
            "SELECT sup, COUNT(*), SUM(size), MAX(generation) FROM partials GROUP BY sup"
        ).fetchall()

    def slot_keys(self) -> dict[str, set[int]]:
        """Per supervisor task, the slot_key() of each of its partitions, read row by row
        (a list of a million tuples first would double the peak memory)."""
        out: dict[str, set[int]] = {}
        cursor = self.writer.execute('SELECT DISTINCT sup, start, "end", pid FROM partials')
        for sup, start, end, pid in cursor:
            keys = out.get(sup)
            if keys is None:
                keys = out[sup] = set()
            keys.add(slot_key(start, end, pid))
        return out

    # -- reads (event loop thread) -------------------------------------------------------

    def lookup(self, sup: str, start: int, end: int, pid: int, sub: str) -> Row | None:
        row: Row | None = _rows(
            self.reader, f"SELECT {_COLS} FROM partials WHERE {_KEY} AND sub = ?",
            (sup, start, end, pid, sub)).fetchone()
        return row

    def partition(self, sup: str, start: int, end: int, pid: int,
                  subs: Sequence[str] | None) -> list[Row]:
        """The partials of one partition, all or those of ``subs`` (found ones only)."""
        args: tuple[Any, ...] = (sup, start, end, pid)
        sql = f"SELECT {_COLS} FROM partials WHERE {_KEY}"
        if subs is not None and len(subs) <= _IN_LIMIT:
            sql += f" AND sub IN ({', '.join('?' * len(subs))})"
            args += tuple(subs)
        rows: list[Row] = _rows(self.reader, sql, args).fetchall()
        if subs is not None and len(subs) > _IN_LIMIT:
            wanted = set(subs)
            rows = [r for r in rows if r.sub in wanted]
        return rows

    def partitions(self, sup: str, slots: Sequence[tuple[int, int, int]]) -> list[Row]:
        """Every partial of these partitions (start, end, partitionId) of ``sup``: one query
        per :data:`_FIND_BATCH` of them (a bulk read asks for up to a thousand; a query each
        cost more than reading them)."""
        out: list[Row] = []
        for at in range(0, len(slots), _FIND_BATCH):
            chunk = slots[at: at + _FIND_BATCH]
            values = ", ".join(["(?, ?, ?)"] * len(chunk))
            out.extend(_rows(
                self.reader, f'WITH k(start, "end", pid) AS (VALUES {values}) SELECT '
                f'{_COLS_P} FROM partials p JOIN k USING (start, "end", pid) WHERE p.sup = ?',
                [*(v for slot in chunk for v in slot), sup]).fetchall())
        return out

    def page(self, sup: str, after: tuple[int, int, int, str] | None, limit: int) -> list[Row]:
        """Up to ``limit`` partials of ``sup`` after ``after`` in (start, end, partitionId,
        subTaskId) order: an index range scan, whatever the task's size."""
        if after is None:
            return _rows(
                self.reader, f'SELECT {_COLS} FROM partials WHERE sup = ? ORDER BY start, '
                f'"end", pid, sub LIMIT ?', (sup, limit)).fetchall()
        return _rows(
            self.reader, f'SELECT {_COLS} FROM partials WHERE sup = ? AND (start, "end", pid, sub) > '
            f'(?, ?, ?, ?) ORDER BY start, "end", pid, sub LIMIT ?',
            (sup, *after, limit)).fetchall()

    @_disk_errors
    def task_slabs(self, sup: str, subs: Iterable[str] | None = None) -> list[SlabRow]:
        """The slab rows of ``sup`` (of ``subs`` only, if named), through a connection of
        its own (any thread: the deep-storage offload reads them on its threads)."""
        conn = self.connect_reader()
        try:
            return slabrows.of_task(conn, sup, subs)
        finally:
            conn.close()

    @_disk_errors
    def task_rows(self, sup: str) -> list[Row]:
        """Every row of ``sup``, through a connection of its own (any thread: the
        deep-storage offload reads them on its threads, not the writer's)."""
        conn = self.connect_reader()
        try:
            rows: list[Row] = _rows(
                conn, f"SELECT {_COLS} FROM partials WHERE sup = ? ORDER BY pack, \"offset\"",
                (sup,)).fetchall()
            return rows
        finally:
            conn.close()

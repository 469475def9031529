"""The catalog's ``slabs`` table: one row per slab held at a location (storage format 4).

The index and statistics stay the Arrow IPC bytes that came: no Python object per batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import NamedTuple

SCHEMA = """
CREATE TABLE IF NOT EXISTS slabs (
    sup TEXT NOT NULL, sub TEXT NOT NULL, slab INTEGER NOT NULL, attempt INTEGER NOT NULL,
    kind INTEGER NOT NULL, size INTEGER NOT NULL, rows INTEGER NOT NULL,
    data_at INTEGER NOT NULL, data_len INTEGER NOT NULL, crc INTEGER NOT NULL,
    created REAL NOT NULL, idx BLOB NOT NULL, stats BLOB NOT NULL,
    PRIMARY KEY (sup, sub, slab, attempt)
) WITHOUT ROWID;
"""


class SlabRow(NamedTuple):
    """A slab's catalog row (named: it crosses from the catalog to the store and reads)."""

    sup: str
    sub: str
    slab: int
    attempt: int
    kind: int
    size: int  # the file's bytes
    rows: int
    data_at: int  # where the data section starts in the file
    data_len: int
    crc: int  # CRC32C of the data section
    created: float
    idx: bytes
    stats: bytes


_COLS = ", ".join(SlabRow._fields)
_INSERT = f"INSERT OR IGNORE INTO slabs ({_COLS}) VALUES ({', '.join('?' * len(SlabRow._fields))})"


def insert(conn: sqlite3.Connection, row: SlabRow) -> bool:
    """One row, in its own transaction (autocommit); False if the key was held already."""
    cur = conn.execute(_INSERT, row)
    return cur.rowcount == 1


def get(conn: sqlite3.Connection, sup: str, sub: str, slab: int, attempt: int) -> SlabRow | None:
    found = conn.execute(f"SELECT {_COLS} FROM slabs WHERE sup = ? AND sub = ? AND slab = ? "
                         "AND attempt = ?", (sup, sub, slab, attempt)).fetchone()
    return None if found is None else SlabRow(*found)


def of_task(conn: sqlite3.Connection, sup: str, subs: Iterable[str] | None = None,
            ) -> list[SlabRow]:
    rows = [SlabRow(*r) for r in conn.execute(
        f"SELECT {_COLS} FROM slabs WHERE sup = ? ORDER BY sub, slab, attempt", (sup,))]
    if subs is not None:
        wanted = set(subs)
        rows = [r for r in rows if r.sub in wanted]
    return rows


def figures(conn: sqlite3.Connection) -> list[tuple[str, int, int]]:
    """Per task: slabs held and their bytes."""
    return conn.execute("SELECT sup, COUNT(*), SUM(size) FROM slabs GROUP BY sup").fetchall()


def keys(conn: sqlite3.Connection) -> set[tuple[str, str, int, int]]:
    return set(conn.execute("SELECT sup, sub, slab, attempt FROM slabs").fetchall())


def delete_task(conn: sqlite3.Connection, sup: str) -> None:
    conn.execute("DELETE FROM slabs WHERE sup = ?", (sup,))


def delete(conn: sqlite3.Connection, sup: str, sub: str, slab: int, attempt: int) -> None:
    conn.execute("DELETE FROM slabs WHERE sup = ? AND sub = ? AND slab = ? AND attempt = ?",
                 (sup, sub, slab, attempt))

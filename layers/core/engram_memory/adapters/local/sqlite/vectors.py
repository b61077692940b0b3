"""The semantic projection: one vector table per scope, beside its FTS5 table.

``vec_<scope hash>``: record id → float32 little-endian vector. It is written and deleted by the
same projection change as the lexical row, in the same transaction (``projections``), so a
forgotten record's vector goes with its lexical projection. ``nearest`` is exact (dot products of
unit vectors = cosine similarity) over an in-memory matrix of the scope's vectors
(``vector_matrix``), reloaded when the table's generation, bumped in the transaction of every
vector write or delete, moved.
"""

from __future__ import annotations

import sqlite3
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import TypeVar

from engram_memory.adapters.local.sqlite.fulltext import lexical_table_name
from engram_memory.adapters.local.sqlite.rows import as_bytes
from engram_memory.engine.context import Scope

T = TypeVar("T")


def vector_table_name(scope: Scope) -> str:
    return "vec_" + lexical_table_name(scope)[4:]


def pack_vector(vector: Sequence[float]) -> bytes:
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_vector(blob: bytes) -> array[float]:
    vector = array("f")
    vector.frombytes(blob)
    if sys.byteorder == "big":
        vector.byteswap()
    return vector


def vector_table(conn: sqlite3.Connection, scope: Scope, *, create: bool) -> str | None:
    name = vector_table_name(scope)
    if create:
        conn.execute(
            # A rowid table, like records: a 1.5 KB vector in a WITHOUT ROWID row is a b-tree
            # key and spills past ~1,000 bytes onto an overflow page of its own (4 KiB a
            # vector); a rowid row keeps it on the page. Tables made before stay as they
            # are (same columns, same statements); a restore rebuilds them in this layout.
            f"CREATE TABLE IF NOT EXISTS {name} "
            "(record_id TEXT NOT NULL UNIQUE, vector BLOB NOT NULL)"
        )
        return name
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return name if row is not None else None


def _vectors_changed(conn: sqlite3.Connection, table: str) -> None:
    conn.execute(
        "INSERT INTO vector_generations VALUES (?, 1) ON CONFLICT (table_name) "
        "DO UPDATE SET generation = generation + 1",
        (table,),
    )


def insert(conn: sqlite3.Connection, scope: Scope, record_id: str, vector: Sequence[float]) -> None:
    table = vector_table(conn, scope, create=True)
    conn.execute(
        f"INSERT INTO {table} VALUES (?, ?)",  # noqa: S608 - internal name
        (record_id, pack_vector(vector)),
    )
    _vectors_changed(conn, vector_table_name(scope))


def delete(conn: sqlite3.Connection, scope: Scope, record_id: str) -> None:
    table = vector_table(conn, scope, create=False)
    if table is not None:
        deleted = conn.execute(
            f"DELETE FROM {table} WHERE record_id = ?",  # noqa: S608
            (record_id,),
        ).rowcount
        if deleted:
            _vectors_changed(conn, table)


def get(conn: sqlite3.Connection, scope: Scope, record_id: str) -> tuple[float, ...] | None:
    table = vector_table(conn, scope, create=False)
    row = (
        conn.execute(
            f"SELECT vector FROM {table} WHERE record_id = ?",  # noqa: S608
            (record_id,),
        ).fetchone()
        if table is not None
        else None
    )
    return None if row is None else tuple(unpack_vector(as_bytes(row[0])))


def with_matrix(
    conn: sqlite3.Connection,
    scope: Scope,
    use: Callable[[str, int, Callable[[], list[tuple[str, bytes]]]], T],
) -> T | None:
    """``use(table, generation, load)`` on the scope's vector table in one read snapshot
    (the generation and the rows it counts); None when the scope has no vector table."""
    table = vector_table(conn, scope, create=False)
    if table is None:
        return None

    def load() -> list[tuple[str, bytes]]:
        rows = conn.execute(f"SELECT record_id, vector FROM {table}").fetchall()  # noqa: S608
        return [(str(record_id), as_bytes(blob)) for record_id, blob in rows]

    conn.execute("BEGIN")
    try:
        row = conn.execute(
            "SELECT generation FROM vector_generations WHERE table_name = ?", (table,)
        ).fetchone()
        return use(table, row[0] if row else 0, load)
    finally:
        conn.execute("COMMIT")

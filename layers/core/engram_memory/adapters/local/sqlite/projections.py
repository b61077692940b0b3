"""A record's projections (its FTS5 row with its near-duplicate sketch and, with a semantic
channel, its vector), written and dropped together inside the caller's transaction: the commit's or the projector's own."""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

from engram_memory.adapters.local.sqlite import fulltext, near_bands, vectors
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import ProjectionChange


class TableFinder(Protocol):
    def __call__(self, conn: sqlite3.Connection, scope: Scope, *, create: bool) -> str | None: ...


def drops_projection(change: ProjectionChange | None) -> bool:
    return change is not None and change.delete_record_id is not None


def project(
    conn: sqlite3.Connection,
    scope: Scope,
    change: ProjectionChange,
    *,
    new_record: str | None = None,
) -> None:
    """Apply ``change``. ``new_record`` names the record whose row this same transaction
    inserted: it has no projection to drop first (its ``lex_rowid`` is NULL, and records are
    never deleted, so no vector of that id can outlive one), so an upsert of it skips the reads."""
    t, w = scope.tenant_id, scope.workspace_id
    if change.upsert is not None:
        doc = change.upsert
        table = fulltext.lexical_table(conn, scope, create=True)
        if doc.record_id != new_record:
            _unproject(conn, scope, doc.record_id)
        lex_rowid = fulltext.insert(conn, table, doc.record_id, doc.fields)
        if lex_rowid is not None and doc.text:
            near_bands.insert(conn, scope, table, lex_rowid, doc.text)
        conn.execute(
            "UPDATE records SET lex_rowid = ? WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
            (lex_rowid, t, w, doc.record_id),
        )
        if doc.vector is not None:
            vectors.insert(conn, scope, doc.record_id, doc.vector)
    if change.delete_record_id is not None:
        _unproject(conn, scope, change.delete_record_id)
        existing = fulltext.lexical_table(conn, scope, create=False)
        if existing is not None:
            fulltext.optimize(conn, existing)


def _unproject(conn: sqlite3.Connection, scope: Scope, record_id: str) -> None:
    vectors.delete(conn, scope, record_id)
    row = conn.execute(
        "SELECT lex_rowid FROM records WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
        (scope.tenant_id, scope.workspace_id, record_id),
    ).fetchone()
    if row is None or row[0] is None:
        return
    table = fulltext.lexical_table(conn, scope, create=False)
    if table is not None:
        near_bands.delete(conn, table, row[0])
        fulltext.delete(conn, table, row[0])
    conn.execute(
        "UPDATE records SET lex_rowid = NULL WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
        (scope.tenant_id, scope.workspace_id, record_id),
    )


def projected(conn: sqlite3.Connection, find: TableFinder, scope: Scope, record_id: str) -> bool:
    """Whether the scope's projection table ``find`` names holds a row for ``record_id``."""
    table = find(conn, scope, create=False)
    if table is None:
        return False
    row = conn.execute(
        f"SELECT 1 FROM {table} WHERE record_id = ? LIMIT 1",  # noqa: S608
        (record_id,),
    ).fetchone()
    return row is not None


def staleness(
    conn: sqlite3.Connection,
    lexical_version: str,
    vector_model: str | None,
    legacy_vector_model: str | None,
) -> tuple[list[tuple[Any, ...]], bool, bool]:
    """The projected records, whether their lexical fields are stale, and whether their
    vectors are (``vector_model`` None: the host has no semantic channel). The lexical fields
    are stale too without the near-duplicate sketches of this ``near_bands.VERSION`` (a store
    from before them: re-projecting each record writes its sketch, in place)."""
    row = conn.execute("SELECT value FROM store_meta WHERE key = 'lexical_version'").fetchone()
    sketch = conn.execute("SELECT value FROM store_meta WHERE key = 'near_bands'").fetchone()
    projected = conn.execute(
        "SELECT tenant_id, workspace_id, record_id, body FROM records "
        "WHERE lex_rowid IS NOT NULL AND body IS NOT NULL ORDER BY tenant_id, "
        "workspace_id, record_id"
    ).fetchall()
    model_row = conn.execute("SELECT value FROM store_meta WHERE key = 'vector_model'").fetchone()
    stale_lexical = (row is None and bool(projected)) or (
        row is not None and row[0] != lexical_version
    )
    stale_lexical |= bool(projected) and (sketch is None or sketch[0] != near_bands.VERSION)
    vectors_by = legacy_vector_model if model_row is None else model_row[0]
    stale_vectors = vector_model is not None and vectors_by != vector_model
    return projected, stale_lexical, stale_vectors

"""A copy of the canonical store without its projections (derived data, rebuilt on restore)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from engram_memory.adapters.local.sqlite.connections import ConnectionPool, guard
from engram_memory.engine.ports import StoreUnavailable


def backup_to(pool: ConnectionPool, target: Path) -> None:
    """A consistent copy of the canonical store at ``target`` (which must not exist), made
    with SQLite's online backup API beside live traffic, without its projections: the
    per-scope FTS5 (with their near-duplicate sketches) and vector tables are dropped from the copy (they are derived data, rebuilt
    on restore), the copy's projection outbox items with them, and the copy is vacuumed so no
    page of theirs survives in the file."""
    target = Path(target)
    fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    copy = sqlite3.connect(str(target), isolation_level=None)
    try:
        with guard(), pool.connection() as conn:
            conn.backup(copy)
        copy.execute("PRAGMA journal_mode = DELETE")
        copy.execute("PRAGMA secure_delete = ON")
        for (lexical_table,) in copy.execute("SELECT table_name FROM lexical_tables").fetchall():
            copy.execute(f"DROP TABLE IF EXISTS {lexical_table}")
            copy.execute(f"DROP TABLE IF EXISTS {lexical_table}_near")
            copy.execute(f"DROP TABLE IF EXISTS vec_{lexical_table[4:]}")
        copy.execute("DELETE FROM lexical_tables")
        copy.execute("UPDATE records SET lex_rowid = NULL WHERE lex_rowid IS NOT NULL")
        copy.execute("DELETE FROM outbox WHERE kind IN ('upsert_projection', 'drop_projection')")
        copy.execute("DELETE FROM store_meta WHERE key = 'lexical_version'")
        copy.execute("VACUUM")
    except sqlite3.Error as exc:
        copy.close()
        target.unlink(missing_ok=True)
        raise StoreUnavailable("the backup could not be written") from exc
    copy.close()

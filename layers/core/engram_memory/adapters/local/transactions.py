"""One write transaction on a SQLite connection opened in autocommit mode."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """``BEGIN IMMEDIATE`` (the write lock taken up front, so the transaction never has to
    upgrade a read lock and fail half-way), ``COMMIT`` when the block ends, ``ROLLBACK`` when it
    raises (anything, ``KeyboardInterrupt`` included: no transaction is left open)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")

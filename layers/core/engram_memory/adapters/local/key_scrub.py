"""Deleting a key from the key file: durable, and scrubbed from the file and its -wal, in 2 syncs.

The key file (``keys/candidate-keys.db``) runs in WAL mode with ``synchronous=FULL`` and
``secure_delete``. A deletion used to cost three syncs: the DELETE's own commit synced the -wal,
then ``wal_checkpoint(TRUNCATE)`` synced the -wal again before copying its pages into the
database file, synced the database file, and truncated the -wal. The first of those syncs buys
nothing that the checkpoint's own -wal sync does not: so the DELETE commits with
``synchronous=NORMAL`` (no sync at commit; the checkpoint syncs run at NORMAL as at FULL) and the
checkpoint makes it durable. When ``delete_and_scrub`` returns, exactly as before:

- the deletion is durable: the checkpoint synced the -wal holding it, then the database file
  holding its pages (secure_delete has zeroed the key's bytes in them);
- no copy of the key's bytes is left: the checkpoint wrote the zeroed pages over the database
  file and truncated the -wal that held the older page images.

A crash before it returns may lose the deletion, and nothing has relied on it yet: the caller
(the engine's outbox, ``Kernel.run_outbox``) marks its ``destroy_key`` item done only after this
returns, so after a restart the drainer deletes the key again (idempotent); admission answers
only after the item ran; withdraw's ``key_destruction`` reads the key file after it. The store's
commit that admitted the record comes first and never needs the candidate key again.

When another process holds an older snapshot of the key file the checkpoint cannot finish
(``busy``) and may not have synced anything: the -wal is then synced here before
``VaultUnavailable``-worthy ``sqlite3.OperationalError`` is raised, so the deletion is durable
though not yet scrubbed, as the vault's docstring says; the outbox retries the scrub.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence


def delete_and_scrub(conn: sqlite3.Connection, statement: str, parameters: Sequence[str]) -> None:
    """Run the DELETE ``statement`` on the key file (autocommit connection, WAL, secure_delete,
    ``synchronous=FULL``) so it is durable and scrubbed on return, with two syncs instead of
    three; raises ``sqlite3.OperationalError`` when the -wal could not be truncated."""
    conn.execute("PRAGMA synchronous=NORMAL")
    try:
        conn.execute(statement, tuple(parameters))
        (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            _sync_wal(conn)
            raise sqlite3.OperationalError("the key file's -wal could not be truncated")
    finally:
        conn.execute("PRAGMA synchronous=FULL")


def _sync_wal(conn: sqlite3.Connection) -> None:
    """fsync the key file's -wal (SQLite takes no lock on it, so another descriptor is safe)."""
    path = next(row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main")
    try:
        fd = os.open(path + "-wal", os.O_RDONLY)
    except FileNotFoundError:
        return  # checkpointed and removed by another connection, which synced the database
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

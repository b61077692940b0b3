"""The key file's writes, durable with as few syncs as SQLite's own discipline allows.

**Writing keys at capture** (``commit_synced_once``). Every destruction truncates the -wal (and
fills it with zeros again, ``wal_space``: room the next commits overwrite instead of growing the
file), so the next capture's commit is the first frame of a fresh -wal: at ``synchronous=FULL``
SQLite then syncs twice, once after the -wal header and once at the commit. The header sync keeps
a header that did not reach the disk from pairing with frames that did; it matters for a -wal
that is reused in place, where stale frames of the previous generation follow. Ours holds no
frame (empty, or zeros), so the commit runs at ``synchronous=OFF`` with automatic checkpoints
off (a checkpoint at OFF would not sync the database file) and the -wal is synced once when it
is written: on return, header and frames are durable, as they were after the two syncs. A crash
before that loses the commit, and nothing refers to the keys yet (the store's candidate row is
written after ``seal`` returns). When the -wal has started (a header) the commit runs at
``FULL`` as before (one sync, no header); a -wal that another process writes between the check
and the commit is covered by the same final sync.

**Deleting a key** (``delete_and_scrub``): durable, and scrubbed from the file and its -wal, in
2 syncs.

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
returns, so after a restart the drainer deletes the key again (idempotent); a rejection, a
withdraw or a forget answers only after the item ran (withdraw's ``key_destruction`` reads the
key file after it). The store's commit that ended the candidate or tombstoned the record comes
first and never needs the key again.

When another process holds an older snapshot of the key file the checkpoint cannot finish
(``busy``) and may not have synced anything: the -wal is then synced here before
``VaultUnavailable``-worthy ``sqlite3.OperationalError`` is raised, so the deletion is durable
though not yet scrubbed, as the vault's docstring says; the outbox retries the scrub.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path

from engram_memory.adapters.local import wal_space
from engram_memory.adapters.local.transactions import immediate


def commit_synced_once(
    conn: sqlite3.Connection, path: Path, write: Callable[[sqlite3.Connection], None]
) -> None:
    """Run ``write`` in one transaction of the key file at ``path`` (autocommit connection, WAL,
    ``synchronous=FULL``), durable on return after a single sync; errors roll it back and
    propagate (``sqlite3.Error``; a failed sync as ``sqlite3.OperationalError``)."""
    wal = f"{path}-wal"
    fresh = not wal_space.started(wal)  # empty, or room reserved after a scrub: no header yet
    autocheckpoint = 0
    if fresh:
        (autocheckpoint,) = conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA synchronous=OFF")
    try:
        with immediate(conn):
            write(conn)
        if fresh:
            try:
                _fsync(wal)
            except OSError as exc:
                raise sqlite3.OperationalError("the key file's -wal could not be synced") from exc
    finally:
        if fresh:
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA wal_autocheckpoint={int(autocheckpoint)}")


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
    wal_space.reserve(conn)  # the next seals overwrite the zeros instead of growing the -wal


def _sync_wal(conn: sqlite3.Connection) -> None:
    path = next(row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main")
    _fsync(Path(path + "-wal"))


def _fsync(wal: str | Path) -> None:
    """fsync the key file's -wal through a descriptor of our own (SQLite takes no lock on the
    -wal, its locks live in the -shm, so opening and closing it here releases none of them)."""
    try:
        fd = os.open(wal, os.O_RDONLY)
    except FileNotFoundError:
        return  # checkpointed and removed by another connection, which synced the database
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Room made ahead in an empty SQLite -wal, so a commit's sync overwrites blocks instead of
growing the file.

Syncing a write that grows a file must also make its new size durable (ext4: a journal
commit); syncing one that overwrites blocks the file already holds need not. Measured on this
project's machines, a 12 KiB append then ``fdatasync`` costs ~180 µs, the same 12 KiB written
over existing blocks ~90 µs, and a seal's median fell from 690 to 600 µs once the key file's
-wal had room (docs/benchmarks.md, "Room in the -wal"). A -wal grows from empty after every open (the last connection's
close deletes it) and after every truncating checkpoint (the scrubs of a destroyed key or a
shredded record), and only stops growing once an automatic checkpoint has restarted it from its
beginning: until then every commit of the key file and of the store paid the growing kind.

``reserve`` zero-fills an empty -wal, holding the database's write lock (``BEGIN IMMEDIATE``),
so no writer of any process appends meanwhile, and only when it holds nothing: 0 bytes means no
frame of any transaction and none a reader could be reading (the wal-index counts 0 frames).
SQLite writes a new -wal's header at offset 0 and its frames after it, whatever the file holds
further on, and its recovery reads a -wal whose header is zeros as empty (no valid magic), so
the zeros past the last frame, a crash during the fill, or a fill that never reached the disk
change nothing that is read back. The zeros hold nothing either: a scrub's promise (no earlier
page image left in the -wal) stands. The fill is not synced: the first commit into it syncs it
with its own frames (one growing sync, as before), and every later one overwrites.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from typing import Final

from engram_memory.adapters.local.transactions import immediate

__all__ = ["RESERVED_BYTES", "reserve", "started", "wal_path"]

log = logging.getLogger(__name__)

# 1 MiB: ~70 seals of the key file (3-4 frames each), ~4 capture + admission pairs of the store
# (~70 frames); zero-filling it costs ~0.3-0.5 ms.
RESERVED_BYTES: Final = 1 << 20

# The -wal header's magic number, big- or little-endian checksums (SQLite's file format, 4.1).
_WAL_MAGIC: Final = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")


def wal_path(conn: sqlite3.Connection) -> str | None:
    """The -wal of ``conn``'s main database; None for an in-memory or temporary one."""
    for _, name, path in conn.execute("PRAGMA database_list"):
        if name == "main":
            return f"{path}-wal" if path else None
    return None


def started(wal: str) -> bool:
    """Whether the -wal at ``wal`` holds a header, i.e. frames of the current generation may
    follow it: False for a missing, empty or reserved (zero-filled) one."""
    try:
        fd = os.open(wal, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        return os.pread(fd, 4, 0) in _WAL_MAGIC
    finally:
        os.close(fd)


def reserve(conn: sqlite3.Connection, size: int = RESERVED_BYTES) -> bool:
    """Zero-fill ``conn``'s -wal to ``size`` bytes when it is empty (autocommit connection, WAL
    mode). Whether it did: nothing is done to a -wal that holds anything, nor when the write
    lock is not free within the busy timeout (the room is an optimization; nothing waits on
    it), nor when the file cannot be written."""
    wal = wal_path(conn)
    if wal is None or _holds_anything(wal):
        return False  # e.g. another process serving: not even the lock is asked for
    try:
        with immediate(conn):
            return _fill_if_empty(wal, size)
    except (sqlite3.Error, OSError) as exc:
        log.info("no room reserved in the -wal: %s", type(exc).__name__)
        return False


def _holds_anything(wal: str) -> bool:
    try:
        return os.stat(wal).st_size != 0
    except FileNotFoundError:
        return True  # nothing to fill (SQLite makes it when the database is read)


def _fill_if_empty(wal: str, size: int) -> bool:
    try:
        fd = os.open(wal, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_size != 0:
            return False
        zeros = memoryview(bytes(size))
        written = 0
        while written < size:
            written += os.pwrite(fd, zeros[written:], written)
    finally:
        os.close(fd)
    return True

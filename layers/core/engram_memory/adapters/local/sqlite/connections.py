"""The store's SQLite connections: opened with its pragmas, pooled, and the WAL scrubbed."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

from engram_memory.adapters.local import wal_space
from engram_memory.engine.ports import StoreUnavailable

log = logging.getLogger(__name__)

DEFAULT_POOL_SIZE: Final = 8
# Each pooled connection's page cache, in KiB. SQLite's default (2 MiB) per connection filled
# slowly over hours of serving (8 connections: 16 MiB) and bought little: in WAL mode a
# connection drops its whole cache whenever another one has committed, so under mixed traffic
# the caches were mostly refilled, and the churn of their pages fragmented malloc's heap (issue
# 13's soak: RSS grew with the calls). A read that misses goes to the operating system's cache.
PAGE_CACHE_KIB: Final = 512


def connect(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA secure_delete = ON")  # shredded bodies are overwritten on disk
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")  # negative: KiB, not pages
    except BaseException:
        conn.close()
        raise
    return conn


@contextmanager
def guard() -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise StoreUnavailable("sqlite store error") from exc


def scrub_wal(conn: sqlite3.Connection, *, reserve_room: bool = True) -> None:
    """Copy the WAL into the database and truncate it to zero bytes, then (``reserve_room``)
    zero-fill it again so the commits that follow overwrite rather than grow it
    (``wal_space``).

    The WAL keeps earlier images of every page a transaction wrote, so a forgotten record's
    body and index terms would stay readable in ``engram.db-wal`` until later writes recycle
    it. Called after a commit that shredded something: ``secure_delete`` has already zeroed
    the freed cells and pages in the new images; the checkpoint writes those over the old
    ones in the database file, and the truncation drops the old images. It waits (busy
    timeout) for readers still on an older snapshot; when it cannot finish it is logged and
    the next shredding commit or ``close`` finishes it.
    """
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    except sqlite3.Error:
        busy = 1
    if busy:
        log.warning("could not truncate the WAL after a shredding commit; retried later")
    elif reserve_room:
        wal_space.reserve(conn)


class ConnectionPool:
    """SQLite connections checked out for one operation and then returned.

    At most ``size`` connections are open at once, however many threads call (the server's
    worker threads come and go: connections kept per thread leaked one per thread, with its file
    handles and page cache). A caller finding all of them in use waits up to ``wait_s`` for one.
    A thread already holding a connection gets the same one back, so nested use never waits on
    itself. ``close`` closes the idle connections now and those in use when they come back.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], size: int, wait_s: float) -> None:
        if size < 1:
            raise ValueError("the pool needs at least one connection")
        self._connect = connect
        self._size = size
        self._wait_s = wait_s
        self._idle: list[sqlite3.Connection] = []
        self._open = 0
        self._generation = 0  # bumped by close(): connections of an older one are not kept
        self._available = threading.Condition()
        self._held = threading.local()

    @property
    def open_count(self) -> int:
        with self._available:
            return self._open

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        held: sqlite3.Connection | None = getattr(self._held, "conn", None)
        if held is not None:
            yield held
            return
        conn, generation = self._check_out()
        self._held.conn = conn
        try:
            yield conn
        finally:
            self._held.conn = None
            self._check_in(conn, generation)

    def _check_out(self) -> tuple[sqlite3.Connection, int]:
        with self._available:
            if not self._available.wait_for(
                lambda: self._idle or self._open < self._size, timeout=self._wait_s
            ):
                raise StoreUnavailable("no sqlite connection became free in time")
            if self._idle:
                return self._idle.pop(), self._generation
            self._open += 1
            generation = self._generation
        try:
            return self._connect(), generation
        except BaseException:
            with self._available:
                self._open -= 1
                self._available.notify()
            raise

    def _check_in(self, conn: sqlite3.Connection, generation: int) -> None:
        keep = True
        if conn.in_transaction:  # a failure left it mid-transaction: never hand that on
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                keep = False
        with self._available:
            if keep and generation == self._generation:
                self._idle.append(conn)
                self._available.notify()
                return
            self._open -= 1
            self._available.notify()
        conn.close()

    def close(self) -> None:
        with self._available:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._generation += 1
            self._available.notify_all()
        for conn in idle:
            conn.close()

"""The store's pooled connections keep page caches of a bounded size (``PAGE_CACHE_KIB``).

Each SQLite connection caches the pages it reads, by default up to 2 MiB. The store pools eight
connections, so a server that had read enough of a growing database held up to 16 MiB of page
caches, filled a little more with every call for hours; and in WAL mode each cache is dropped
whenever another connection commits, so the refills churned malloc's heap. Issue 13's soak saw
RSS grow with the calls. Counted here with SQLite's own tally of the bytes it holds, not RSS.
"""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Callable
from pathlib import Path

from engram_memory.adapters.local.sqlite.connections import DEFAULT_POOL_SIZE, PAGE_CACHE_KIB
from engram_memory.adapters.local.sqlite.store import SqliteStore

from engram_testing import tool_missing

BALLAST_ROWS = 40_000  # ~9 MiB of table pages: more than any connection may cache
SLACK_BYTES = 1024 * 1024  # the statements and schema the scans prepare, beyond the caches


def _sqlite_memory_used() -> Callable[[], int] | None:
    """``sqlite3_memory_used`` of the very library the ``sqlite3`` module runs on."""
    import _sqlite3

    try:
        used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (OSError, AttributeError):
        return None
    used.restype = ctypes.c_int64
    return lambda: int(used())


def test_every_pooled_connection_caches_at_most_its_share_of_pages(tmp_path: Path) -> None:
    memory_used = _sqlite_memory_used()
    if memory_used is None:
        tool_missing("the sqlite3 module's library does not export sqlite3_memory_used")
    store = SqliteStore(tmp_path / "engram.db")
    try:
        with store._pool.connection() as conn:
            conn.execute("CREATE TABLE ballast (n INTEGER PRIMARY KEY, text TEXT NOT NULL)")
            conn.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
                " INSERT INTO ballast (text) SELECT printf('%0200d', i) FROM n",
                (BALLAST_ROWS,),
            )
        if memory_used() == 0:
            tool_missing("an SQLite that keeps memory statistics (not SQLITE_DEFAULT_MEMSTATUS=0)")
        gc.collect()
        before = memory_used()

        all_out = threading.Barrier(DEFAULT_POOL_SIZE)
        totals: list[int] = []
        failures: list[BaseException] = []

        def scan() -> None:
            try:
                with store._pool.connection() as conn:
                    all_out.wait(timeout=60)  # every pooled connection checked out at once
                    totals.append(
                        conn.execute("SELECT sum(length(text)) FROM ballast").fetchone()[0]
                    )
            except BaseException as error:  # re-raised in the test's thread
                failures.append(error)

        scanners = [threading.Thread(target=scan) for _ in range(DEFAULT_POOL_SIZE)]
        for scanner in scanners:
            scanner.start()
        for scanner in scanners:
            scanner.join()
        assert not failures, failures[0]
        assert totals == [BALLAST_ROWS * 200] * DEFAULT_POOL_SIZE
        assert store.open_connections() == DEFAULT_POOL_SIZE  # eight connections, eight caches

        grown = memory_used() - before
        bound = DEFAULT_POOL_SIZE * PAGE_CACHE_KIB * 1024
        assert grown <= bound + SLACK_BYTES, f"{grown} bytes held after the scans"
        assert grown >= bound // 2  # the scans did fill the caches: the bound was reached
    finally:
        store.close()

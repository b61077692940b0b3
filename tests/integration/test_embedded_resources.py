"""The embedded store under waves of short-lived threads: open file handles stay bounded."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from engram_memory.adapters.local.sqlite.connections import DEFAULT_POOL_SIZE
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.engine.context import Scope

from engram_testing import Harness, embedded_harness

ROUNDS = 5
THREADS_PER_ROUND = 24


def open_handles(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path`` (from /proc/self/fd)."""
    target = str(path.resolve())
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                count += 1
        except OSError:  # closed between listdir and readlink
            continue
    return count


def busy_round(harness: Harness, round_number: int) -> None:
    """``THREADS_PER_ROUND`` fresh threads, each capturing, searching and reading, then exiting."""
    failures: list[BaseException] = []

    def work(i: int) -> None:
        try:
            harness.capture(
                f"round {round_number} worker {i} notes the handle count",
                key=f"leak-round-{round_number}-worker-{i:04d}",
            )
            harness.search("handle count")
        except BaseException as error:  # re-raised in the test's thread
            failures.append(error)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(THREADS_PER_ROUND)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures[0]


def test_rounds_of_short_lived_threads_keep_database_handles_bounded(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    try:
        database, keys = tmp_path / "engram.db", tmp_path / "keys.db"
        counts: list[tuple[int, int]] = []
        for round_number in range(ROUNDS):
            busy_round(harness, round_number)
            counts.append((open_handles(database), open_handles(keys)))
        database_handles = [db for db, _ in counts]
        # One handle on engram.db per pooled connection, whatever the number of threads that
        # came and went (a connection per thread kept THREADS_PER_ROUND more after every round).
        assert max(database_handles) <= DEFAULT_POOL_SIZE, counts
        # The vault keeps one connection for the key file, shared by every thread.
        assert {vault for _, vault in counts} == {1}, counts
    finally:
        harness.close()
    assert open_handles(tmp_path / "engram.db") == 0


def test_more_threads_than_pooled_connections_wait_and_close_leaves_none_open(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path / "engram.db", pool_size=2)
    scope = Scope("tenant", "workspace")
    start = threading.Barrier(16)
    most_open: list[int] = []

    def read_heads() -> None:
        start.wait()
        for _ in range(20):
            store.head(scope)
            most_open.append(store.open_connections())

    workers = [threading.Thread(target=read_heads) for _ in range(16)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(most_open) == 16 * 20
    assert max(most_open) <= 2
    store.close()
    assert store.open_connections() == 0
    assert open_handles(tmp_path / "engram.db") == 0
    assert store.head(scope).cursor == 0  # a closed store opens a connection again when used
    store.close()

"""A finished outbox item is removed without a sync of its own; every other commit stays synced.

The store's commits are ``synchronous = FULL`` (the WAL is synced at each commit). Removing a
finished outbox item runs at ``NORMAL``: the next synced commit makes it durable, and a power cut
before that only leaves an idempotent item to be done again. The connection must be back at
``FULL`` afterwards, or every later commit on it would lose its sync.
"""

from __future__ import annotations

from pathlib import Path

from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.embedded.composition import open_embedded
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import OutboxItem

from engram_testing import capture_args, context, embedded_harness

FULL = 2  # PRAGMA synchronous


def _synchronous(store: SqliteStore) -> int:
    with store._pool.connection() as conn:
        (level,) = conn.execute("PRAGMA synchronous").fetchone()
    return int(level)


def test_finished_items_leave_the_outbox_and_the_connection_commits_synced_again(
    tmp_path: Path,
) -> None:
    harness = embedded_harness(tmp_path)
    try:
        record_id = harness.remember("the outbox keeps its promises")
        assert harness.store.outbox_pending(100) == []  # key destruction and projection done
        assert _synchronous(harness.store) == FULL
        assert harness.search("outbox promises")["records"][0]["record"]["record_id"] == record_id
    finally:
        harness.close()


def test_removing_an_unknown_item_leaves_the_connection_synced(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "engram.db", pool_size=1)
    try:
        unknown = OutboxItem("destroy_key:key_x", "destroy_key", Scope("t", "w"), "key_x")
        store.outbox_done(unknown)  # a no-op delete: nothing to redo
        assert _synchronous(store) == FULL
        assert store.outbox_pending_in(Scope("t", "w"), None, 10) == []
    finally:
        store.close()


def test_items_settled_together_are_found_by_id_and_leave_in_one_transaction_unsynced(
    tmp_path: Path,
) -> None:
    """The audit lines one sync of the log made durable are dropped by one write, not one a line."""
    host = open_embedded(tmp_path / "data")
    store = host.store
    try:
        for n in range(3):
            fact = capture_args(f"Fact {n} whose line waits in the outbox.", key=f"batch-{n:011d}")
            host.call("capture", fact, context())
        lines = [item for item in store.outbox_pending(100) if item.kind == "audit_line"]
        assert len(lines) == 3
        held: list[str] = []
        with store._pool.connection() as conn:
            conn.set_trace_callback(held.append)
            try:
                assert all(store.outbox_holds(item) for item in lines)
            finally:
                conn.set_trace_callback(None)
        # found by their id (the primary key), not by matching each line's text
        assert held == [f"SELECT 1 FROM outbox WHERE item_id = '{item.item_id}'" for item in lines]
        statements: list[str] = []
        with store._pool.connection() as conn:
            conn.set_trace_callback(statements.append)
            try:
                store.outbox_done_all(lines)
            finally:
                conn.set_trace_callback(None)
        assert [s.split(" ")[0] for s in statements] == [
            "PRAGMA", "BEGIN", "DELETE", "DELETE", "DELETE", "COMMIT", "PRAGMA"
        ]  # fmt: skip
        assert statements[0] == "PRAGMA synchronous = NORMAL"
        assert _synchronous(store) == FULL
        assert [item for item in store.outbox_pending(100) if item.kind == "audit_line"] == []
        assert not any(store.outbox_holds(item) for item in lines)
        store.outbox_done_all(lines)  # idempotent
        store.outbox_done_all([])
    finally:
        host.close()

"""The store's prepared statements stay few however many ids a read asks for.

Each pooled SQLite connection caches up to 128 prepared statements, one per distinct SQL text.
Reading records by a list of ids once built a text per list length (``IN (?, ?, ...)``), so
searches over a growing store filled every connection's cache with large one-off statements and
the server's memory grew for as long as it ran (issue 13's soak).
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from engram_memory.adapters.local.sqlite import lexical_topk
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import ProjectionChange, ProjectionDoc

from engram_testing import TENANT, WORKSPACE, embedded_harness


def live_statements() -> int:
    """Prepared statements alive in this process (the connections' caches hold them)."""
    gc.collect()
    return sum(
        1
        for thing in gc.get_objects()
        if (type(thing).__module__, type(thing).__name__) == ("sqlite3", "Statement")
    )


def test_reading_ever_longer_id_lists_prepares_no_statement_per_length(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "engram.db", pool_size=1)
    scope = Scope("tenant-a", "ws-a")
    try:
        store.records_get(scope, ["rec_warm"])
        before = live_statements()
        for length in range(1, 121):
            assert store.records_get(scope, [f"rec_{i:04d}" for i in range(length)]) == {}
        assert live_statements() - before <= 1
    finally:
        store.close()


def test_records_are_found_by_any_number_of_ids_in_their_own_scope_only(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    harness.without_quality_gate()  # numbered notes that differ by a digit
    try:
        stored = [harness.remember(f"note {n} about the statement cache") for n in range(3)]
        home = Scope(TENANT, WORKSPACE)
        unknown = [f"rec_missing_{n:04d}" for n in range(600)]  # more than one old 500-id chunk
        found = harness.store.records_get(home, [*unknown, stored[2], stored[0], stored[0]])
        assert set(found) == {stored[0], stored[2]}
        assert all(found[record_id].record_id == record_id for record_id in found)
        assert harness.store.records_get(Scope(TENANT, "another-workspace"), stored) == {}
        assert harness.store.records_get(home, []) == {}
    finally:
        harness.close()


def test_searches_of_every_depth_and_result_size_keep_the_statements_few(tmp_path: Path) -> None:
    """Through the engine: whatever a search's limit and however many records match, the same
    few statements serve it (a statement per result size would grow with the store)."""
    harness = embedded_harness(tmp_path)
    harness.without_quality_gate()  # many records of the same few words
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    try:
        for n in range(30):
            harness.remember(" ".join(words[: 1 + n % len(words)]) + f" note {n}")
        for word in words[:2]:
            harness.search(word, limit=3)
            harness.get("rec_unknown")
        before = live_statements()
        for limit in range(1, 26):
            for word in words:
                harness.search(word, limit=limit)
        assert live_statements() - before <= 2
    finally:
        harness.close()


def test_pruned_searches_of_any_terms_keep_the_statements_few(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pruned lexical query (``lexical_topk``) passes its terms, their sets and the depth as
    parameters: however many terms and rounds, the same few statements serve it."""
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_ROWS", 0)
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_MATCHES", 0)
    store = SqliteStore(tmp_path / "engram.db", pool_size=1)
    scope = Scope("tenant-a", "ws-a")
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    try:
        for n in range(120):
            text = " ".join(words[: 1 + n % len(words)] + ["common"] * (n % 3))
            doc = ProjectionDoc(f"rec_{n:04d}", {"primary": text}, None)
            store.lexical_apply(scope, ProjectionChange(upsert=doc))
        store.lexical_search(scope, ["common", "hotel"], 5)
        before = live_statements()
        for size in range(1, len(words) + 1):
            for depth in (1, 5, 20, 60):
                store.lexical_search(scope, ["common", *words[-size:]], depth)
        assert live_statements() - before <= 2
    finally:
        store.close()

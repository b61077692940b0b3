"""The embedded host re-indexes what an analyzer change or a newly enabled embedder made stale."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from engram_memory.bootstrap import open_embedded
from engram_memory.engine import lexical

from engram_testing import PURPOSE, HashingEmbedder, capture_args, context


def remember(engine: Any, text: str, key: str) -> str:
    captured = engine.handle("capture", capture_args(text, key=key), context())
    admitted = engine.handle(
        "request_admission",
        {
            "candidate_id": captured["output"]["value"]["candidate_id"],
            "idempotency_key": key + "-a",
        },
        context(),
    )
    record_id: str = admitted["output"]["value"]["outcome"]["record_id"]
    return record_id


def found(engine: Any, query: str) -> list[str]:
    value = engine.handle("search", {"query": query, "purpose_ref": PURPOSE}, context())
    return [p["record"]["record_id"] for p in value["output"]["value"]["records"]]


def test_records_indexed_by_an_older_analyzer_are_reindexed_on_open(tmp_path: Path) -> None:
    host = open_embedded(tmp_path)
    record_id = remember(
        host.engine, "She is painting sunsets over the harbour.", "reindex-key-0001"
    )
    assert found(host.engine, "paintings") == [record_id]  # stemmed on both sides
    host.close()
    # What a database indexed by analyzer 1 (no stemming) looks like.
    with sqlite3.connect(tmp_path / "engram.db") as db:
        (table,) = db.execute("SELECT table_name FROM lexical_tables").fetchone()
        db.execute(f"UPDATE {table} SET f_primary = 'she is painting sunsets over the harbour'")
        db.execute("UPDATE store_meta SET value = 'analyzer-1' WHERE key = 'lexical_version'")
    host = open_embedded(tmp_path)
    try:
        assert found(host.engine, "paintings") == [record_id]
        with sqlite3.connect(tmp_path / "engram.db") as db:
            (version,) = db.execute("SELECT value FROM store_meta").fetchone()
        assert version == lexical.PROFILE_CONFIG_DIGEST
    finally:
        host.close()


def test_enabling_the_semantic_channel_backfills_vectors_and_disabling_it_keeps_them(
    tmp_path: Path,
) -> None:
    host = open_embedded(tmp_path)
    record_id = remember(host.engine, "The cat sleeps on the mat.", "reindex-key-0002")
    host.close()
    host = open_embedded(tmp_path, embedder=HashingEmbedder())
    try:
        assert host.engine.vectors is not None
        assert host.engine.vectors.has_vector(context().scope, record_id)
    finally:
        host.close()
    host = open_embedded(tmp_path)  # lexical only again: the vectors stay for next time
    try:
        assert host.store.vector_contains(context().scope, record_id)
        assert found(host.engine, "cat") == [record_id]
    finally:
        host.close()

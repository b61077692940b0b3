"""The embedded host re-indexes what an analyzer change or a newly enabled embedder made stale,
and an operator rebuilds a workspace's index with ``engram-memory admin reindex``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import open_embedded
from engram_memory.embedded.host_file import load_host_config
from engram_memory.embedded.in_process import call_in_process
from engram_memory.engine import lexical
from engram_memory.engine.context import TrustedContext
from engram_memory.engine.ports import ProjectionChange
from engram_memory.engine.service import Engine

from engram_testing import HashingEmbedder, ScriptedConfirmations, context, found_in, remember_in


def found(engine: Engine, query: str, ctx: TrustedContext | None = None) -> list[str]:
    return [p["record"]["record_id"] for p in found_in(engine, query, ctx)["records"]]


def test_records_indexed_by_an_older_analyzer_are_reindexed_on_open(tmp_path: Path) -> None:
    host = open_embedded(tmp_path)
    record_id = remember_in(
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
            (version,) = db.execute(
                "SELECT value FROM store_meta WHERE key = 'lexical_version'"
            ).fetchone()
        assert version == lexical.PROFILE_CONFIG_DIGEST
    finally:
        host.close()


def test_enabling_the_semantic_channel_backfills_vectors_and_disabling_it_keeps_them(
    tmp_path: Path,
) -> None:
    host = open_embedded(tmp_path)
    record_id = remember_in(host.engine, "The cat sleeps on the mat.", "reindex-key-0002")
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


def test_admin_reindex_rebuilds_a_workspace_index_from_the_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    config = load_host_config(data)
    ctx = context(tenant=config.tenant_id, workspace="ws-cli")
    host = open_embedded(data, config=config)
    try:
        kept = remember_in(
            host.engine, "The billing cron runs at midnight UTC.", "cli-reindex-key-0001", ctx
        )
        gone = remember_in(
            host.engine, "The billing password is in the vault.", "cli-reindex-key-0002", ctx
        )
        forget = {"record_id": gone, "idempotency_key": "cli-reindex-key-0003", "reason_ref": "r:x"}
        approve = ScriptedConfirmations(host.engine.clock)  # type: ignore[arg-type]
        assert call_in_process(host.engine, "forget", forget, ctx, approve.obtain)["ok"]
        for record_id in (kept, gone):  # the index is lost
            host.engine.lexical.apply(ctx.scope, ProjectionChange(delete_record_id=record_id))
        assert found(host.engine, "billing", ctx) == []
    finally:
        host.close()
    capsys.readouterr()

    assert (
        main(["admin", "reindex", "--data-dir", str(data), "--workspace", "ws-cli", "--json"]) == 0
    )

    report = json.loads(capsys.readouterr().out)
    assert report == {"workspace": "ws-cli", "indexed": 1, "dropped": 1, "pending_upserts": 0}
    host = open_embedded(data, config=config)
    try:
        assert found(host.engine, "billing", ctx) == [kept]
    finally:
        host.close()

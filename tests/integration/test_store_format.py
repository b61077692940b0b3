"""A data directory written by the code before store format 2 (tests/data/store-format-1, made by
main at 024997b with its make.py) opens, is migrated in place in one transaction, verifies, and
answers search and get exactly as that code did; a migration that fails half-way leaves it as it
was."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engram_memory.adapters.local.sqlite import schema
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.contract.packing import is_packed
from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import open_embedded
from engram_memory.engine.context import TrustedContext
from engram_memory.engine.journal import verify_journal
from engram_memory.engine.ports import StoreUnavailable

from engram_testing import (
    PURPOSE,
    ScriptedPolicy,
    context,
    embedded_harness,
    handled,
    scanned_bytes,
)

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "store-format-1"
EXPECTED: dict[str, Any] = json.loads((FIXTURE / "expected.json").read_text())


@pytest.fixture
def data(tmp_path: Path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(FIXTURE / "data", copy)
    return copy


def _ctx() -> TrustedContext:
    return context(tenant="local", workspace="default", principal="agent-format")


def _layout(database: Path) -> tuple[str | None, bool, list[bytes]]:
    """The recorded store format, whether records is WITHOUT ROWID, and the stored journal
    bodies and ledger outputs."""
    conn = sqlite3.connect(database)
    try:
        row = conn.execute("SELECT value FROM store_meta WHERE key = 'store_format'").fetchone()
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'records'").fetchone()
        stored = [r[0] for r in conn.execute("SELECT body FROM journal_events")]
        stored += [r[0] for r in conn.execute("SELECT output FROM ledger")]
    finally:
        conn.close()
    return (None if row is None else row[0]), "WITHOUT ROWID" in sql, stored


def _answers(data: Path) -> dict[str, Any]:
    host = open_embedded(data)
    try:
        engine, scope = host.engine, host.store.scopes()[0]
        verify_journal(host.store, scope)
        searches = {
            query: [
                packet["record"]["record_id"]
                for packet in handled(
                    engine, "search", {"query": query, "purpose_ref": PURPOSE}, _ctx()
                )["output"]["value"]["records"]
            ]
            for query in EXPECTED["searches"]
        }
        gets = {
            record_id: handled(
                engine, "get", {"record_id": record_id, "purpose_ref": PURPOSE}, _ctx()
            )["output"]["value"]["record"]
            for record_id in EXPECTED["record_ids"]
        }
        forgotten = handled(
            engine, "get", {"record_id": EXPECTED["forgotten"], "purpose_ref": PURPOSE}, _ctx()
        )
    finally:
        host.close()
    return {"searches": searches, "gets": gets, "forgotten": forgotten["error"]["code"]}


def test_a_format_1_directory_is_migrated_and_answers_as_before(data: Path) -> None:
    before_format, before_without_rowid, before_stored = _layout(data / "engram.db")
    assert (before_format, before_without_rowid) == (None, True)
    assert not any(is_packed(value) for value in before_stored)

    answers = _answers(data)

    assert answers == {
        "searches": EXPECTED["searches"],
        "gets": EXPECTED["gets"],
        "forgotten": "NOT_FOUND",
    }
    after_format, after_without_rowid, after_stored = _layout(data / "engram.db")
    assert (after_format, after_without_rowid) == (str(schema.STORE_FORMAT), False)
    assert len(after_stored) == len(before_stored) and all(map(is_packed, after_stored))
    assert main(["verify", "--data-dir", str(data)]) == 0
    with sqlite3.connect(data / "engram.db") as conn:  # digests kept as their 32 bytes
        kinds = conn.execute(
            "SELECT typeof(record_digest), typeof(payload_digest), length(record_digest) "
            "FROM records UNION SELECT typeof(event_hash), typeof(event_hash), length(event_hash) "
            "FROM journal_events"
        ).fetchall()
    assert set(kinds) == {("blob", "blob", 32)}
    # The forgotten record's text is in no file, packed or not.
    needle = b"periwinkle-quokka"
    assert [p.name for p in data.rglob("*") if p.is_file() and needle in scanned_bytes(p)] == []
    # A second opening finds nothing to do, and answers the same.
    assert _answers(data) == answers


def test_the_migrated_directory_backs_up_and_restores(data: Path, tmp_path: Path) -> None:
    _answers(data)
    backup = tmp_path / "engram.backup"
    assert main(["admin", "backup", str(backup), "--data-dir", str(data)]) == 0
    restored = tmp_path / "restored"
    shutil.copytree(data / "keys", restored / "keys")
    assert main(["admin", "restore", str(backup), "--data-dir", str(restored)]) == 0
    assert _answers(restored)["searches"] == EXPECTED["searches"]


def test_a_migration_that_fails_half_way_leaves_the_directory_as_it_was(
    data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packed: list[bytes] = []

    def failing_pack(document: bytes) -> bytes:
        if len(packed) == 3:  # the records already moved, three journal bodies packed
            raise sqlite3.OperationalError("disk I/O error")
        packed.append(document)
        return document

    monkeypatch.setattr(schema, "pack", failing_pack)
    with pytest.raises(StoreUnavailable):
        SqliteStore(data / "engram.db")
    assert _layout(data / "engram.db")[:2] == (None, True)
    assert not any(is_packed(value) for value in _layout(data / "engram.db")[2])
    monkeypatch.undo()
    assert _answers(data)["searches"] == EXPECTED["searches"]


def test_a_store_from_before_holds_gains_the_column_in_place_and_holds(tmp_path: Path) -> None:
    """A format-2 engram.db written before admission holds (no ``candidates.held``): opening it
    adds the column, no row rewritten; its pending candidate reads as never held, and holds."""
    first = embedded_harness(tmp_path)
    captured = first.capture("Before holds: the release train leaves on Tuesdays.")
    first.close()
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        conn.execute("ALTER TABLE candidates DROP COLUMN held")
    again = embedded_harness(tmp_path)
    try:
        scope = context().scope
        row = again.store.candidate_get(scope, captured["candidate_id"])
        assert row is not None and (row.state, row.held) == ("pending", None)
        again.engine.policy = ScriptedPolicy("adjudication_required")
        held = again.admit(captured["candidate_id"], key="admit-before-holds-1")["outcome"]
        assert held["status"] == "pending_adjudication"
        row = again.store.candidate_get(scope, captured["candidate_id"])
        assert row is not None and row.held == held["decision_receipt_digest"]
        after = again.capture("After holds: a new candidate row.", key="capture-after-holds-1")
        assert after["status"] == "committed_pending"
    finally:
        again.close()

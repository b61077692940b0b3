"""The per-scope journal: dense cursors, hash chain, and its integrity check."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from engram_memory.contract.canonical import GENESIS_HASH, digest
from engram_memory.contract.errors import EngramError
from engram_memory.contract.packing import pack, unpack
from engram_memory.engine.journal import EMPTY_HEAD, build_event, verify_journal
from engram_memory.engine.records import decode

from engram_testing import context, embedded_harness


def test_events_chain_from_the_genesis_hash_with_dense_cursors() -> None:
    first, first_id = build_event(EMPTY_HEAD, operation="capture", target="c1", at_ms=0, digests={})
    body = decode(first.body)
    assert first.cursor == 1 and body["cursor"] == "1"
    assert body["previous_event_hash"] == GENESIS_HASH
    assert first.event_hash == digest("journal-event", body)
    assert first_id.startswith("evt_")
    from engram_memory.engine.ports import JournalHead

    second, _ = build_event(
        JournalHead(1, first.event_hash), operation="admit", target="c1", at_ms=1, digests={}
    )
    assert second.cursor == 2 and decode(second.body)["previous_event_hash"] == first.event_hash


def test_verify_journal_accepts_a_real_history(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember()
    harness.forget(record_id)
    head = verify_journal(harness.store, context().scope)
    assert head.cursor == 3
    harness.close()


def test_verify_journal_reports_a_gap_and_a_broken_chain(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    harness.remember()
    harness.capture(key="another-capture-01")
    db = tmp_path / "engram.db"
    with sqlite3.connect(db) as conn:
        # The store keeps bodies packed: the tampering is of the document they unpack to.
        (body,) = conn.execute("SELECT body FROM journal_events WHERE cursor = 1").fetchone()
        tampered = pack(unpack(body).replace(b"capture", b"kapture"))
        conn.execute("UPDATE journal_events SET body = ? WHERE cursor = 1", (tampered,))
    with pytest.raises(EngramError) as corrupt:
        verify_journal(harness.store, context().scope)
    assert corrupt.value.code.value == "JOURNAL_CORRUPT"
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM journal_events WHERE cursor = 2")
    with pytest.raises(EngramError) as gap:
        verify_journal(harness.store, context().scope)
    assert gap.value.code.value in {"CURSOR_GAP", "JOURNAL_CORRUPT"}
    harness.close()


def test_a_tampered_record_body_is_journal_corrupt_on_get(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The backup window is 02:00 UTC.")
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        (body,) = conn.execute("SELECT body FROM records").fetchone()
        tampered = body[:-20] + bytes([body[-20] ^ 1]) + body[-19:]  # one bit of the sealed body
        conn.execute("UPDATE records SET body = ?", (tampered,))
    assert harness.get(record_id)["error"]["code"] == "JOURNAL_CORRUPT"
    harness.close()


def test_a_current_record_whose_body_is_lost_is_blob_missing_not_not_found(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    record_id = harness.remember("The on-call rota lives in the ops calendar.")
    with sqlite3.connect(tmp_path / "engram.db") as conn:
        conn.execute("UPDATE records SET body = NULL")
    assert harness.get(record_id)["error"]["code"] == "BLOB_MISSING"
    args = {"query": "on-call rota", "purpose_ref": "purpose:general"}
    assert harness.error("search", args) == "BLOB_MISSING"
    harness.close()

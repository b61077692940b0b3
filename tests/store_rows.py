"""Rows of a store's change sets built by hand, for the store-level tests of both stores
(``tests/integration/test_dynamo_store.py``, ``tests/integration/test_store_commit.py``)."""

from __future__ import annotations

from engram_memory.engine.ports import CandidateRow, LedgerEntry, RecordRow


def ledger(key: str, cursor: int, output: bytes = b'{"ok":true}') -> LedgerEntry:
    return LedgerEntry("agent-alice", key, "capture", None, "sha256:" + "1" * 64, output, cursor)


def candidate(candidate_id: str, *, sealed: bytes = b"ciphertext", cursor: int = 1) -> CandidateRow:
    return CandidateRow(
        candidate_id=candidate_id,
        principal="agent-alice",
        state="pending",
        payload_digest="sha256:" + "2" * 64,
        record_digest="sha256:" + "3" * 64,
        record_id="mem_" + candidate_id.removeprefix("cand_"),
        capture_cursor=cursor,
        key_ref="key_" + "0" * 32,
        sealed=sealed,
        policy_version="v1",
        created_at_ms=1_780_000_000_000,
    )


def record(record_id: str, *, body: bytes | None = b'{"record":1}', cursor: int = 1) -> RecordRow:
    return RecordRow(
        record_id=record_id,
        state="accepted_current",
        record_digest="sha256:" + "3" * 64,
        payload_digest="sha256:" + "2" * 64,
        candidate_id="cand_" + record_id.removeprefix("mem_"),
        valid_from_ms=1,
        valid_to_ms=None,
        expires_at_ms=2_000_000_000_000,
        accepted_cursor=cursor,
        body=body,
    )

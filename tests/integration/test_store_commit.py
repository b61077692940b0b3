"""The SQLite store's commit: its fences hold, and it asks SQLite nothing it already knows.

The journal head is fenced and moved by one conditional UPDATE (a read and a write before), a
policy's decision checks the hold in the candidate's own move (a read before), and the projection
of a record inserted by the same commit drops nothing first (two reads before). Each test below
reads the statements of one commit from SQLite's trace of the store's connection.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_rows import candidate, ledger, record

from engram_memory.adapters.local.sqlite.fulltext import lexical_table_name
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.contract.canonical import GENESIS_HASH
from engram_memory.engine.context import Scope
from engram_memory.engine.journal import build_event
from engram_memory.engine.ports import (
    CandidateHold,
    ChangeSet,
    CommitConflict,
    JournalHead,
    ProjectionChange,
    ProjectionDoc,
    StateTransition,
)

SCOPE = Scope("tenant-acme-0001", "ws-research-0001")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    opened = SqliteStore(tmp_path / "engram.db", pool_size=1)
    try:
        yield opened
    finally:
        opened.close()


def traced(store: SqliteStore, changes: ChangeSet) -> list[str]:
    """The statements ``changes``' commit ran, whitespace folded."""
    statements: list[str] = []
    with store._pool.connection() as conn:
        conn.set_trace_callback(lambda sql: statements.append(" ".join(sql.split())))
        try:
            store.commit(changes)
        finally:
            conn.set_trace_callback(None)
    return statements


def change(store: SqliteStore, key: str, **fields: Any) -> ChangeSet:
    head = store.head(SCOPE)
    event, _ = build_event(head, operation="test", target=key, at_ms=1, digests={"key": key})
    return ChangeSet(SCOPE, head, ledger(key, event.cursor), event=event, **fields)


def conflict(store: SqliteStore, changes: ChangeSet) -> str:
    before = (store.head(SCOPE), store.events(SCOPE, 0, 100))
    with pytest.raises(CommitConflict) as raised:
        store.commit(changes)
    assert (store.head(SCOPE), store.events(SCOPE, 0, 100)) == before  # nothing written
    assert store.ledger_get(SCOPE, "agent-alice", changes.ledger.idempotency_key) is None
    return raised.value.reason


def _touching(statements: list[str], table: str) -> list[str]:
    return [s for s in statements if re.search(rf"\b{table}\b", s)]


def test_the_head_is_fenced_and_moved_by_one_statement(store: SqliteStore) -> None:
    first = change(store, "capture-key-000001")
    assert first.expected_head == JournalHead(0, GENESIS_HASH)
    store.commit(first)  # the scope's first event: no head row to update yet
    assert store.head(SCOPE) == JournalHead(1, first.event.event_hash)  # type: ignore[union-attr]
    second = change(store, "capture-key-000002")
    heads = _touching(traced(store, second), "journal_heads")
    assert len(heads) == 1 and heads[0].startswith("UPDATE journal_heads")
    assert store.head(SCOPE) == JournalHead(2, second.event.event_hash)  # type: ignore[union-attr]
    assert [event.cursor for event in store.events(SCOPE, 0, 10)] == [1, 2]


def test_a_moved_or_forged_head_is_a_head_conflict_and_writes_nothing(store: SqliteStore) -> None:
    stale = change(store, "capture-key-000001")  # against genesis
    store.commit(change(store, "capture-key-000002"))
    assert conflict(store, stale) == "head"
    head = store.head(SCOPE)
    forged = change(store, "capture-key-000003")
    forged = ChangeSet(
        SCOPE, JournalHead(head.cursor, "sha256:" + "9" * 64), forged.ledger, event=forged.event
    )
    assert conflict(store, forged) == "head"
    store.commit(change(store, "capture-key-000004"))  # the head as it is still commits
    head = store.head(SCOPE)
    assert head.cursor == 2
    # a change with no event is fenced by the head it names (read and compared), not moving it
    store.commit(ChangeSet(SCOPE, head, ledger("no-event-key-0001", head.cursor)))
    assert store.head(SCOPE) == head
    assert (
        conflict(store, ChangeSet(SCOPE, stale.expected_head, ledger("no-event-key-2", 0)))
        == "head"
    )


def test_a_policy_decision_checks_the_hold_in_the_candidate_s_move(store: SqliteStore) -> None:
    store.commit(change(store, "capture-key-000001", new_candidate=candidate("cand_a")))
    store.commit(change(store, "capture-key-000002", new_candidate=candidate("cand_b")))
    hold = CandidateHold("cand_a", "sha256:" + "4" * 64)
    store.commit(ChangeSet(SCOPE, None, ledger("hold-key-0000001", 0), hold=hold))
    admit = {"candidate_transition": StateTransition("cand_a", "pending", "admitted")}
    assert conflict(store, change(store, "admit-key-0000001", unless_held=True, **admit)) == "state"
    assert store.candidate_get(SCOPE, "cand_a").state == "pending"  # type: ignore[union-attr]
    reject = {"candidate_transition": StateTransition("cand_b", "pending", "rejected")}
    statements = traced(store, change(store, "reject-key-000001", unless_held=True, **reject))
    assert [s.split(" ")[0] for s in _touching(statements, "candidates")] == ["UPDATE"]
    assert store.candidate_get(SCOPE, "cand_b").state == "rejected"  # type: ignore[union-attr]
    # an operator's decision moves a held candidate, and clears its hold
    store.commit(change(store, "adjudicate-key-01", **admit))
    row = store.candidate_get(SCOPE, "cand_a")
    assert row is not None and (row.state, row.held) == ("admitted", None)


def test_a_record_inserted_and_projected_by_one_commit_reads_nothing_of_itself(
    store: SqliteStore,
) -> None:
    store.commit(change(store, "capture-key-000001", new_candidate=candidate("cand_a")))
    doc = ProjectionDoc("mem_a", {"primary": "billing retries charges"}, None, "billing retries")
    admit = change(
        store,
        "admit-key-0000001",
        candidate_transition=StateTransition("cand_a", "pending", "admitted"),
        new_record=record("mem_a", cursor=2),
        projection=ProjectionChange(upsert=doc),
    )
    statements = traced(store, admit)
    assert not [s for s in statements if s.startswith("SELECT") and "lex_rowid" in s]
    assert not [s for s in statements if "sqlite_master" in s]
    assert _fulltext_rows(store, "mem_a") == 1
    # projected again by a later commit: the row it had is dropped first
    store.commit(change(store, "reindex-key-00001", projection=ProjectionChange(upsert=doc)))
    assert _fulltext_rows(store, "mem_a") == 1


def _fulltext_rows(store: SqliteStore, record_id: str) -> int:
    table = lexical_table_name(SCOPE)
    with store._pool.connection() as conn:
        sql = f"SELECT count(*) FROM {table} WHERE record_id = ?"
        (count,) = conn.execute(sql, (record_id,)).fetchone()
    return int(count)

"""The store's atomic commit: one ``ChangeSet`` in one SQLite transaction.

The transaction covers the journal, the ledger, candidate control rows, records, the tombstone
index, used approvals, the outbox and the projections, so a mutation is either wholly there or
not at all.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from engram_memory.adapters.local.sqlite.connections import ConnectionPool, scrub_wal
from engram_memory.adapters.local.sqlite.projections import drops_projection, project
from engram_memory.adapters.local.sqlite.rows import digest_in, digest_out, scope_key, stored
from engram_memory.contract.canonical import GENESIS_HASH
from engram_memory.contract.packing import pack
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    CandidateRow,
    ChangeSet,
    CommitConflict,
    CommitOutcomeUnknown,
    JournalEvent,
    JournalHead,
    OutboxItem,
    RecordRow,
    StateTransition,
    StoreUnavailable,
)

FaultHook = Callable[[str], None]

CommitStep = Literal[
    "begin",
    "head",
    "ledger",
    "event",
    "candidate",
    "record",
    "tombstone",
    "projection",
    "approval",
    "outbox",
    "commit",
    "after_commit",
]


@dataclass(frozen=True, slots=True)
class _RowTable:
    """How a commit writes one kind of row: ``insert`` a new one (``taken``: the conflict when
    its key already is), ``move`` one from a state to the next, dropping its heavy column when
    the commit says so (the statements' second parameter)."""

    name: str
    insert: str
    taken: Literal["ledger", "state"]
    move: str


_CANDIDATES: Final = _RowTable(
    "candidates",
    "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "ledger",
    # A candidate leaving ``pending`` (admitted, rejected, withdrawn) is never opened again and
    # its key's destruction is queued in this same commit: its ciphertext is dead weight (2-3 KB
    # a record), dropped here and zeroed by secure_delete. Its hold, if a policy held it, ends.
    "UPDATE candidates SET state = ?, held = NULL, sealed = CASE WHEN ? THEN X'' ELSE sealed END "
    "WHERE tenant_id = ? AND workspace_id = ? AND candidate_id = ? AND state = ?",
)
# A policy's decision (``ChangeSet.unless_held``) moves the candidate only while it is not held:
# the hold is checked by the move's own condition, not by a read before it.
_CANDIDATES_UNLESS_HELD: Final = dataclasses.replace(
    _CANDIDATES, move=_CANDIDATES.move + " AND held IS NULL"
)
# An admission policy's hold (``ChangeSet.hold``): the candidate must still be pending.
_HOLD: Final = (
    "UPDATE candidates SET held = ? "
    "WHERE tenant_id = ? AND workspace_id = ? AND candidate_id = ? AND state = 'pending'"
)
_HELD: Final = (
    "SELECT 1 FROM candidates WHERE tenant_id = ? AND workspace_id = ? AND candidate_id = ? "
    "AND held IS NOT NULL"
)
_RECORDS: Final = _RowTable(
    "records",
    "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
    "state",
    # Forget shreds the body in the commit that tombstones the record.
    "UPDATE records SET state = ?, body = CASE WHEN ? THEN NULL ELSE body END "
    "WHERE tenant_id = ? AND workspace_id = ? AND record_id = ? AND state = ?",
)


def _insert_or_conflict(
    conn: sqlite3.Connection,
    sql: str,
    values: tuple[Any, ...],
    conflict: Literal["ledger", "state", "approval"],
) -> None:
    # A key already taken is another commit having won the race: the engine retries or answers.
    try:
        conn.execute(sql, values)
    except sqlite3.IntegrityError:
        raise CommitConflict(conflict) from None


def _update_one(conn: sqlite3.Connection, sql: str, values: tuple[Any, ...]) -> None:
    # A transition's ``from_state`` no longer holding means another commit moved the row first.
    if conn.execute(sql, values).rowcount != 1:
        raise CommitConflict("state")


def commit_changes(pool: ConnectionPool, changes: ChangeSet, fault: FaultHook) -> None:
    """Write ``changes`` in one transaction; ``fault`` is called with each ``CommitStep``."""
    committed = False
    try:
        with pool.connection() as conn:
            fault("begin")
            conn.execute("BEGIN IMMEDIATE")
            try:
                _apply(conn, changes, fault)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                fault("commit")
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                # A failed COMMIT (I/O error, timeout) may or may not have reached the disk.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise CommitOutcomeUnknown("commit outcome unknown") from exc
            committed = True
            fault("after_commit")
            if changes.shred_record_body or drops_projection(changes.projection):
                scrub_wal(conn)
    except (CommitConflict, CommitOutcomeUnknown):
        raise
    except sqlite3.Error as exc:
        if committed:
            raise CommitOutcomeUnknown("failure after commit") from exc
        raise StoreUnavailable("sqlite store error") from exc


def _apply(conn: sqlite3.Connection, changes: ChangeSet, fault: FaultHook) -> None:
    # The steps run in this order, each after its fault point, so a fault injected at any one
    # leaves the steps before it written and rolled back together.
    _check_head(conn, changes, fault)
    _insert_ledger(conn, changes, fault)
    if changes.event is not None:
        fault("event")
        _append_event(conn, changes.scope, changes.event)
    moved = changes.candidate_transition
    if changes.new_candidate is not None or moved is not None or changes.hold is not None:
        fault("candidate")
        table = _hold_conditions(conn, changes)
        leaves_pending = moved is not None and moved.to_state != "pending"
        _apply_row(conn, changes.scope, table, changes.new_candidate, moved, drop=leaves_pending)
    if changes.new_record is not None or changes.record_transition is not None:
        fault("record")
        _apply_row(
            conn,
            changes.scope,
            _RECORDS,
            changes.new_record,
            changes.record_transition,
            drop=changes.shred_record_body,
        )
    if changes.tombstone_payload_digest is not None and changes.record_transition is not None:
        fault("tombstone")
        _insert_tombstone(
            conn,
            changes,
            changes.tombstone_payload_digest,
            changes.record_transition.target_id,
        )
    if changes.projection is not None:
        fault("projection")
        new_record = changes.new_record.record_id if changes.new_record is not None else None
        project(conn, changes.scope, changes.projection, new_record=new_record)
    if changes.approval_id is not None:
        fault("approval")
        _spend_approval(conn, changes)
    if changes.outbox:
        fault("outbox")
        _enqueue(conn, changes.outbox)


def _check_head(conn: sqlite3.Connection, changes: ChangeSet, fault: FaultHook) -> None:
    """Fence the commit on the journal head and, with an event, move the head to it. The move
    is tried first as one conditional UPDATE (the head as expected: done, in one statement
    instead of a read and a write); when it changes no row the head is read and compared as
    the wire compares it: the scope's first event (no head row yet), or a head that moved."""
    fault("head")
    expected, event = changes.expected_head, changes.event
    if expected is None:
        return  # no event: nothing to fence (a policy's hold)
    t, w = scope_key(changes.scope)
    if event is not None and _moved_head(conn, (t, w), expected, event):
        return
    row = conn.execute(
        "SELECT cursor, event_hash FROM journal_heads WHERE tenant_id = ? AND workspace_id = ?",
        (t, w),
    ).fetchone()
    current = JournalHead(row[0], digest_out(row[1])) if row else JournalHead(0, GENESIS_HASH)
    if current != expected:
        raise CommitConflict("head")
    if event is not None:
        conn.execute(
            "INSERT INTO journal_heads VALUES (?, ?, ?, ?) ON CONFLICT (tenant_id, workspace_id) "
            "DO UPDATE SET cursor = excluded.cursor, event_hash = excluded.event_hash",
            (t, w, event.cursor, digest_in(event.event_hash)),
        )


def _moved_head(
    conn: sqlite3.Connection, key: tuple[str, str], expected: JournalHead, event: JournalEvent
) -> bool:
    return (
        conn.execute(
            "UPDATE journal_heads SET cursor = ?, event_hash = ? WHERE tenant_id = ? "
            "AND workspace_id = ? AND cursor = ? AND event_hash = ?",
            (
                event.cursor,
                digest_in(event.event_hash),
                *key,
                expected.cursor,
                digest_in(expected.event_hash),
            ),
        ).rowcount
        == 1
    )


def _insert_ledger(conn: sqlite3.Connection, changes: ChangeSet, fault: FaultHook) -> None:
    fault("ledger")
    entry = changes.ledger
    _insert_or_conflict(
        conn,
        "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            *scope_key(changes.scope),
            entry.principal,
            entry.idempotency_key,
            entry.tool,
            entry.target,
            digest_in(entry.intent_hash),
            pack(entry.output),
            entry.cursor,
        ),
        "ledger",
    )


def _append_event(conn: sqlite3.Connection, scope: Scope, event: JournalEvent) -> None:
    t, w = scope_key(scope)
    # The head moved to this event at the "head" step (``_check_head``).
    conn.execute(
        "INSERT INTO journal_events VALUES (?, ?, ?, ?, ?)",
        (t, w, event.cursor, digest_in(event.event_hash), pack(event.body)),
    )


def _apply_row(
    conn: sqlite3.Connection,
    scope: Scope,
    table: _RowTable,
    new: CandidateRow | RecordRow | None,
    move: StateTransition | None,
    *,
    drop: bool,
) -> None:
    t, w = scope_key(scope)
    if new is not None:
        _insert_or_conflict(conn, table.insert, (t, w, *stored(new, table.name)), table.taken)
    if move is not None:
        _update_one(conn, table.move, (move.to_state, drop, t, w, move.target_id, move.from_state))


def _hold_conditions(conn: sqlite3.Connection, changes: ChangeSet) -> _RowTable:
    """A policy's hold marks its pending candidate; a policy's decision (``unless_held``)
    is refused on a held one. Either way a candidate that moved is ``CommitConflict``.
    Returns how the candidate row is then written: without a hold in the same change set, a
    policy's decision checks the hold in its move (``_CANDIDATES_UNLESS_HELD``)."""
    t, w = scope_key(changes.scope)
    moved, hold = changes.candidate_transition, changes.hold
    if moved is None or not changes.unless_held:
        policy_decision = None
    elif hold is None:
        return _CANDIDATES_UNLESS_HELD
    else:  # the hold is read before this change set's own hold is written
        policy_decision = moved
    if (
        policy_decision is not None
        and conn.execute(_HELD, (t, w, policy_decision.target_id)).fetchone()
    ):
        raise CommitConflict("state")
    if hold is not None:
        _update_one(conn, _HOLD, (hold.decision_receipt_digest, t, w, hold.candidate_id))
    return _CANDIDATES


def _insert_tombstone(
    conn: sqlite3.Connection, changes: ChangeSet, payload_digest: str, record_id: str
) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO tombstones VALUES (?, ?, ?, ?, ?)",
        (
            *scope_key(changes.scope),
            digest_in(payload_digest),
            record_id,
            changes.event.cursor if changes.event else 0,
        ),
    )


def _spend_approval(conn: sqlite3.Connection, changes: ChangeSet) -> None:
    _insert_or_conflict(
        conn,
        "INSERT INTO used_approvals VALUES (?, ?, ?, ?)",
        (
            changes.approval_id,
            *scope_key(changes.scope),
            changes.event.cursor if changes.event else 0,
        ),
        "approval",
    )


def _enqueue(conn: sqlite3.Connection, items: Sequence[OutboxItem]) -> None:
    conn.executemany(
        "INSERT OR IGNORE INTO outbox VALUES (?, ?, ?, ?, ?, ?)",
        [(i.item_id, i.kind, *scope_key(i.scope), i.target, i.surface) for i in items],
    )

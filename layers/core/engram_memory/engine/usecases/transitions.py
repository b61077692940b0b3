"""The record lifecycle, in one place: its table of transitions (CONTRACT.md §4) and the one
commit every transition makes (journal step, ledger entry, receipt, state change, what the
projections and keys do). The agents' withdraw and forget, confirmation-gated (§7.5, §7.6),
and every operator transition (the operator plane's audited use cases) commit through it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import ForgetInput, WithdrawInput
from engram_memory.engine.kernel import RECORD_STATES_FORGETTABLE, Call, JournalStep, Kernel
from engram_memory.engine.ports import (
    CandidateRow,
    ChangeSet,
    JournalHead,
    OutboxItem,
    ProjectionChange,
    RecordRow,
    StateTransition,
)

# The record transitions an operator makes (§4): from which states, to which one. Forget
# (→ tombstoned, from any of the five) is ``commit_forget``; tombstoned is terminal and dominant.
LifecycleOperation = Literal["dispute", "resolve", "supersede", "expire", "trust_invalidate"]
LIFECYCLE: Final[Mapping[str, tuple[frozenset[str], str]]] = {
    "dispute": (frozenset({"accepted_current"}), "accepted_disputed"),
    "resolve": (frozenset({"accepted_disputed"}), "accepted_current"),
    "supersede": (frozenset({"accepted_current", "accepted_disputed"}), "historical"),
    "expire": (frozenset({"accepted_current", "accepted_disputed", "historical"}), "expired"),
    "trust_invalidate": (
        frozenset({"accepted_current", "accepted_disputed", "historical", "expired"}),
        "trust_invalid",
    ),
}
LIFECYCLE_STATES: Final = tuple(sorted(RECORD_STATES_FORGETTABLE))


@dataclass(frozen=True)
class Authorized:
    """What lets a terminal transition commit: the call's idempotency key and intent, the
    authorization receipt, and the approval it spends (none for an operator, who is the human).
    ``why``: the agent's reason and who approved, or the operator's reason, journaled with the
    transition and whoever committed it (``journal.WHY_FIELDS``)."""

    idempotency_key: str
    intent: str
    authorization: str
    approval_id: str | None = None
    why: Mapping[str, str] = field(default_factory=dict)


def _confirmed(
    k: Kernel, call: Call, args: WithdrawInput | ForgetInput, target: str, intent: str
) -> Authorized:
    """The agent's transition, once a human confirmed it (or the host needs no confirmation)."""
    approval = k.confirm(call, args, target, args.reason_ref)
    why = {"reason_ref": args.reason_ref}
    if approval is not None and approval.approved_by is not None:
        why["approved_by"] = approval.approved_by
    return Authorized(
        idempotency_key=args.idempotency_key,
        intent=intent,
        authorization=k.authorization_receipt(call, approval, {"reason_ref": args.reason_ref}),
        approval_id=approval.approval_id if approval else None,
        why=why,
    )


def withdraw(k: Kernel, call: Call, args: WithdrawInput) -> dict[str, Any]:
    candidate_id = args.candidate_id
    call.target = candidate_id
    intent, stored = k.prior(call, args, args.idempotency_key, candidate_id)
    if stored is not None:
        candidate = k.read(lambda: k.store.candidate_get(call.scope, candidate_id))
        return {**stored, "replayed": True, "key_destruction": k.key_destruction(candidate)}

    candidate = withdrawable(k.pending_candidate(call, candidate_id))
    return commit_withdraw(k, call, candidate, _confirmed(k, call, args, candidate_id, intent))


def withdrawable(candidate: CandidateRow | None) -> CandidateRow:
    """The candidate a withdraw (the agent's or an operator's) may end: ``NOT_FOUND`` without
    one, ``ALREADY_TERMINAL`` once withdrawn or rejected, ``ILLEGAL_TRANSITION`` once admitted."""
    if candidate is None:
        raise EngramError(ErrorCode.NOT_FOUND)
    if candidate.state in ("withdrawn", "rejected"):
        raise EngramError(ErrorCode.ALREADY_TERMINAL)
    if candidate.state != "pending":
        raise EngramError(ErrorCode.ILLEGAL_TRANSITION)
    return candidate


def commit_withdraw(
    k: Kernel, call: Call, candidate: CandidateRow, authorized: Authorized
) -> dict[str, Any]:
    """End a pending candidate as ``withdrawn`` and shred its key: the agent's withdraw, or an
    operator's (who is the human, so no confirmation). Returns the output with its receipt."""
    candidate_id = candidate.candidate_id
    # The candidate's key, and the key made at capture for the record it would have become.
    destroys = (
        k.destroy_candidate_key(call.scope, candidate.key_ref, call.now_ms),
        k.destroy_record_key(call.scope, candidate.record_id, call.now_ms),
    )
    output, changes = _commit_terminal(
        k,
        call,
        authorized,
        _Terminal("withdraw", candidate_id, "pending", "withdrawn", "key_destruction", {}),
        candidate_transition=StateTransition(candidate_id, "pending", "withdrawn"),
        outbox=destroys,
    )
    complete = k.run_outbox(changes.outbox)
    return {**output, "key_destruction": "complete" if complete else "pending"}


def forget(k: Kernel, call: Call, args: ForgetInput) -> dict[str, Any]:
    record_id = args.record_id
    call.target = record_id
    intent, stored = k.prior(call, args, args.idempotency_key, record_id)
    if stored is not None:
        progress = k.invalidation_progress(call.scope, record_id, int(stored["receipt"]["cursor"]))
        return {**stored, "replayed": True, **progress}

    row = k.record_leaving(call.scope, record_id, RECORD_STATES_FORGETTABLE)
    return commit_forget(k, call, row, _confirmed(k, call, args, record_id, intent))


def commit_forget(k: Kernel, call: Call, row: RecordRow, authorized: Authorized) -> dict[str, Any]:
    """Tombstone a record from whichever of the five states it is in, shred its body and drop
    every projection: the agent's forget, or an operator's. Returns the output with its receipt
    (``from_state`` says which state the record left)."""
    record_id = row.record_id
    call.digests.update(record_digest=row.record_digest)
    drop = ProjectionChange(delete_record_id=record_id)
    # The record's keys go in the same flow as its projections: every copy of the body it
    # sealed, or of the candidate it was (a backup, a point-in-time copy), is unreadable from
    # then on.
    outbox = [
        *k.deferred_projections(call.scope, record_id, "drop_projection", call.now_ms),
        *k.record_key_destruction(call.scope, row, call.now_ms),
    ]
    digests = {"record_digest": row.record_digest, "payload_digest": row.payload_digest}
    output, changes = _commit_terminal(
        k,
        call,
        authorized,
        _Terminal(
            "tombstone", record_id, row.state, "tombstoned", "projection_invalidation", digests
        ),
        record_transition=StateTransition(record_id, row.state, "tombstoned"),
        shred_record_body=True,
        tombstone_payload_digest=row.payload_digest,
        projection=drop,
        outbox=tuple(outbox),
    )
    k.run_outbox(changes.outbox)
    # An upsert still pending for the record now only drops it (it reads the tombstone).
    k.retry_pending_upsert(call.scope, record_id, call.now_ms)
    cursor = int(output["receipt"]["cursor"])
    return {**output, **k.invalidation_progress(call.scope, record_id, cursor)}


def commit_lifecycle(
    k: Kernel,
    call: Call,
    row: RecordRow,
    operation: LifecycleOperation,
    authorized: Authorized,
    superseded_by: str | None = None,
) -> dict[str, Any]:
    """Move ``row`` along the table (``LIFECYCLE[operation]``), journaled with its receipt. A
    record leaving ``accepted_current`` leaves search and get in the same commit and its
    projections are dropped; one resolved back is projected again. Returns the output with its
    receipt and whether the projections followed (``projections``)."""
    _, to_state = LIFECYCLE[operation]
    record_id = row.record_id
    call.digests["record_digest"] = row.record_digest
    projection, outbox = _projection_follows(k, call, row, to_state)
    digests = {"record_digest": row.record_digest}
    if superseded_by is not None:
        digests["superseded_by"] = superseded_by
    output, changes = _commit_terminal(
        k,
        call,
        authorized,
        _Terminal(operation, record_id, row.state, to_state, "projections", digests),
        record_transition=StateTransition(record_id, row.state, to_state),
        projection=projection if k.projects_in_store else None,
        outbox=tuple(outbox),
    )
    complete = k.run_outbox(changes.outbox)
    return {**output, "projections": "complete" if complete else "pending"}


def _projection_follows(
    k: Kernel, call: Call, row: RecordRow, to_state: str
) -> tuple[ProjectionChange | None, list[OutboxItem]]:
    """What the search projection does when ``row`` moves to ``to_state``: a record leaving
    ``accepted_current`` is dropped from it, one returning is upserted, others leave it alone."""
    record_id = row.record_id
    if row.state == "accepted_current":
        outbox = k.deferred_projections(call.scope, record_id, "drop_projection", call.now_ms)
        return ProjectionChange(delete_record_id=record_id), outbox
    if to_state == "accepted_current":
        doc = k.projection_doc(record_id, k.body(call.scope, row))
        outbox = k.deferred_projections(call.scope, record_id, "upsert_projection", call.now_ms)
        return ProjectionChange(upsert=doc), outbox
    return None, []


@dataclass(frozen=True)
class _Terminal:
    """A terminal transition as the journal records it."""

    event: str  # the journal event's operation
    target: str
    from_state: str
    to_state: str
    progress_field: str  # the part of the shredding the output reports, pending until it ran
    digests: dict[str, str]  # the event's digests beside the authorization receipt's


def _commit_terminal(
    k: Kernel, call: Call, authorized: Authorized, terminal: _Terminal, **changes: Any
) -> tuple[dict[str, Any], ChangeSet]:
    """Commit the transition: its journal event, its ledger entry and ``changes`` in one change
    set. The output as committed, and the change set (its outbox still to run)."""
    digests = {**terminal.digests, "authorization_receipt_digest": authorized.authorization}
    why = {**authorized.why, "by": call.ctx.principal}
    output: dict[str, Any] = {}

    def build(head: JournalHead) -> ChangeSet:
        step = k.journal_step(
            call, head, terminal.event, terminal.target, authorized.intent, digests, why
        )
        output.clear()
        output.update(
            _terminal_output(step, terminal.from_state, terminal.to_state, authorized.authorization)
        )
        output[terminal.progress_field] = "pending"
        ledger = k.ledger_entry(
            call,
            authorized.idempotency_key,
            terminal.target,
            authorized.intent,
            output,
            step.event.cursor,
        )
        return ChangeSet(
            scope=call.scope,
            expected_head=head,
            ledger=ledger,
            event=step.event,
            approval_id=authorized.approval_id,
            **changes,
        )

    return output, k.commit(call, build)


def _terminal_output(
    step: JournalStep, from_state: str, to_state: str, authorization: str
) -> dict[str, Any]:
    """The output of a terminal transition before its progress field (which says what of the
    shredding is still pending)."""
    return {
        "receipt": {
            "event_id": step.event_id,
            "operation": step.operation,
            "from_state": from_state,
            "to_state": to_state,
            "cursor": str(step.event.cursor),
            "event_digest": step.event.event_hash,
            "authorization_receipt_digest": authorization,
            "transaction_receipt_digest": step.transaction_receipt_digest,
        },
        "replayed": False,
    }

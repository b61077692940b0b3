"""request_admission: the host policy decides; acceptance promotes atomically (CONTRACT.md §7.4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from engram_memory.contract.canonical import digest
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import RequestAdmissionInput
from engram_memory.contract.types import format_instant, parse_instant
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.kernel import Call, JournalStep, Kernel
from engram_memory.engine.ports import (
    AdmissionRequest,
    CandidateHold,
    CandidateRow,
    ChangeSet,
    IndexHit,
    IndexMissing,
    IndexUnavailable,
    IndexUnreachable,
    JournalHead,
    NearDuplicateIndex,
    Neighbour,
    OutboxItem,
    PolicyUnavailable,
    ProjectionChange,
    ProjectionDoc,
    RecordRow,
    StateTransition,
)
from engram_memory.engine.records import decode, receipt, record_text, scope_ref


def request_admission(k: Kernel, call: Call, args: RequestAdmissionInput) -> dict[str, Any]:
    candidate_id = args.candidate_id
    call.target = candidate_id
    intent, stored = k.prior(call, args, args.idempotency_key, candidate_id)
    if stored is not None:
        outcome = stored["outcome"]
        if outcome.get("status") == "accepted":
            # The first call's commit landed but its answer (and maybe its upsert) was lost.
            k.retry_pending_upsert(call.scope, outcome["record_id"], call.now_ms)
        return {**stored, "replayed": True}  # a hold too: it was stored with the key

    candidate = k.pending_candidate(call, candidate_id)
    if candidate.state != "pending":
        raise EngramError(ErrorCode.NOT_FOUND)
    k.confirm(call, args, candidate_id, None)  # call.approval: consumed in the commit
    content = k.open_candidate(call, candidate)  # BLOB_MISSING once its key is gone, held or not
    if candidate.held is not None:
        # A policy held it: the hold stands until an operator decides, whatever the policy or
        # the index would say now. The call is held too, quoting the decision that held it.
        call.digests.update(
            decision_receipt_digest=candidate.held, record_digest=candidate.record_digest
        )
        return _held(k, call, candidate_id, candidate.held, args.idempotency_key, intent)
    record: dict[str, Any] = content["record"]
    verdict, policy_version = _policy_verdict(k, call, candidate, content)
    return settle(
        k,
        call,
        candidate,
        record,
        verdict=verdict,
        policy_id=k.policy.policy_id,
        policy_version=policy_version,
        idempotency_key=args.idempotency_key,
        intent=intent,
    )


def _policy_verdict(
    k: Kernel, call: Call, candidate: CandidateRow, content: Mapping[str, Any]
) -> tuple[str, str]:
    """The host policy's verdict on the opened candidate, and the policy version it decided
    under; the tombstone guard turns an acceptance of forgotten content into a hold."""
    record = content["record"]
    version_before = k.policy_version()
    try:
        decision = k.policy.decide(
            AdmissionRequest(
                scope=call.scope,
                principal=call.ctx.principal,
                candidate_id=candidate.candidate_id,
                record=record,
                evidence=content["evidence"],
                host_facts=call.ctx.host_facts,
                host_fact_digests=call.ctx.host_fact_digests,
                neighbours=neighbours(k, call.scope, record, call.now_ms),
            )
        )
    except PolicyUnavailable:
        raise EngramError(ErrorCode.POLICY_UNAVAILABLE) from None
    if k.policy_version() != version_before:
        raise EngramError(ErrorCode.POLICY_STALE)
    verdict: str = decision.decision
    if verdict == "accept" and forgotten(k, call.scope, candidate.payload_digest):
        verdict = "adjudication_required"
    return verdict, version_before


def forgotten(k: Kernel, scope: Scope, payload_digest: str) -> bool:
    """The tombstone guard: whether content with this payload digest was forgotten in
    ``scope``. A policy's acceptance of it is held for an operator instead, so forgotten content
    stays forgotten unless a human decides otherwise."""
    return k.read(lambda: k.store.payload_tombstoned(scope, payload_digest))


# The policy an operator's adjudication is journaled under (its version: the operator).
OPERATOR_POLICY_ID: Final = "operator-adjudication"
# How many of the scope's records its index finds most like a candidate are compared with it: a
# near-duplicate shares most of its sketch (or, ranked lexically, nearly all its terms), so it
# comes first.
NEIGHBOUR_DEPTH = 8
# How many records committed but not yet in an index the engine projects itself (OpenSearch:
# their upserts still in the outbox) an admission compares the candidate with, at most. A scope
# with more on their way (an index down for a while, a drainer behind) answers PROJECTION_STALE.
UNPROJECTED_LIMIT = 64


def neighbours(
    k: Kernel, scope: Scope, record: Mapping[str, Any], now_ms: int
) -> tuple[Neighbour, ...]:
    """The current records of ``scope`` most like ``record``, opened for the policy: the
    lexical index's near-duplicate sketches when it keeps them (``NearDuplicateIndex``: the
    embedded store, in the record's own commit, so their cost does not grow with the scope),
    else its best hits (the same analyzer and index as search), and every record the store
    committed that the index may not hold yet (``unprojected``), each revalidated against the
    store and opened from it.

    So the decision does not depend on the index having caught up: a record is in the index or
    its upsert is in the outbox, written in the record's own commit. An index that cannot be
    asked is ``RANKING_UNAVAILABLE``; more than ``UNPROJECTED_LIMIT`` records on their way is
    ``PROJECTION_STALE`` (both retriable, nothing written): the gate never admits what it
    could not compare. The one exception is an engine that can never ask its index
    (``IndexUnreachable``: the cloud operator's seat, whose imports leave every upsert to the
    drainer): none, as before; docs/deploying-aws.md says so."""
    try:
        hits = _alike(k, scope, record_text(record))
    except IndexUnreachable:
        return ()
    except IndexMissing:
        hits = []  # no index holds nothing (a new stack's, until its first upsert creates it)
    except IndexUnavailable:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
    ids = list(dict.fromkeys([*(hit.record_id for hit in hits), *unprojected(k, scope)]))
    if not ids:
        return ()
    rows = k.read(lambda: k.store.records_get(scope, ids))
    current = [rows[record_id] for record_id in ids if record_id in rows]
    opened = k.bodies(scope, [row for row in current if k.eligible(row, now_ms)])
    return tuple(
        Neighbour(record_id, record_text(opened[record_id]))
        for record_id in ids
        if record_id in opened
    )


def _alike(k: Kernel, scope: Scope, text: str) -> list[IndexHit]:
    if isinstance(k.lexical, NearDuplicateIndex):
        return k.lexical.near_duplicates(scope, text, NEIGHBOUR_DEPTH)
    terms = lexical.query_terms(text)
    return k.lexical.search(scope, terms, NEIGHBOUR_DEPTH) if terms else []


def unprojected(k: Kernel, scope: Scope) -> list[str]:
    """The records of ``scope`` the lexical index may not hold yet: none when the store
    projects them in its own commit (SQLite), else those whose upsert waits in the outbox (read
    from the store, consistent with its commits). ``PROJECTION_STALE`` past
    ``UNPROJECTED_LIMIT``."""
    if k.lexical.maintained_by_store:
        return []
    waiting = k.read(
        lambda: k.store.outbox_pending_in(scope, "upsert_projection", UNPROJECTED_LIMIT + 1)
    )
    if len(waiting) > UNPROJECTED_LIMIT:
        raise EngramError(ErrorCode.PROJECTION_STALE)
    return [item.target for item in waiting if item.surface == k.lexical.name]


def settle(
    k: Kernel,
    call: Call,
    candidate: CandidateRow,
    record: dict[str, Any],
    *,
    verdict: str,
    policy_id: str,
    policy_version: str,
    idempotency_key: str,
    intent: str,
    overrides_hold: bool = False,
) -> dict[str, Any]:
    """Issue the decision envelope and apply it: hold, accept or reject.

    A hold stores the answer with the idempotency key and marks the candidate held (``_held``).
    A policy's acceptance or rejection is refused by the store while the candidate is held (a
    concurrent call held it: the use case runs again and finds the hold); an operator's
    adjudication (``overrides_hold``) ends the hold. Acceptance promotes atomically — record, journal event, ledger and the projection (inside the
    commit for a store-maintained index, else as an ``upsert_projection`` outbox item) in one
    commit; rejection ends the candidate and queues its keys' destruction the same way.
    After the commit the outbox items run at once; what fails is left to the drainer.
    """
    candidate_id = candidate.candidate_id
    decision_digest = _decision_receipt(call, candidate, verdict, policy_id, policy_version)
    if verdict == "adjudication_required":
        return _held(k, call, candidate_id, decision_digest, idempotency_key, intent)
    accepted = verdict == "accept"
    return _commit_decision(
        k,
        call,
        accepted,
        candidate,
        record,
        decision_digest,
        _Ledger(idempotency_key, intent, unless_held=not overrides_hold),
    )


def adjudicate(
    k: Kernel,
    call: Call,
    candidate_id: str,
    decision: Literal["accept", "reject"],
    intent: str,
) -> dict[str, Any]:
    """One attempt at an operator's decision on a pending candidate: a replay of the same one
    (its key is the candidate's, under the operator's principal), or the candidate settled as a
    policy decision with the operator as the policy, ending any hold. ``NOT_FOUND`` for a
    candidate that is not pending; ``DIGEST_CONFLICT`` for another decision than the first."""
    key = f"adjudicate:{candidate_id}"
    replay = k.ledger(call, key, candidate_id, intent)
    if replay is not None:
        stored: dict[str, Any] = decode(replay.output)
        return stored
    candidate = k.read(lambda: k.store.candidate_get(call.scope, candidate_id))
    if candidate is None or candidate.state != "pending":
        raise EngramError(ErrorCode.NOT_FOUND)
    content = k.open_candidate(call, candidate)
    return settle(
        k,
        call,
        candidate,
        content["record"],
        verdict=decision,
        policy_id=OPERATOR_POLICY_ID,
        policy_version=call.ctx.principal,
        idempotency_key=key,
        intent=intent,
        overrides_hold=True,
    )


@dataclass(frozen=True, slots=True)
class _Ledger:
    """Where a decision's answer is kept: its idempotency key and intent hash; and whether the
    store must refuse it on a held candidate (a policy's decision, not an operator's)."""

    idempotency_key: str
    intent: str
    unless_held: bool


def _commit_decision(
    k: Kernel,
    call: Call,
    accepted: bool,
    candidate: CandidateRow,
    record: dict[str, Any],
    decision_digest: str,
    ledger: _Ledger,
) -> dict[str, Any]:
    candidate_id = candidate.candidate_id
    # Accepted: the body sealed under the record's key (made at capture), and the projection
    # document, both made in the capture's idle time when it could (``call.expected``).
    # Rejected: that key protects nothing and is destroyed with the candidate's.
    doc, sealed_body = _acceptance(k, call, candidate, record) if accepted else (None, None)
    outbox = _settling_outbox(k, call, candidate, accepted)
    output: dict[str, Any] = {}

    def build(head: JournalHead) -> ChangeSet:
        step = k.journal_step(
            call,
            head,
            "admit" if accepted else "reject",
            candidate_id,
            ledger.intent,
            {"record_digest": candidate.record_digest, "decision_receipt_digest": decision_digest},
        )
        output.clear()
        output.update(
            {"outcome": _outcome(step, candidate, accepted, decision_digest), "replayed": False}
        )
        new_record = (
            _accepted_row(candidate, record, step.event.cursor, sealed_body) if accepted else None
        )
        projection = ProjectionChange(upsert=doc) if accepted and k.projects_in_store else None
        return ChangeSet(
            scope=call.scope,
            expected_head=head,
            ledger=k.ledger_entry(
                call, ledger.idempotency_key, candidate_id, ledger.intent, output, step.event.cursor
            ),
            event=step.event,
            candidate_transition=StateTransition(
                candidate_id, "pending", "admitted" if accepted else "rejected"
            ),
            unless_held=ledger.unless_held,
            new_record=new_record,
            projection=projection,
            approval_id=call.approval.approval_id if call.approval else None,
            outbox=outbox,
        )

    changes = k.commit(call, build)
    k.run_outbox(changes.outbox, {candidate.record_id: doc} if doc is not None else None)
    return output


def _acceptance(
    k: Kernel, call: Call, candidate: CandidateRow, record: dict[str, Any]
) -> tuple[ProjectionDoc, bytes]:
    ahead = call.expected
    doc = ahead.doc if ahead is not None else None
    sealed_body = ahead.sealed_body if ahead is not None else None
    if doc is None:
        doc = k.projection_doc(candidate.record_id, record)
    if sealed_body is None:
        sealed_body = k.seal_record(call, record)
    return doc, sealed_body


def _outcome(
    step: JournalStep, candidate: CandidateRow, accepted: bool, decision_digest: str
) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        "status": "accepted" if accepted else "rejected",
        "candidate_id": candidate.candidate_id,
        "cursor": str(step.event.cursor),
        "decision_receipt_digest": decision_digest,
        "transaction_receipt_digest": step.transaction_receipt_digest,
    }
    if accepted:
        outcome["record_id"] = candidate.record_id
    return outcome


def _decision_receipt(
    call: Call, candidate: CandidateRow, verdict: str, policy_id: str, policy_version: str
) -> str:
    """The digest of the decision envelope, recorded on the call for the audit."""
    envelope = receipt(
        "admission-decision",
        {
            "policy_id": policy_id,
            "policy_version": policy_version,
            "record_digest": candidate.record_digest,
            "decision": verdict,
            "issued_at": format_instant(call.now_ms),
        },
    )
    decision_digest: str = envelope["receipt_digest"]
    call.digests.update(
        decision_receipt_digest=decision_digest, record_digest=candidate.record_digest
    )
    return decision_digest


def _held(
    k: Kernel,
    call: Call,
    candidate_id: str,
    decision_digest: str,
    idempotency_key: str,
    intent: str,
) -> dict[str, Any]:
    """A decision held for an operator, stored in one commit: the answer in the ledger under
    the call's idempotency key (a retry with it replays the hold) and the candidate marked held
    with the decision's digest (a call with another key is held too). No journal event: the
    candidate stays ``pending``, so the receipt quotes the head it was held at and the ledger
    entry names no event (cursor 0)."""
    output: dict[str, Any] = {}

    def build(head: JournalHead) -> ChangeSet:
        held = {
            "status": "pending_adjudication",
            "candidate_id": candidate_id,
            "cursor": str(head.cursor),
            "decision_receipt_digest": decision_digest,
            "transaction_receipt_digest": digest(
                "canonical-transaction",
                {
                    "operation": "admission_held",
                    "scope_ref": scope_ref(call.scope),
                    "target": candidate_id,
                    "cursor": str(head.cursor),
                    "decision_receipt_digest": decision_digest,
                    "intent_hash": intent,
                },
            ),
        }
        output.clear()
        output.update({"outcome": held, "replayed": False})
        return ChangeSet(
            scope=call.scope,
            expected_head=None,
            ledger=k.ledger_entry(call, idempotency_key, candidate_id, intent, output, 0),
            hold=CandidateHold(candidate_id, decision_digest),
            approval_id=call.approval.approval_id if call.approval else None,
        )

    k.commit(call, build)
    return output


def _settling_outbox(
    k: Kernel, call: Call, candidate: CandidateRow, accepted: bool
) -> tuple[OutboxItem, ...]:
    """A rejected candidate's key goes, with the key made for the record it would have become
    (a rejection may be what keeps a secret out). An accepted one's key stays, linked to its
    record (``CandidateRow.record_id``): a backup taken while it was pending holds only its
    ciphertext, which must open after a restore; forgetting the record destroys it
    (``Kernel.record_key_destruction``)."""
    if not accepted:
        return (
            k.destroy_candidate_key(call.scope, candidate.key_ref, call.now_ms),
            k.destroy_record_key(call.scope, candidate.record_id, call.now_ms),
        )
    return tuple(
        k.deferred_projections(call.scope, candidate.record_id, "upsert_projection", call.now_ms)
    )


def _accepted_row(
    candidate: CandidateRow, record: dict[str, Any], cursor: int, sealed_body: bytes | None
) -> RecordRow:
    valid_time = record["valid_time"]
    expires_at = record["retention"].get("expires_at")
    return RecordRow(
        record_id=candidate.record_id,
        state="accepted_current",
        record_digest=candidate.record_digest,
        payload_digest=candidate.payload_digest,
        candidate_id=candidate.candidate_id,
        valid_from_ms=valid_time["t"],
        valid_to_ms=valid_time.get("t_end"),
        expires_at_ms=parse_instant(expires_at) if expires_at else None,
        accepted_cursor=cursor,
        body=sealed_body,
    )

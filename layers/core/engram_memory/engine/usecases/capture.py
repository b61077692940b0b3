"""capture: seal the agent's material as a pending candidate (CONTRACT.md §7.3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engram_memory.contract.canonical import candidate_id_for
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import CaptureInput
from engram_memory.contract.types import format_instant, parse_instant
from engram_memory.engine.kernel import Call, Kernel, Sealed, StateMoved
from engram_memory.engine.ports import CandidateRow, ChangeSet, JournalHead, SealedBlob
from engram_memory.engine.records import build_record, evidence_object, stored_payload


def capture(k: Kernel, call: Call, args: CaptureInput) -> dict[str, Any]:
    ctx = call.ctx
    k.check_purpose(call, args.payload.purpose_ref)
    candidate_id = candidate_id_for(
        ctx.tenant_id, ctx.workspace_id, ctx.principal, args.idempotency_key
    )
    call.target = candidate_id
    intent, stored = k.prior(call, args, args.idempotency_key, None)
    if stored is not None:
        return {**stored, "status": "duplicate_exact"}

    check_retention(k, call, args)
    return _commit_capture(k, call, args, candidate_id, intent)


def _commit_capture(
    k: Kernel, call: Call, args: CaptureInput, candidate_id: str, intent: str
) -> dict[str, Any]:
    ctx = call.ctx
    payload = stored_payload(args, call.scope)
    evidence = evidence_object(args)
    approval = k.confirm(call, args, None, None)
    authorization = k.authorization_receipt(
        call, approval, {"purpose_ref": ctx.purpose_ref, "at": format_instant(call.now_ms)}
    )
    policy_version = k.policy_version()
    sealed_keys: list[str] = []
    sealed: list[Sealed] = []  # the last build's, which the commit wrote
    superseded: set[str] = set()
    output: dict[str, Any] = {}
    content: dict[str, Any] = {}

    def build(head: JournalHead) -> ChangeSet:
        record = build_record(
            payload,
            evidence,
            recorded_at_ms=call.now_ms,
            recorded_cursor=head.cursor + 1,
            authorization_receipt_digest=authorization,
        )
        k.prepare_record_key(call, record["record_id"])
        content.update(record=record, evidence=evidence)
        blob, plaintext = k.seal(call, candidate_id, content)
        sealed[:] = [(blob, plaintext)]
        sealed_keys.append(blob.key_ref)
        superseded.update(blob.superseded)
        digests = {name: record[name] for name in ("payload_digest", "record_digest")}
        step = k.journal_step(call, head, "capture", candidate_id, intent, digests)
        output.clear()
        output.update(
            {
                "status": "committed_pending",
                "candidate_id": candidate_id,
                "record_digest": record["record_digest"],
                "cursor": str(step.event.cursor),
                "transaction_receipt_digest": step.transaction_receipt_digest,
            }
        )
        call.digests.update(digests)
        return ChangeSet(
            scope=call.scope,
            expected_head=head,
            ledger=k.ledger_entry(
                call, args.idempotency_key, None, intent, output, step.event.cursor
            ),
            event=step.event,
            new_candidate=_pending_row(
                call, candidate_id, record, step.event.cursor, blob, policy_version
            ),
            approval_id=approval.approval_id if approval else None,
        )

    _commit_sealed(k, call, build, sealed_keys, superseded)
    k.anticipate_admission(call, candidate_id, content, sealed[0])
    return output


def _commit_sealed(
    k: Kernel,
    call: Call,
    build: Callable[[JournalHead], ChangeSet],
    sealed_keys: list[str],
    superseded: set[str],
) -> None:
    """Commit, then shred every candidate key a ``build`` sealed that no committed candidate
    holds (a commit retried after the head moved seals again, under a new key), and, once the
    candidate is committed, the keys earlier attempts of the call left (``superseded``)."""
    try:
        changes = k.commit(call, build)
    except EngramError as error:
        # A definite failure leaves no candidate: shred every key sealed for it. When the
        # outcome is unknown the last key may guard a committed candidate, so keep that one.
        keep = sealed_keys[-1:] if error.code is ErrorCode.MUTATION_OUTCOME_UNKNOWN else []
        k.shred_unused(sealed_keys, keep)
        raise
    except StateMoved:
        k.shred_unused(sealed_keys, [])
        raise
    committed_key = changes.new_candidate.key_ref if changes.new_candidate else None
    # Only now may an earlier attempt's key go: until this commit it may guard the candidate.
    unused = sealed_keys + sorted(superseded - set(sealed_keys))
    k.shred_unused(unused, [committed_key] if committed_key else [])


def _pending_row(
    call: Call,
    candidate_id: str,
    record: dict[str, Any],
    cursor: int,
    blob: SealedBlob,
    policy_version: str,
) -> CandidateRow:
    return CandidateRow(
        candidate_id=candidate_id,
        principal=call.ctx.principal,
        state="pending",
        payload_digest=record["payload_digest"],
        record_digest=record["record_digest"],
        record_id=record["record_id"],
        capture_cursor=cursor,
        key_ref=blob.key_ref,
        sealed=blob.ciphertext,
        policy_version=policy_version,
        created_at_ms=call.now_ms,
    )


def check_retention(k: Kernel, call: Call, args: CaptureInput) -> None:
    retention = args.payload.retention
    policy = call.ctx.retention
    if retention is not None:
        if retention.expires_at is not None:
            expires_ms = parse_instant(retention.expires_at)
            if expires_ms <= call.now_ms:
                raise EngramError(ErrorCode.INVALID_SCHEMA)
            if expires_ms - call.now_ms > policy.max_expires_in_s * 1000:
                raise EngramError(ErrorCode.UNAUTHORIZED)
        if retention.derivative_rule == "retain" and not policy.allow_retain:
            raise EngramError(ErrorCode.UNAUTHORIZED)
    reconciliation = args.payload.reconciliation
    if reconciliation is not None and reconciliation.family_refs and not call.ctx.reconcile_consent:
        raise EngramError(ErrorCode.UNAUTHORIZED)

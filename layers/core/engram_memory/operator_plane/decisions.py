"""What an operator decides: the audited decisions of the operator plane, for both hosts.

- ``adjudicate``: accept or reject a pending candidate (a policy's hold ends with it);
- the record lifecycle of §4 (``dispute``, ``resolve``, ``supersede``, ``expire``,
  ``trust_invalidate``: ``transition``), and the operator's ``withdraw_candidate`` and
  ``forget_record``, each committed by the engine's one transition commit
  (``engine.usecases.transitions``) with its journal event and receipt;
- ``revoke_credentials``: a token, or every token of a principal.

Each takes the engine, the scope and the operator's identity and is audited (``auditing``); the
operator's reason and arguments are bound into the journaled intent and the authorization
receipt (the operator is the human: no confirmation is asked).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from engram_memory.contract.canonical import digest
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import Scope
from engram_memory.engine.kernel import RECORD_STATES_FORGETTABLE, Call, Kernel
from engram_memory.engine.ports import CandidateRow, RecordRow
from engram_memory.engine.records import scope_ref
from engram_memory.engine.usecases import inspection as canonical
from engram_memory.engine.usecases.admission import adjudicate as commit_adjudication
from engram_memory.engine.usecases.transitions import (
    LIFECYCLE,
    Authorized,
    LifecycleOperation,
    commit_forget,
    commit_lifecycle,
    commit_withdraw,
    withdrawable,
)
from engram_memory.operator_plane.auditing import OPERATIONS_PURPOSE, audited
from engram_memory.operator_plane.backup_checks import OperationRefused
from engram_memory.operator_plane.crash_points import crash_point


def _operator_intent(call: Call, target: str, arguments: Mapping[str, Any]) -> str:
    intent = digest(
        "intent",
        {
            "tool": call.tool,
            "target": target,
            "arguments": dict(arguments),
            "purpose": OPERATIONS_PURPOSE,
            "scope": scope_ref(call.scope),
        },
    )
    call.digests["intent_hash"] = intent
    return intent


def _reason(reason: str | None) -> str:
    """An operator's reason, kept as given (it is the operator's text, never memory content)."""
    if reason is None or not reason.strip() or len(reason.encode("utf-8")) > 512:
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    return reason


# --------------------------------------------------------------------------------------------
# Candidates: the decision
# --------------------------------------------------------------------------------------------


def adjudicate(
    engine: Kernel,
    scope: Scope,
    candidate_id: str,
    decision: Literal["accept", "reject"],
    operator: str,
    reason: str | None = None,
) -> dict[str, Any]:
    """Resolve a pending candidate (one held as ``pending_adjudication``, or one never held): a
    human operator accepts or rejects it, with a reason that is part of the journaled intent;
    the policy's hold ends with it.

    Idempotent per operator and candidate: repeating the same decision returns the first outcome;
    a different decision afterwards is ``DIGEST_CONFLICT``; a candidate that is not pending is
    ``NOT_FOUND``. The decision is journaled like a policy decision, with the operator as policy.
    """
    if decision not in ("accept", "reject"):
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    arguments: dict[str, Any] = {"decision": decision}
    if reason is not None:
        arguments["reason"] = _reason(reason)

    def run(call: Call) -> dict[str, Any]:
        call.tool = "request_admission"
        call.reason = arguments.get("reason")
        intent = digest(
            "intent",
            {
                "tool": "adjudicate",
                "target": candidate_id,
                "arguments": arguments,
                "purpose": OPERATIONS_PURPOSE,
                "scope": scope_ref(scope),
            },
        )
        call.digests["intent_hash"] = intent
        try:
            result = engine.mutation(
                call, lambda: commit_adjudication(engine, call, candidate_id, decision, intent)
            )
        except EngramError as error:
            if error.code in (ErrorCode.DIGEST_CONFLICT, ErrorCode.NOT_FOUND):
                _refuse_if_decided(engine, scope, candidate_id)
            raise
        finally:
            call.tool = "adjudicate"
        outcome: dict[str, Any] = result["outcome"]
        return outcome

    return audited(engine, scope, operator, "adjudicate", candidate_id, run)


_DECIDED: Final = {"admit": "accepted", "reject": "rejected", "withdraw": "withdrawn"}


def _refuse_if_decided(engine: Kernel, scope: Scope, candidate_id: str) -> None:
    """A candidate decided already (by a policy, an operator or a withdraw) is
    ``ALREADY_TERMINAL``, saying how and when: not a digest conflict or an unknown id."""
    candidate = canonical.candidate(engine, scope, candidate_id)
    if candidate is None or candidate.state == "pending":
        return
    decided = [
        f"{_DECIDED[body['operation']]} at {body.get('at', '?')}"
        for _, body in canonical.journal(engine, scope)
        if body.get("target") == candidate_id and body.get("operation") in _DECIDED
    ]
    raise OperationRefused(
        ErrorCode.ALREADY_TERMINAL,
        f"candidate {candidate_id} was already decided ({decided[-1] if decided else candidate.state})",
    ) from None


def withdraw_candidate(
    engine: Kernel, scope: Scope, candidate_id: str, operator: str, reason: str
) -> dict[str, Any]:
    """The operator withdraws a pending candidate (whoever captured it) and shreds its key; the
    receipt is the agent's withdraw receipt. ``ALREADY_TERMINAL`` for a rejected or withdrawn
    candidate, ``ILLEGAL_TRANSITION`` for an admitted one, ``NOT_FOUND`` for an unknown one."""
    arguments = {"reason": _reason(reason)}

    def pending(_call: Call) -> CandidateRow:
        return withdrawable(canonical.candidate(engine, scope, candidate_id))

    return _operator_commit(
        engine, scope, operator, "withdraw", candidate_id, arguments, pending, commit_withdraw
    )


def _operator_commit(
    engine: Kernel,
    scope: Scope,
    operator: str,
    operation: str,
    target: str,
    arguments: Mapping[str, Any],
    find: Callable[[Call], Any],
    commit: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """An operator's withdraw, forget or lifecycle transition: audited, its intent and
    authorization bound to the operator's arguments (once per call); each attempt finds what it
    moves and commits it through the engine's transition commit (with no approval: the
    operator is the human)."""

    def run(call: Call) -> dict[str, Any]:
        call.reason = arguments["reason"]
        authorized = Authorized(
            idempotency_key=f"{operation}:{target}:{call.ctx.audit_id}",
            intent=_operator_intent(call, target, arguments),
            authorization=_operator_authorization(engine, call, arguments),
            why={"reason": arguments["reason"]},
        )

        def attempt() -> dict[str, Any]:
            return commit(engine, call, find(call), authorized)

        return engine.mutation(call, attempt)

    return audited(engine, scope, operator, operation, target, run)


def _operator_authorization(engine: Kernel, call: Call, arguments: Mapping[str, Any]) -> str:
    """The authorization receipt of an operator's decision: the operator is the human, so the
    confirmation is ``not-required``; the receipt binds the operator and the arguments."""
    return engine.authorization_receipt(call, None, {"operator_arguments": dict(arguments)})


# --------------------------------------------------------------------------------------------
# Records: their lifecycle
# --------------------------------------------------------------------------------------------


def transition(
    engine: Kernel,
    scope: Scope,
    record_id: str,
    operation: LifecycleOperation,
    operator: str,
    reason: str,
    *,
    superseded_by: str | None = None,
) -> dict[str, Any]:
    """One lifecycle transition of §4 on a record, journaled with its receipt.

    ``dispute`` (current → disputed), ``resolve`` (disputed → current), ``supersede`` (current
    or disputed → historical; ``superseded_by`` names the current record that replaces it),
    ``expire`` (→ expired), ``trust_invalidate`` (→ trust_invalid). A record leaving
    ``accepted_current`` leaves search and get in the same commit and its projections are
    dropped; one resolved back is projected again. ``ALREADY_TERMINAL`` on a tombstoned record,
    ``ILLEGAL_TRANSITION`` from any other state the table does not list.
    """
    if operation not in LIFECYCLE:
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    sources, _ = LIFECYCLE[operation]
    arguments: dict[str, Any] = {"reason": _reason(reason)}
    if superseded_by is not None:
        if operation != "supersede" or superseded_by == record_id:
            raise EngramError(ErrorCode.INVALID_SCHEMA)
        arguments["superseded_by"] = superseded_by

    def leaving(_call: Call) -> RecordRow:
        row = engine.record_leaving(scope, record_id, sources)
        if superseded_by is not None:
            successor = canonical.record(engine, scope, superseded_by)
            if successor is None or successor.state != "accepted_current":
                raise EngramError(ErrorCode.NOT_FOUND)
        return row

    def commit(k: Kernel, call: Call, row: RecordRow, authorized: Authorized) -> dict[str, Any]:
        return commit_lifecycle(k, call, row, operation, authorized, superseded_by)

    return _operator_commit(
        engine, scope, operator, operation, record_id, arguments, leaving, commit
    )


def forget_record(
    engine: Kernel, scope: Scope, record_id: str, operator: str, reason: str
) -> dict[str, Any]:
    """The operator forgets a record from any of the five states: tombstoned, body shredded,
    projections dropped; the receipt says which state it left (``from_state``)."""
    arguments = {"reason": _reason(reason)}

    def forgettable(_call: Call) -> RecordRow:
        return engine.record_leaving(scope, record_id, RECORD_STATES_FORGETTABLE)

    return _operator_commit(
        engine, scope, operator, "forget", record_id, arguments, forgettable, commit_forget
    )


# --------------------------------------------------------------------------------------------
# Credentials
# --------------------------------------------------------------------------------------------


def revoke_credentials(
    engine: Kernel,
    tenant_id: str,
    operator: str,
    *,
    token_id: str | None = None,
    principal: str | None = None,
) -> dict[str, Any]:
    """Revoke one token (its ``jti``) or every token a principal holds now: from this call on,
    each answers ``AUTHORIZATION_REVOKED`` (tokens minted for the principal afterwards work).
    Exactly one of ``token_id`` and ``principal``. Audited as ``admin.revoke``."""
    if (token_id is None) == (principal is None):
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    kind: Literal["token", "principal"] = "token" if token_id is not None else "principal"
    value = token_id if token_id is not None else principal
    if value is None or not value.strip():
        raise EngramError(ErrorCode.INVALID_SCHEMA)

    def run(call: Call) -> dict[str, Any]:
        at_ms = engine.revoke_credentials(tenant_id, kind, value, call.now_ms)
        crash_point("revoke.written")
        out: dict[str, Any] = {"revoked": kind, kind: value, "at": format_instant(at_ms)}
        if at_ms != call.now_ms and kind == "token":
            out["already_revoked"] = True
        return out

    return audited(engine, Scope(tenant_id, "*"), operator, "revoke", f"{kind}:{value}", run)

"""The host operations plane: actions that are never agent tools (CONTRACT.md §1, §4).

Only the host's operator CLIs call these (the embedded ``engram-memory admin``, and a cloud CLI
running the same functions with the operator's credentials against a stack); nothing here is
reachable through ``/mcp``. Each function takes the engine, the scope and the operator's identity
(a login, an IAM principal): every call is audited under ``operator:<identity>`` with the tool
``admin.<operation>``, whatever its outcome, and never with content.

- inspection: ``pending_list``, ``pending_show`` (opens the sealed candidate for the operator),
  ``records_list``, ``records_search`` (the agents' search and ranking), ``record_show``,
  ``record_history``, ``status``, ``export_records``;
- decisions: ``adjudicate``, the record lifecycle of §4 (``dispute``, ``resolve``, ``supersede``,
  ``expire``, ``trust_invalidate``: ``transition``), and the operator's ``withdraw_candidate``
  and ``forget_record``, each committing a journal event with its receipt;
- repair: ``reindex``, ``verify_all``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from pydantic import ValidationError

from engram_memory.contract.canonical import digest
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import SearchInput
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import TOOLS, Scope, TrustedContext, new_audit_id
from engram_memory.engine.journal import event_id_for, verify_journal
from engram_memory.engine.kernel import RECORD_STATES_FORGETTABLE, Call, Kernel
from engram_memory.engine.ports import (
    AdmissionRequest,
    AuditEvent,
    CandidateRow,
    IndexUnavailable,
    LedgerByCursor,
    PolicyUnavailable,
    RecordRow,
    StoreUnavailable,
    VaultUnavailable,
)
from engram_memory.engine.records import decode, scope_ref
from engram_memory.engine.usecases.admission import neighbours, settle
from engram_memory.engine.usecases.reads import search as agent_search
from engram_memory.engine.usecases.transitions import (
    LIFECYCLE,
    LIFECYCLE_STATES,
    Authorized,
    LifecycleOperation,
    commit_forget,
    commit_lifecycle,
    commit_withdraw,
)
from engram_memory.operator_plane.backup_checks import OperationRefused
from engram_memory.operator_plane.crash_points import crash_point
from engram_memory.operator_plane.text import progress

OPERATOR_POLICY_ID = "operator-adjudication"
OPERATIONS_PURPOSE: Final = "operations"
_PAGE: Final = 500
_STATUS_SCAN_LIMIT: Final = 10_000  # records and candidates status checks one by one, at most
# Pending candidates and record bodies the health check opens by default (each kind); --full: all
HEALTH_SAMPLE: Final = 1_000
_UNREADABLE_LISTED: Final = 50

T = TypeVar("T")


def operator_principal(operator: str) -> str:
    """The principal an operator's decisions are journaled and audited under."""
    if not operator or not operator.strip():
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    return f"operator:{operator}"


def audited(
    engine: Kernel,
    scope: Scope,
    operator: str,
    operation: str,
    target: str | None,
    run: Callable[[Call], T],
) -> T:
    """Run one operation as ``operator`` and audit it (ok or the error code), never content."""
    principal = operator_principal(operator)
    ctx = TrustedContext(
        tenant_id=scope.tenant_id,
        workspace_id=scope.workspace_id,
        principal=principal,
        purpose_ref=OPERATIONS_PURPOSE,
        audit_id=new_audit_id(),
        grants=frozenset(TOOLS),
    )
    call = Call(
        tool=operation,
        ctx=ctx,
        now_ms=engine.clock.now_ms(),
        target=target,
    )
    code = "OK"
    try:
        return run(call)
    except EngramError as error:
        code = error.code.value
        raise
    except (StoreUnavailable, IndexUnavailable):
        code = ErrorCode.STORE_UNAVAILABLE.value
        raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
    finally:
        engine.audit.record(
            AuditEvent.of_call(
                ctx,
                at_ms=call.now_ms,
                tool=f"admin.{operation}",
                ok=code == "OK",
                code=code,
                target=call.target,
                digests=dict(call.digests),
            )
        )


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
# Candidates: what waits, what it says, the decision
# --------------------------------------------------------------------------------------------


def _candidate_summary(row: CandidateRow) -> dict[str, Any]:
    return {
        "candidate_id": row.candidate_id,
        "state": row.state,
        "principal": row.principal,
        "record_id": row.record_id,
        "record_digest": row.record_digest,
        "captured_at": format_instant(row.created_at_ms),
        "capture_cursor": str(row.capture_cursor),
        "policy_version": row.policy_version,
        # held by the admission policy (waits for an operator), or never held: not yet asked
        # for admission, or asked and not decided (an error)
        "held": row.held is not None,
    }


def pending_list(
    engine: Kernel, scope: Scope, operator: str, *, after: str = "", limit: int = 100
) -> list[dict[str, Any]]:
    """The scope's pending candidates (captured, not yet admitted, rejected or withdrawn; those
    a policy held for adjudication among them, ``held``), in id order: ids and digests, no
    content."""

    def run(call: Call) -> list[dict[str, Any]]:
        rows = engine.store.candidates_list(scope, "pending", after, limit)
        return [_candidate_summary(row) for row in rows]

    return audited(engine, scope, operator, "pending_list", None, run)


def pending_show(engine: Kernel, scope: Scope, candidate_id: str, operator: str) -> dict[str, Any]:
    """A pending candidate opened for the operator: the record it would become, its evidence,
    and the current records of the scope it near-duplicates (``resembles``, as the admission
    policy sees them now: why a capture was held). Audited (the audit line names the candidate,
    never its content); ``NOT_FOUND`` for anything but a pending candidate of the scope."""

    def run(call: Call) -> dict[str, Any]:
        candidate = engine.read(lambda: engine.store.candidate_get(scope, candidate_id))
        if candidate is None or candidate.state != "pending":
            raise EngramError(ErrorCode.NOT_FOUND)
        content = engine.open_candidate(call, candidate)
        call.digests["record_digest"] = candidate.record_digest
        return {
            "candidate": _candidate_summary(candidate),
            "record": content["record"],
            "evidence": content["evidence"],
            "resembles": _resembles(engine, call, candidate, content),
        }

    return audited(engine, scope, operator, "pending_show", candidate_id, run)


def _resembles(
    engine: Kernel, call: Call, candidate: CandidateRow, content: Mapping[str, Any]
) -> list[str]:
    """The records the policy's near-duplicate rule names for the candidate (empty when the
    policy has no such rule or cannot decide right now: a policy or an index down)."""
    try:
        request = AdmissionRequest(
            scope=call.scope,
            principal=candidate.principal,
            candidate_id=candidate.candidate_id,
            record=content["record"],
            evidence=content["evidence"],
            host_facts=(),
            neighbours=neighbours(engine, call.scope, content["record"], call.now_ms),
        )
        return list(engine.policy.decide(request).resembles)
    except PolicyUnavailable:
        return []
    except EngramError as error:
        if error.code not in (ErrorCode.RANKING_UNAVAILABLE, ErrorCode.PROJECTION_STALE):
            raise
        return []


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
                call, lambda: _decide(engine, call, scope, candidate_id, decision, intent)
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
    candidate = engine.read(lambda: engine.store.candidate_get(scope, candidate_id))
    if candidate is None or candidate.state == "pending":
        return
    decided = [
        f"{_DECIDED[body['operation']]} at {body.get('at', '?')}"
        for _, _, body in _walk_events(engine, scope)
        if body.get("target") == candidate_id and body.get("operation") in _DECIDED
    ]
    raise OperationRefused(
        ErrorCode.ALREADY_TERMINAL,
        f"candidate {candidate_id} was already decided ({decided[-1] if decided else candidate.state})",
    ) from None


def _decide(
    engine: Kernel,
    call: Call,
    scope: Scope,
    candidate_id: str,
    decision: Literal["accept", "reject"],
    intent: str,
) -> dict[str, Any]:
    """One attempt at the operator's decision: a replay of the same one, or the candidate
    settled as a policy decision with the operator as the policy."""
    key = f"adjudicate:{candidate_id}"
    replay = engine.ledger(call, key, candidate_id, intent)
    if replay is not None:
        stored: dict[str, Any] = decode(replay.output)
        return stored
    candidate = engine.read(lambda: engine.store.candidate_get(scope, candidate_id))
    if candidate is None or candidate.state != "pending":
        raise EngramError(ErrorCode.NOT_FOUND)
    content = engine.open_candidate(call, candidate)
    return settle(
        engine,
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


def withdraw_candidate(
    engine: Kernel, scope: Scope, candidate_id: str, operator: str, reason: str
) -> dict[str, Any]:
    """The operator withdraws a pending candidate (whoever captured it) and shreds its key; the
    receipt is the agent's withdraw receipt. ``ALREADY_TERMINAL`` for a rejected or withdrawn
    candidate, ``ILLEGAL_TRANSITION`` for an admitted one, ``NOT_FOUND`` for an unknown one."""
    arguments = {"reason": _reason(reason)}

    def pending(_call: Call) -> CandidateRow:
        candidate = engine.read(lambda: engine.store.candidate_get(scope, candidate_id))
        if candidate is None:
            raise EngramError(ErrorCode.NOT_FOUND)
        if candidate.state in ("withdrawn", "rejected"):
            raise EngramError(ErrorCode.ALREADY_TERMINAL)
        if candidate.state != "pending":
            raise EngramError(ErrorCode.ILLEGAL_TRANSITION)
        return candidate

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
    """An operator's withdraw or forget: audited, its intent and authorization bound to the
    operator's arguments; each attempt finds what it moves and commits it (the agent's commit,
    with no approval: the operator is the human)."""

    def run(call: Call) -> dict[str, Any]:
        call.reason = arguments["reason"]
        intent = _operator_intent(call, target, arguments)

        def attempt() -> dict[str, Any]:
            authorized = Authorized(
                idempotency_key=f"{operation}:{target}:{call.ctx.audit_id}",
                intent=intent,
                authorization=_operator_authorization(engine, call, arguments),
            )
            return commit(engine, call, find(call), authorized)

        return engine.mutation(call, attempt)

    return audited(engine, scope, operator, operation, target, run)


def _operator_authorization(engine: Kernel, call: Call, arguments: Mapping[str, Any]) -> str:
    """The authorization receipt of an operator's decision: the operator is the human, so the
    confirmation is ``not-required``; the receipt binds the operator and the arguments."""
    return engine.authorization_receipt(call, None, {"operator_arguments": dict(arguments)})


# --------------------------------------------------------------------------------------------
# Records: what memory holds, its history, its lifecycle
# --------------------------------------------------------------------------------------------


def _readable(engine: Kernel, scope: Scope, row: RecordRow) -> dict[str, Any] | None:
    """The record's body for an operator, or None once shredded or its key destroyed."""
    return engine.bodies(scope, [row]).get(row.record_id)


def _record_summary(row: RecordRow) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "record_id": row.record_id,
        "state": row.state,
        "record_digest": row.record_digest,
        "candidate_id": row.candidate_id,
        "accepted_cursor": str(row.accepted_cursor),
        "valid_from": row.valid_from_ms,
        "valid_from_at": format_instant(row.valid_from_ms),
        "body": "present" if row.body is not None else "shredded",
    }
    if row.valid_to_ms is not None:
        summary["valid_to"] = row.valid_to_ms
        summary["valid_to_at"] = format_instant(row.valid_to_ms)
    if row.expires_at_ms is not None:
        summary["expires_at"] = format_instant(row.expires_at_ms)
    return summary


def within(at: str, since: str, until: str) -> bool:
    """Whether an ISO-8601 UTC instant falls in ``since``..``until``, each an ISO-8601 prefix
    (``2026-12``, ``2026-12-06T01``) or empty for no bound: instants sort as text."""
    return not (since and at < since) and not (until and at[: len(until)] > until)


def records_list(
    engine: Kernel,
    scope: Scope,
    operator: str,
    *,
    state: str | None = None,
    after: str = "",
    limit: int = 100,
    principal: str = "",
    since: str = "",
    until: str = "",
) -> list[dict[str, Any]]:
    """The scope's records (in ``state`` when given), in id order: ids, states and digests.

    With ``principal``, ``since`` or ``until``: only the records that principal captured and
    whose capture time is ``within`` ``since``..``until``, each row with its ``principal`` and
    ``captured_at`` (its candidate's). The store has no such query: this walks its id-ordered
    list from ``after`` and keeps the rows that match, up to ``limit``, so the last row's id
    pages on as the plain list does."""
    if state is not None and state not in (*LIFECYCLE_STATES, "tombstoned"):
        raise EngramError(ErrorCode.INVALID_SCHEMA)

    def matching(row: RecordRow) -> dict[str, Any] | None:
        candidate = engine.store.candidate_get(scope, row.candidate_id)
        who = candidate.principal if candidate is not None else ""
        at = format_instant(candidate.created_at_ms) if candidate is not None else ""
        if (principal and who != principal) or not within(at, since, until):
            return None
        return {**_record_summary(row), "principal": who, "captured_at": at}

    def filtered() -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        cursor = after
        while len(kept) < limit:
            rows = engine.store.records_list(scope, state, cursor, _PAGE)  # type: ignore[arg-type]
            kept += [shown for row in rows if (shown := matching(row)) is not None]
            if len(rows) < _PAGE:
                break
            cursor = rows[-1].record_id
        return kept[:limit]

    def run(call: Call) -> list[dict[str, Any]]:
        if principal or since or until:
            return filtered()
        rows = engine.store.records_list(scope, state, after, limit)  # type: ignore[arg-type]
        return [_record_summary(row) for row in rows]

    return audited(engine, scope, operator, "records_list", None, run)


def records_search(
    engine: Kernel,
    scope: Scope,
    operator: str,
    query: str,
    *,
    limit: int = 10,
    page_cursor: str | None = None,
) -> dict[str, Any]:
    """The agents' search for the operator: the same ranking over the scope's current records,
    the same packets (redacted as an agent sees them) and rank receipt, the same page cursors.
    ``INVALID_SCHEMA`` for a query or cursor the search tool would refuse."""
    try:
        args = SearchInput.model_validate(
            {
                "query": query,
                "purpose_ref": OPERATIONS_PURPOSE,
                "limit": limit,
                **({"page_cursor": page_cursor} if page_cursor else {}),
            }
        )
    except ValidationError:
        raise EngramError(ErrorCode.INVALID_SCHEMA) from None
    return audited(
        engine,
        scope,
        operator,
        "records_search",
        None,
        lambda call: agent_search(engine, call, args),
    )


def record_show(engine: Kernel, scope: Scope, record_id: str, operator: str) -> dict[str, Any]:
    """One record for the operator, in any state: its row and its body (``None`` once
    forgotten). Audited; ``NOT_FOUND`` for a record the scope does not hold."""

    def run(call: Call) -> dict[str, Any]:
        row = engine.read(lambda: engine.store.record_get(scope, record_id))
        if row is None:
            raise EngramError(ErrorCode.NOT_FOUND)
        call.digests["record_digest"] = row.record_digest
        return {**_record_summary(row), "record": _readable(engine, scope, row)}

    return audited(engine, scope, operator, "records_show", record_id, run)


def _walk_events(engine: Kernel, scope: Scope) -> Iterator[tuple[int, str, dict[str, Any]]]:
    after = 0
    while True:
        events = engine.store.events(scope, after, _PAGE)
        if not events:
            return
        for event in events:
            yield event.cursor, event.event_hash, decode(event.body)
        after = events[-1].cursor


def record_history(
    engine: Kernel, scope: Scope, record_id: str, operator: str
) -> list[dict[str, Any]]:
    """The journal events of one record, oldest first: its candidate's capture and admission,
    then every transition. Events hold ids and digests only."""

    def run(call: Call) -> list[dict[str, Any]]:
        row = engine.read(lambda: engine.store.record_get(scope, record_id))
        if row is None:
            raise EngramError(ErrorCode.NOT_FOUND)
        targets = {record_id, row.candidate_id}
        steps = [
            (cursor, {**body, "event_id": event_id_for(event_hash), "event_hash": event_hash})
            for cursor, event_hash, body in _walk_events(engine, scope)
            if body.get("target") in targets
        ]
        return _with_actors(engine, scope, steps)

    return audited(engine, scope, operator, "records_history", record_id, run)


def _with_actors(
    engine: Kernel, scope: Scope, steps: list[tuple[int, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Each step with who committed it (``actor``: the agent's principal, or
    ``operator:<login>``) and the operator's reason, from its ledger entry; None where the
    store cannot say (``ports.LedgerByCursor``)."""
    store = engine.store
    ledger = (
        store.ledger_at(scope, [cursor for cursor, _ in steps])
        if isinstance(store, LedgerByCursor)
        else {}
    )
    shown = []
    for cursor, step in steps:
        entry = ledger.get(cursor)
        output = decode(entry.output) if entry is not None else {}
        reason = output.get("reason") if isinstance(output, dict) else None
        actor = entry.principal if entry is not None else None
        shown.append({**step, "actor": actor, "reason": reason})
    return shown


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

    def run(call: Call) -> dict[str, Any]:
        call.reason = arguments["reason"]
        intent = _operator_intent(call, record_id, arguments)
        authorization = _operator_authorization(engine, call, arguments)

        def attempt() -> dict[str, Any]:
            row = engine.record_leaving(scope, record_id, sources)
            if superseded_by is not None:
                successor = engine.read(lambda: engine.store.record_get(scope, superseded_by))
                if successor is None or successor.state != "accepted_current":
                    raise EngramError(ErrorCode.NOT_FOUND)
            authorized = Authorized(
                idempotency_key=f"{operation}:{record_id}:{call.ctx.audit_id}",
                intent=intent,
                authorization=authorization,
            )
            return commit_lifecycle(engine, call, row, operation, authorized, superseded_by)

        return engine.mutation(call, attempt)

    return audited(engine, scope, operator, operation, record_id, run)


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
# Status and export
# --------------------------------------------------------------------------------------------


def status(engine: Kernel, scope: Scope, operator: str, *, full: bool = False) -> dict[str, Any]:
    """What an operator checks first: counts by state, the outbox backlog, whether the indexes
    hold every current record (and nothing else is pending for them), and the key store's
    health: whether the pending candidates and the record bodies open (``readability``; the
    first ``HEALTH_SAMPLE`` of each, or all with ``full``)."""

    def run(call: Call) -> dict[str, Any]:
        counts = engine.store.state_counts(scope)
        head = engine.store.head(scope)
        try:
            checked, missing, without_key = _missing_from_index(engine, scope)
        except IndexUnavailable:  # e.g. the cloud operator's seat: the drainer writes the index
            checked, missing, without_key = 0, None, None
        pending = bool(
            counts.get("outbox:upsert_projection", 0) or counts.get("outbox:drop_projection", 0)
        )
        return {
            "scope": {"tenant_id": scope.tenant_id, "workspace_id": scope.workspace_id},
            "journal": {"head_cursor": str(head.cursor), "head_event_hash": head.event_hash},
            "candidates": _by_prefix(counts, "candidate:"),
            "records": _by_prefix(counts, "record:"),
            "outbox": _by_prefix(counts, "outbox:"),
            "index": {
                "surfaces": [surface.name for surface in engine.surfaces],
                "reachable": missing is not None,
                "current_records_checked": checked,
                "missing_from_index": missing,
                "current_records_without_key": without_key,
                "pending_upserts": counts.get("outbox:upsert_projection", 0),
                "pending_drops": counts.get("outbox:drop_projection", 0),
                "fresh": None if missing is None else missing == 0 and not pending,
            },
            "key_store": readability(engine, call, full=full),
        }

    return audited(engine, scope, operator, "status", None, run)


def _missing_from_index(engine: Kernel, scope: Scope) -> tuple[int, int, int]:
    """How many current records were checked, how many some index does not hold, and how many
    of those are not indexed because their key is destroyed (forgotten since a restored backup
    was taken: right, not stale)."""
    missing = without_key = checked = 0
    for row in _scanned(
        lambda after: engine.store.records_list(scope, "accepted_current", after, _PAGE),
        "record_id",
    ):
        checked += 1
        if row.body is not None and not all(
            surface.contains(scope, row.record_id) for surface in engine.surfaces
        ):
            if _key_held(engine, scope, row.record_id):
                missing += 1
            else:
                without_key += 1
    return checked, missing, without_key


def _scanned(
    page: Callable[[str], Sequence[Any]], id_field: str, limit: int | None = _STATUS_SCAN_LIMIT
) -> Iterator[Any]:
    """The rows ``page(after)`` lists, page after page, at most ``limit`` (``None``: all): the
    status is a bounded look unless asked for a full scan."""
    after, seen = "", 0
    while (limit is None or seen < limit) and (rows := page(after)):
        for row in rows:
            if limit is not None and seen >= limit:
                return
            seen += 1
            yield row
        after = getattr(rows[-1], id_field)


def _key_held(engine: Kernel, scope: Scope, record_id: str) -> bool:
    """Whether the record's key exists (when the key store cannot say: assume it does)."""
    try:
        return engine.record_keys.key_exists(scope, record_id)
    except VaultUnavailable:
        return True


def _by_prefix(counts: Mapping[str, int], prefix: str) -> dict[str, int]:
    return {
        name.removeprefix(prefix): count
        for name, count in sorted(counts.items())
        if name.startswith(prefix)
    }


def readability(engine: Kernel, call: Call, *, full: bool = False) -> dict[str, Any]:
    """Whether what ``call``'s scope holds can be read: each pending candidate opened (its key
    unwrapped, its blob decrypted and checked against its digests) and each record body not
    forgotten opened and checked — the first ``HEALTH_SAMPLE`` of each, or all with ``full``.
    The unreadable ones are named by id with the code a tool would answer (never content):
    ``BLOB_MISSING`` for a candidate whose key is destroyed, ``JOURNAL_CORRUPT`` for one that
    does not open (e.g. wrapped under another master key). A record whose key is destroyed
    (forgotten since a restored backup was taken) is counted apart: right, not broken.

    ``health``: ``ok``; ``keys_missing`` (only destroyed candidate keys); ``unreadable``;
    ``unavailable`` (the key store cannot be read)."""
    limit = None if full else HEALTH_SAMPLE
    scope = call.scope
    unreadable: list[dict[str, str]] = []
    try:
        pending = records = without_key = 0
        for row in _scanned(
            lambda after: engine.store.candidates_list(scope, "pending", after, _PAGE),
            "candidate_id",
            limit,
        ):
            pending += 1
            if (code := _candidate_unreadable(engine, call, row)) is not None:
                unreadable.append({"candidate_id": row.candidate_id, "code": code})
        for record in _scanned(
            lambda after: engine.store.records_list(scope, None, after, _PAGE), "record_id", limit
        ):
            if record.body is None:
                continue  # forgotten: its body is shredded, as it should be
            records += 1
            try:
                if not engine.bodies(scope, [record]):
                    without_key += 1
            except EngramError as error:
                unreadable.append({"record_id": record.record_id, "code": error.code.value})
    except (VaultUnavailable, StoreUnavailable):
        return {"health": "unavailable"}
    if any(item["code"] == ErrorCode.STORE_UNAVAILABLE.value for item in unreadable):
        return {"health": "unavailable"}
    missing = all(item["code"] == ErrorCode.BLOB_MISSING.value for item in unreadable)
    return {
        "health": "ok" if not unreadable else "keys_missing" if missing else "unreadable",
        "checked": "all" if full else f"the first {HEALTH_SAMPLE} of each (--full: all)",
        "pending_checked": pending,
        "records_checked": records,
        "records_without_key": without_key,
        "unreadable": unreadable[:_UNREADABLE_LISTED],
        "unreadable_total": len(unreadable),
    }


def _candidate_unreadable(engine: Kernel, call: Call, row: CandidateRow) -> str | None:
    """The code a pending candidate would answer if opened now, or None when it opens."""
    try:
        engine.open_candidate(call, row)
    except EngramError as error:
        return error.code.value
    except (KeyError, TypeError, ValueError):  # opened, but not a candidate's document
        return ErrorCode.JOURNAL_CORRUPT.value
    return None


def unreadable_line(health: Mapping[str, Any]) -> str | None:
    """One line naming what ``readability`` found unreadable (ids and codes), or None."""
    if health.get("health") == "unavailable":
        return "the key store cannot be read (keys/candidate-keys.db)"
    items = health.get("unreadable") or []
    if not items:
        return None
    named = ", ".join(
        f"{item.get('candidate_id') or item.get('record_id')} ({item['code']})" for item in items
    )
    more = int(health.get("unreadable_total", len(items))) - len(items)
    return f"{health['unreadable_total']} unreadable: {named}" + (
        f" and {more} more" if more else ""
    )


def export_records(engine: Kernel, scope: Scope, operator: str) -> Iterator[dict[str, Any]]:
    """The scope's current records with their receipts, one object per record (JSON Lines for
    a migration to another host): the record as stored (its own digests bind it) and the
    journal event that admitted it. Only what search and get may reveal is exported: current
    records in their valid time and unexpired (CONTRACT.md §4)."""

    def run(call: Call) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        after = ""
        while True:
            rows = engine.store.records_list(scope, "accepted_current", after, _PAGE)
            if not rows:
                break
            after = rows[-1].record_id
            current = [row for row in rows if engine.eligible(row, call.now_ms)]
            # A record whose key is destroyed (restored from a backup older than its forget) is
            # forgotten: not exported.
            opened = engine.bodies(scope, current)
            for row in current:
                if row.record_id in opened:
                    lines.append(
                        {
                            "record": opened[row.record_id],
                            "receipts": _admission(engine, scope, row),
                        }
                    )
            progress(len(lines), None, "records exported")
        call.digests["exported_records"] = str(len(lines))
        return lines

    yield from audited(engine, scope, operator, "export", None, run)


def _admission(engine: Kernel, scope: Scope, row: RecordRow) -> dict[str, Any]:
    """The admission receipt of a record: the journal event at its ``accepted_cursor``."""
    events = engine.store.events(scope, row.accepted_cursor - 1, 1)
    if not events or events[0].cursor != row.accepted_cursor:
        raise EngramError(ErrorCode.CURSOR_GAP)
    event = events[0]
    body = decode(event.body)
    if body.get("operation") != "admit" or body.get("target") != row.candidate_id:
        raise EngramError(ErrorCode.JOURNAL_CORRUPT)
    return {
        "admission": {
            "event_id": event_id_for(event.event_hash),
            "cursor": str(event.cursor),
            "event_hash": event.event_hash,
            "at": body["at"],
            **body["digests"],
        }
    }


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
        engine.read(lambda: engine.store.revoke_credentials(tenant_id, kind, value, call.now_ms))
        crash_point("revoke.written")
        return {"revoked": kind, kind: value, "at": format_instant(call.now_ms)}

    return audited(engine, Scope(tenant_id, "*"), operator, "revoke", f"{kind}:{value}", run)


def verify_all(engine: Kernel) -> dict[str, int]:
    """Verify every scope's journal (dense cursors, unbroken hash chain); the head cursor of
    each, by ``tenant/workspace``. Raises ``CURSOR_GAP`` or ``JOURNAL_CORRUPT``."""
    return {
        f"{scope.tenant_id}/{scope.workspace_id}": verify_journal(engine.store, scope).cursor
        for scope in engine.read(engine.store.scopes)
    }


_REINDEX_PAGE = 100


@dataclass(frozen=True, slots=True)
class ReindexReport:
    """What ``reindex`` did: records projected, forgotten records dropped, outbox items left."""

    indexed: int
    dropped: int
    pending_upserts: int

    def as_dict(self) -> dict[str, int]:
        return {
            "indexed": self.indexed,
            "dropped": self.dropped,
            "pending_upserts": self.pending_upserts,
        }


def reindex(engine: Kernel, scope: Scope) -> ReindexReport:
    """Rebuild ``scope``'s projections (lexical, and vectors with a semantic channel) from the
    canonical store: after a lost or corrupted index, or to repair one an operator distrusts.

    Walks the scope's journal: every admitted candidate's record is projected again from its
    body in the store (an upsert, idempotent), and every record without a body (forgotten) is
    dropped, so nothing forgotten survives in the index. Then the scope's pending projection
    upserts run, which they now can. Safe beside live traffic: admissions during the walk
    project themselves, and a forget racing an upsert is caught by its re-check. Raises
    ``STORE_UNAVAILABLE`` or ``RANKING_UNAVAILABLE`` (an index that cannot be written); running
    it again after a failure is safe.
    """
    indexed = dropped = 0
    after = 0
    try:
        while True:
            events = engine.store.events(scope, after, _REINDEX_PAGE)
            if not events:
                break
            after = events[-1].cursor
            admitted = [
                body["target"]
                for body in (decode(event.body) for event in events)
                if body.get("operation") == "admit"
            ]
            record_ids = []
            for candidate_id in admitted:
                candidate = engine.store.candidate_get(scope, candidate_id)
                if candidate is not None:
                    record_ids.append(candidate.record_id)
            rows = engine.store.records_get(scope, record_ids)
            for record_id in record_ids:
                if engine.project(scope, record_id, rows.get(record_id), engine.surfaces):
                    indexed += 1
                else:
                    dropped += 1
        pending = engine.drain_scope(scope, "upsert_projection")
    except (StoreUnavailable, VaultUnavailable):
        raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
    except IndexUnavailable:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
    return ReindexReport(indexed=indexed, dropped=dropped, pending_upserts=pending)

"""What an operator looks at: the audited reads of the operator plane, for both hosts.

- candidates: ``pending_list`` (why each waits, and its first line), ``pending_show`` (opens the
  sealed candidate for the operator, with the records it near-duplicates);
- records: ``records_list``, ``records_search`` (the agents' search and ranking),
  ``record_show``, ``record_history``;
- health: ``status`` (counts, the outbox, the indexes, ``readability`` of the key store);
- ``export_records``: the current records with their admission receipts.

Each takes the engine, the scope and the operator's identity and is audited (``auditing``); the
store is read through the engine (``engine.usecases.inspection``), never directly.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import SearchInput
from engram_memory.contract.types import (
    CANDIDATE_ID_PATTERN,
    RECORD_ID_PATTERN,
    format_instant,
)
from engram_memory.engine.context import Scope
from engram_memory.engine.journal import event_id_for
from engram_memory.engine.kernel import Call, Kernel
from engram_memory.engine.ports import (
    AdmissionRequest,
    CandidateRow,
    IndexUnavailable,
    PolicyDecision,
    PolicyUnavailable,
    RecordRow,
    VaultUnavailable,
)
from engram_memory.engine.records import decode, record_text
from engram_memory.engine.usecases import inspection as canonical
from engram_memory.engine.usecases.admission import forgotten, neighbours
from engram_memory.engine.usecases.reads import search as agent_search
from engram_memory.engine.usecases.transitions import LIFECYCLE_STATES
from engram_memory.operator_plane.auditing import OPERATIONS_PURPOSE, audited
from engram_memory.operator_plane.backup_checks import OperationRefused
from engram_memory.operator_plane.text import cell, progress

_PAGE: Final = 500
_STATUS_SCAN_LIMIT: Final = 10_000  # records and candidates status checks one by one, at most
# Pending candidates and record bodies the health check opens by default (each kind); --full: all
HEALTH_SAMPLE: Final = 1_000
_UNREADABLE_LISTED: Final = 50
EXCERPT_CHARS: Final = 120  # a listed record's text: its first line, at most this long
# The operations this module audits: reads that change nothing (the console's page views among
# them), told apart from an operator's decisions in the audit log by these names.
READ_OPERATIONS: Final = frozenset(
    {
        "pending_list",
        "pending_show",
        "records_list",
        "records_search",
        "records_show",
        "records_history",
        "status",
        "export",
    }
)


# --------------------------------------------------------------------------------------------
# Candidates: what waits, what it says
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
    """The scope's pending candidates (captured, not yet admitted, rejected or withdrawn), in id
    order, each opened for the operator as ``pending_show`` opens one (an audited action; the
    audit line names no candidate and no content): why it waits (``waiting``: ``held`` by the
    admission policy for a human's decision, with what held it in ``held_for``; or ``not
    submitted``: captured and never admitted, or asked and not decided) and its text's first
    line (``first_line``)."""

    def run(call: Call) -> list[dict[str, Any]]:
        rows = canonical.candidates(engine, scope, "pending", after, limit)
        return [_waiting(engine, call, row) for row in rows]

    return audited(engine, scope, operator, "pending_list", None, run)


FIRST_LINE_CHARS: Final = 120


def _waiting(engine: Kernel, call: Call, row: CandidateRow) -> dict[str, Any]:
    """One pending candidate of the list: its summary, why it waits and its first line."""
    try:
        content: Mapping[str, Any] | None = engine.open_candidate(call, row)
    except (EngramError, VaultUnavailable):
        content = None  # its key gone or unreachable: the status check (readability) says so
    return {
        **_candidate_summary(row),
        "waiting": "not submitted" if row.held is None else "held",
        "held_for": None if row.held is None else _held_for(engine, call, row, content),
        "first_line": "(cannot be opened)" if content is None else _first_line(content["record"]),
    }


def _first_line(record: Mapping[str, Any]) -> str:
    """The first non-blank line of a record's text, cut to ``FIRST_LINE_CHARS``."""
    lines = (line.strip() for line in record_text(record).splitlines())
    first = next((line for line in lines if line), "")
    return first if len(first) <= FIRST_LINE_CHARS else first[: FIRST_LINE_CHARS - 1] + "…"


def _held_for(
    engine: Kernel, call: Call, row: CandidateRow, content: Mapping[str, Any] | None
) -> str:
    """What held a candidate for a human, as the engine's guard and the policy see it now (the
    hold keeps the decision's digest, not its rule): forgotten content, a near-duplicate of the
    records it names, or the rule that asked for adjudication."""
    if forgotten(engine, call.scope, row.payload_digest):
        return "forgotten before (the tombstone guard)"
    decision = None if content is None else _decision(engine, call, row, content)
    if decision is None:
        return "the policy's reason cannot be checked now"
    if decision.rule == "near-duplicate" and decision.resembles:
        return "near-duplicate of " + ", ".join(decision.resembles)
    if decision.rule == "manual":
        return "adjudication required (manual admission)"
    if decision.rule.startswith("secret:"):
        return f"secret ({decision.rule.removeprefix('secret:')})"
    if decision.decision == "adjudication_required":
        return f"adjudication required ({decision.rule})"
    return f"the policy would now {decision.decision} it ({decision.rule})"


def pending_show(engine: Kernel, scope: Scope, candidate_id: str, operator: str) -> dict[str, Any]:
    """A pending candidate opened for the operator: the record it would become, its evidence,
    and the current records of the scope it near-duplicates (``resembles``, as the admission
    policy sees them now: why a capture was held). Audited (the audit line names the candidate,
    never its content); ``NOT_FOUND`` for anything but a pending candidate of the scope."""

    def run(call: Call) -> dict[str, Any]:
        candidate = canonical.candidate(engine, scope, candidate_id)
        if candidate is None or candidate.state != "pending":
            raise EngramError(ErrorCode.NOT_FOUND)
        content = engine.open_candidate(call, candidate)
        call.digests["record_digest"] = candidate.record_digest
        decision = _decision(engine, call, candidate, content)
        return {
            "candidate": _candidate_summary(candidate),
            "record": content["record"],
            "evidence": content["evidence"],
            "resembles": list(decision.resembles) if decision is not None else [],
        }

    return audited(engine, scope, operator, "pending_show", candidate_id, run)


def _decision(
    engine: Kernel, call: Call, candidate: CandidateRow, content: Mapping[str, Any]
) -> PolicyDecision | None:
    """What the admission policy would decide on the candidate now, with the records its
    near-duplicate rule names (``resembles``); None when it cannot decide right now (a policy
    or an index down)."""
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
        return engine.policy.decide(request)
    except PolicyUnavailable:
        return None
    except EngramError as error:
        if error.code not in (ErrorCode.RANKING_UNAVAILABLE, ErrorCode.PROJECTION_STALE):
            raise
        return None


# --------------------------------------------------------------------------------------------
# Records: what memory holds, its history
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


def _opened(engine: Kernel, scope: Scope, rows: list[RecordRow]) -> dict[str, dict[str, Any]]:
    """The bodies of ``rows`` that open (one key-store read; one by one when one of them does
    not, so a single unreadable body leaves the others listed)."""
    try:
        return engine.bodies(scope, rows)
    except EngramError:
        opened: dict[str, dict[str, Any]] = {}
        for row in rows:
            with contextlib.suppress(EngramError):
                opened.update(engine.bodies(scope, [row]))
        return opened


def excerpt(record: Mapping[str, Any] | None) -> dict[str, str] | None:
    """What a list shows of a record's body: the primary component's first line (cut at a word
    within ``EXCERPT_CHARS``), its kind and the source of its first citation; None without a
    body."""
    if not record:
        return None
    components = record.get("components") or [{}]
    primary = next(
        (c for c in components if c.get("component_id") == record.get("primary_component_id")),
        components[0],
    )
    text = str(primary.get("text", "")).strip()
    line = text.splitlines()[0].strip() if text else ""
    if len(line) > EXCERPT_CHARS or line != text:
        cut = line[:EXCERPT_CHARS].rsplit(" ", 1)[0] if len(line) > EXCERPT_CHARS else line
        line = cut.rstrip(" ,;:.") + "…"
    cited = set(primary.get("citation_ids") or ())
    citations = record.get("citations") or []
    source = next((c for c in citations if c.get("citation_id") in cited), None)
    source = source or (citations[0] if citations else {})
    return {
        "text": line,
        "kind": str(primary.get("kind", "")),
        "source": str(source.get("source_ref", "")),
    }


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
    with_text: bool = False,
) -> list[dict[str, Any]]:
    """The scope's records (in ``state`` when given), in id order: ids, states and digests.

    With ``principal``, ``since`` or ``until``: only the records that principal captured and
    whose capture time is ``within`` ``since``..``until``, each row with its ``principal`` and
    ``captured_at`` (its candidate's). The store has no such query: this walks its id-ordered
    list from ``after`` and keeps the rows that match, up to ``limit``, so the last row's id
    pages on as the plain list does.

    With ``with_text`` (the console's list), every row has its ``principal`` and
    ``captured_at`` too, and its ``excerpt``: the text's first line, kind and source while its
    body opens, as ``record_show`` opens it (a forgotten record's is shredded: none)."""
    if state is not None and state not in (*LIFECYCLE_STATES, "tombstoned"):
        raise EngramError(ErrorCode.INVALID_SCHEMA)

    def matching(row: RecordRow) -> dict[str, Any] | None:
        candidate = canonical.candidate(engine, scope, row.candidate_id)
        who = candidate.principal if candidate is not None else ""
        at = format_instant(candidate.created_at_ms) if candidate is not None else ""
        if (principal and who != principal) or not within(at, since, until):
            return None
        return {**_record_summary(row), "principal": who, "captured_at": at}

    def filtered() -> list[tuple[RecordRow, dict[str, Any]]]:
        kept: list[tuple[RecordRow, dict[str, Any]]] = []
        cursor = after
        while len(kept) < limit:
            rows = canonical.records(engine, scope, state, cursor, _PAGE)  # type: ignore[arg-type]
            kept += [(row, shown) for row in rows if (shown := matching(row)) is not None]
            if len(rows) < _PAGE:
                break
            cursor = rows[-1].record_id
        return kept[:limit]

    def run(call: Call) -> list[dict[str, Any]]:
        if not (principal or since or until or with_text):
            rows = canonical.records(engine, scope, state, after, limit)  # type: ignore[arg-type]
            return [_record_summary(row) for row in rows]
        kept = filtered()
        if not with_text:
            return [shown for _, shown in kept]
        opened = _opened(engine, scope, [row for row, _ in kept])
        call.digests["bodies_opened"] = str(len(opened))
        return [{**shown, "excerpt": excerpt(opened.get(row.record_id))} for row, shown in kept]

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
        row = canonical.record(engine, scope, record_id)
        if row is None:
            raise EngramError(ErrorCode.NOT_FOUND)
        call.digests["record_digest"] = row.record_digest
        return {**_record_summary(row), "record": _readable(engine, scope, row)}

    return audited(engine, scope, operator, "records_show", record_id, run)


def record_history(
    engine: Kernel, scope: Scope, target_id: str, operator: str
) -> list[dict[str, Any]]:
    """The journal events of one record — its candidate's capture and admission, then every
    transition — or of one candidate (a withdrawn one: its capture and withdraw), oldest first.
    Events hold ids and digests, and for each step who committed it (``actor``), why
    (``reason``: the agent's ``reason_ref`` or the operator's reason) and who approved an
    agent's withdraw or forget (``approved_by``); ``NOT_RECORDED`` where an older event of such
    a step did not keep them. ``NOT_FOUND`` for an id the scope does not hold."""

    def run(call: Call) -> list[dict[str, Any]]:
        row = canonical.record(engine, scope, target_id)
        candidate = None if row is not None else canonical.candidate(engine, scope, target_id)
        if row is not None:
            targets = {target_id, row.candidate_id}
        elif candidate is not None:
            targets = {target_id, candidate.record_id}
        else:
            raise EngramError(ErrorCode.NOT_FOUND)
        steps = [
            (
                event.cursor,
                {
                    **body,
                    "event_id": event_id_for(event.event_hash),
                    "event_hash": event.event_hash,
                },
            )
            for event, body in canonical.journal(engine, scope)
            if body.get("target") in targets
        ]
        return _with_actors(engine, scope, steps)

    return audited(engine, scope, operator, "records_history", target_id, run)


# What a record's history shows for an agent's withdraw or forget whose event was journaled
# before events kept the reason and the approver (``journal.WHY_FIELDS``).
NOT_RECORDED: Final = "not recorded"
_APPROVED_STEPS: Final = frozenset({"withdraw", "tombstone"})


def _with_actors(
    engine: Kernel, scope: Scope, steps: list[tuple[int, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Each step with who committed it (``actor``: the agent's principal, or
    ``operator:<login>``), why (``reason``) and who approved it (``approved_by``): from the
    event (``journal.WHY_FIELDS``), else from its ledger entry (an event written before them;
    None where the store cannot say: ``ports.LedgerByCursor``)."""
    ledger = canonical.ledger_at(engine, scope, [cursor for cursor, _ in steps])
    shown = []
    for cursor, step in steps:
        entry = ledger.get(cursor)
        output = decode(entry.output) if entry is not None else {}
        actor = step.get("by") or (entry.principal if entry is not None else None)
        reason = step.get("reason_ref") or step.get("reason")
        if reason is None and isinstance(output, dict):
            reason = output.get("reason")
        approved_by = step.get("approved_by")
        if step.get("operation") in _APPROVED_STEPS and not str(actor).startswith("operator:"):
            # an agent's: a human approved it, but an older event does not say who nor why
            reason, approved_by = reason or NOT_RECORDED, approved_by or NOT_RECORDED
        shown.append({**step, "actor": actor, "reason": reason, "approved_by": approved_by})
    return shown


# --------------------------------------------------------------------------------------------
# Status and export
# --------------------------------------------------------------------------------------------


def status(engine: Kernel, scope: Scope, operator: str, *, full: bool = False) -> dict[str, Any]:
    """What an operator checks first: counts by state, the outbox backlog, whether the indexes
    hold every current record (and nothing else is pending for them), and the key store's
    health: whether the pending candidates and the record bodies open (``readability``; the
    first ``HEALTH_SAMPLE`` of each, or all with ``full``)."""

    def run(call: Call) -> dict[str, Any]:
        counts = canonical.state_counts(engine, scope)
        head = canonical.head(engine, scope)
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
        lambda after: canonical.records(engine, scope, "accepted_current", after, _PAGE),
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
            lambda after: canonical.candidates(engine, scope, "pending", after, _PAGE),
            "candidate_id",
            limit,
        ):
            pending += 1
            if (code := _candidate_unreadable(engine, call, row)) is not None:
                unreadable.append({"candidate_id": row.candidate_id, "code": code})
        for record in _scanned(
            lambda after: canonical.records(engine, scope, None, after, _PAGE), "record_id", limit
        ):
            if record.body is None:
                continue  # forgotten: its body is shredded, as it should be
            records += 1
            try:
                if not engine.bodies(scope, [record]):
                    without_key += 1
            except EngramError as error:
                unreadable.append({"record_id": record.record_id, "code": error.code.value})
    except VaultUnavailable:
        return {"health": "unavailable"}
    except EngramError as error:  # a page of candidates or records could not be read
        if error.code is not ErrorCode.STORE_UNAVAILABLE:
            raise
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
            rows = canonical.records(engine, scope, "accepted_current", after, _PAGE)
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
    events = canonical.events(engine, scope, row.accepted_cursor - 1, 1)
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


# --------------------------------------------------------------------------------------------
# What the operator named, when it is not there
# --------------------------------------------------------------------------------------------

# kind -> (its id's pattern, what such an id looks like)
_ID_FORMS: Final = {
    "record": (RECORD_ID_PATTERN, "mem_ and lower-case letters and digits 2-7"),
    "candidate": (CANDIDATE_ID_PATTERN, "candidate_ and 64 hex digits"),
}


def workspaces(engine: Kernel, tenant_id: str) -> list[str]:
    """The workspaces of ``tenant_id`` whose journal holds anything (a capture, a record)."""
    return [
        scope.workspace_id for scope in canonical.scopes(engine) if scope.tenant_id == tenant_id
    ]


def not_found(engine: Kernel, scope: Scope, kind: str, target_id: str) -> OperationRefused | None:
    """``NOT_FOUND`` for the operator, saying why ``kind`` (``record``, ``candidate``)
    ``target_id`` is not in ``scope``: a malformed id, another workspace's, a candidate no
    longer pending, or unknown here. An agent's ``NOT_FOUND`` says none of this (unknown and
    foreign are alike to it); the operator sees the whole host. ``None`` when it is there."""
    pattern, form = _ID_FORMS[kind]
    named = f"{kind} {cell(target_id)}"
    if re.fullmatch(pattern, target_id) is None:
        return OperationRefused(
            ErrorCode.NOT_FOUND, f"{cell(target_id)} is not a {kind} id ({form})"
        )

    def held(where: Scope) -> CandidateRow | RecordRow | None:
        if kind == "record":
            return canonical.record(engine, where, target_id)
        return canonical.candidate(engine, where, target_id)

    row = held(scope)
    if isinstance(row, CandidateRow) and row.state != "pending":
        return OperationRefused(ErrorCode.NOT_FOUND, f"{named} is not pending: it is {row.state}")
    if row is not None:
        return None
    for other in workspaces(engine, scope.tenant_id):
        if other != scope.workspace_id and held(Scope(scope.tenant_id, other)) is not None:
            return OperationRefused(
                ErrorCode.NOT_FOUND,
                f"{named} is not in workspace {cell(scope.workspace_id)}: it is in workspace"
                f" {cell(other)} (add --workspace {cell(other)})",
            )
    return OperationRefused(ErrorCode.NOT_FOUND, f"no {named} in any workspace of this host")

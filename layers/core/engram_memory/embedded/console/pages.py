"""The console's pages: each reads or acts through the operator plane's use cases
(``operator_plane.inspection``, ``decisions``) on an ``OperatorSeat`` opened for the signed-in
operator, and answers a template and its values (``Page``) or where to go next (``Redirect``).

They run in a worker thread (the engine is synchronous); the HTTP side (sign-in, CSRF, headers)
is ``console.app``'s.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple, cast
from urllib.parse import urlencode

from engram_memory.approval_page import memory_from_record
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.types import format_instant
from engram_memory.embedded.book_channel import outcome_line
from engram_memory.embedded.data_dir import BACKUP_SUFFIX, backups_path
from engram_memory.engine.kernel import RECORD_STATES_FORGETTABLE
from engram_memory.engine.usecases.transitions import (
    LIFECYCLE,
    LIFECYCLE_STATES,
    LifecycleOperation,
)
from engram_memory.operator_plane import decisions, inspection
from engram_memory.operator_plane.auditing import audited, operator_principal
from engram_memory.operator_plane.commands import DEFAULT_WORKSPACE

if TYPE_CHECKING:
    from engram_memory.adapters.local.approval_book import OpenApproval
    from engram_memory.embedded.book_channel import EmbeddedApprovals
    from engram_memory.embedded.console.sessions import Session
    from engram_memory.engine.context import Scope
    from engram_memory.engine.kernel import Kernel
    from engram_memory.operator_plane.seat import OperatorSeat

PAGE_SIZE: Final = 25
AUDIT_PAGE_SIZE: Final = 50
ACTIVITY_HOURS: Final = 24
ACTIVITY_ENTRIES: Final = 20_000  # the overview's chart counts the most recent audit entries
RECORD_STATES: Final = (*LIFECYCLE_STATES, "tombstoned")
# The record actions the page offers, in the order it shows them: the §4 lifecycle and forget.
ACTIONS: Final = (*LIFECYCLE, "forget")
ACTION_LABELS: Final = {
    "dispute": "Dispute",
    "resolve": "Resolve the dispute",
    "supersede": "Supersede",
    "expire": "Expire",
    "trust_invalidate": "Invalidate trust",
    "forget": "Forget",
}


@dataclass(frozen=True, slots=True)
class Page:
    template: str
    values: Mapping[str, Any]
    status: int = 200


class Redirect(NamedTuple):
    """Where the browser goes next: a 303 after a form's POST (no page re-sent on reload)."""

    location: str


@dataclass(frozen=True, slots=True)
class Ask:
    """One request as a page sees it: who asks, and what they sent."""

    session: Session
    seat: OperatorSeat
    approvals: EmbeddedApprovals
    now_ms: int
    data_dir: Path
    query: Mapping[str, str] = field(default_factory=dict)
    path: Mapping[str, str] = field(default_factory=dict)
    form: Mapping[str, str] = field(default_factory=dict)

    @property
    def workspace(self) -> str:
        chosen = self.form.get("workspace") or self.query.get("workspace") or DEFAULT_WORKSPACE
        return chosen.strip() or DEFAULT_WORKSPACE

    def run(self, use_case: Callable[[Kernel, Scope, str], Any], *, mutates: bool = False) -> Any:
        return self.seat.call(self.workspace, use_case, mutates=mutates)


Answer = Page | Redirect


def link(path: str, **params: str | None) -> str:
    """``/console{path}`` with its non-empty query parameters."""
    shown = {name: value for name, value in params.items() if value}
    return "/console" + path + (("?" + urlencode(shown)) if shown else "")


def overview(ask: Ask) -> Answer:
    status = ask.run(lambda e, s, op: inspection.status(e, s, op))
    health = inspection.unreadable_line(status["key_store"])
    hours = activity(ask.seat.audit(ACTIVITY_ENTRIES).entries, ask.now_ms)
    peak = max(1, *(hour["calls"] for hour in hours))
    return Page(
        "overview.html",
        {
            "status": status,
            "approvals_waiting": len(ask.approvals.pending()),
            "health": health,
            "index_fresh": status["index"]["fresh"],
            "index_words": _index_words(status["index"]),
            "key_store_words": _key_store_words(status["key_store"]),
            "activity": hours,
            "activity_peak": peak,
            "activity_ticks": sorted({0, peak // 2, peak}),
        },
    )


def _index_words(index: Mapping[str, Any]) -> str:
    """The search index's freshness in words (the status document's ``fresh`` is a boolean, or
    None when the index cannot be reached)."""
    if index["fresh"] is None:
        return "not reachable"
    return "fresh" if index["fresh"] else "stale"


KEY_STORE_HEALTH: Final = {
    "ok": "health ok",
    "keys_missing": "keys missing",
    "unreadable": "unreadable",
    "unavailable": "unavailable: the key store cannot be read",
}


def _key_store_words(health: Mapping[str, Any]) -> str:
    """The key store's health in words, and what was opened to say so."""
    state = str(health.get("health", ""))
    words = KEY_STORE_HEALTH.get(state, state)
    if state in ("unreadable", "keys_missing"):
        words = f"{health.get('unreadable_total', 0)} {words}"
    if "pending_checked" not in health:
        return words
    return (
        f"{words} — opened {health['pending_checked']} pending candidate(s) and"
        f" {health['records_checked']} record bodies"
        f" (the first {inspection.HEALTH_SAMPLE} of each at most)"
    )


def records(ask: Ask) -> Answer:
    """Search (the agents' ranking and its receipt), or the list by state with paging."""
    query = ask.query.get("q", "").strip()
    if query:
        found = ask.run(
            lambda e, s, op: inspection.records_search(
                e, s, op, query, limit=PAGE_SIZE, page_cursor=ask.query.get("cursor") or None
            )
        )
        hits = [
            {
                "record_id": packet["record"].get("record_id", ""),
                "rank": packet["rank"],
                "score": packet["score"],
                "excerpt": inspection.excerpt(packet["record"]),
            }
            for packet in found["records"]
        ]
        return Page(
            "records.html",
            {
                "query": query,
                "hits": hits,
                "receipt": found["rank_receipt"],
                "next_cursor": found.get("next_page_cursor"),
            },
        )
    return _listed(ask)


def _listed(ask: Ask) -> Answer:
    """The list by state, and by capturing principal and capture time when asked."""
    filters = {name: ask.query.get(name, "").strip() for name in ("principal", "since", "until")}
    state = ask.query.get("state") or None
    after = ask.query.get("after", "")
    rows = ask.run(
        lambda e, s, op: inspection.records_list(
            e, s, op, state=state, after=after, limit=PAGE_SIZE, with_text=True, **filters
        )
    )
    more = rows[-1]["record_id"] if len(rows) == PAGE_SIZE else None
    return Page(
        "records.html",
        {
            "query": "",
            "rows": rows,
            "state": state or "",
            "states": RECORD_STATES,
            "filters": filters,
            "more": more,
        },
    )


def record(ask: Ask) -> Answer:
    record_id = ask.path["record_id"]
    shown = ask.run(lambda e, s, op: inspection.record_show(e, s, record_id, op))
    history = ask.run(lambda e, s, op: inspection.record_history(e, s, record_id, op))
    body = shown.get("record")
    return Page(
        "record.html",
        {
            "record": shown,
            "memory": memory_from_record(body, digest=shown["record_digest"]) if body else None,
            "history": history,
            "receipts": receipts(shown["record_digest"], body or {}),
            "actions": [(name, ACTION_LABELS[name]) for name in _actions_for(shown["state"])],
            "done": ask.query.get("done", ""),
        },
    )


# The record's own receipts, as ``admin records show`` prints them in its body: (label, field).
RECEIPTS: Final = {
    "Payload digest": "payload_digest",
    "Authorization receipt": "authorization_receipt_digest",
    "Recorded at": "recorded_at",
    "Recorded at cursor": "recorded_cursor",
}
TRUST_RECEIPT: Final = {
    "Trust class": "class",
    "Trust receipt": "receipt_digest",
    "Trust evidence": "evidence_digest",
    "Trust verifier": "verifier_id",
    "Trust issued at": "issued_at",
}


def receipts(record_digest: str, body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The record's digest and the receipts its body carries (none once it is shredded)."""
    trust = body.get("trust") or {}
    shown = [("Record digest", record_digest)]
    shown += [
        (label, str(body[name])) for label, name in RECEIPTS.items() if body.get(name) is not None
    ]
    return shown + [
        (label, str(trust[name])) for label, name in TRUST_RECEIPT.items() if name in trust
    ]


def _actions_for(state: str) -> list[str]:
    allowed = [name for name, (sources, _) in LIFECYCLE.items() if state in sources]
    return allowed + (["forget"] if state in RECORD_STATES_FORGETTABLE else [])


def record_action(ask: Ask) -> Answer:
    """A lifecycle step or forget: first a confirmation page, then (``confirmed``) the use case
    under the operator's name with their reason."""
    record_id = ask.path["record_id"]
    action = ask.form.get("action", "")
    reason = ask.form.get("reason", "").strip()
    by = ask.form.get("by", "").strip() or None
    if action not in ACTIONS:
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    if ask.form.get("confirmed") != "yes":
        return Page(
            "confirm.html",
            {
                "record_id": record_id,
                "action": action,
                "label": ACTION_LABELS[action],
                "reason": reason,
                "by": by or "",
            },
        )

    def act(engine: Kernel, scope: Scope, operator: str) -> Any:
        if action == "forget":
            return decisions.forget_record(engine, scope, record_id, operator, reason)
        step = cast("LifecycleOperation", action)
        return decisions.transition(
            engine, scope, record_id, step, operator, reason, superseded_by=by
        )

    ask.run(act, mutates=True)
    return Redirect(link(f"/records/{record_id}", workspace=ask.workspace, done=action))


def pending(ask: Ask) -> Answer:
    after = ask.query.get("after", "")
    rows = ask.run(lambda e, s, op: inspection.pending_list(e, s, op, after=after, limit=PAGE_SIZE))
    more = rows[-1]["candidate_id"] if len(rows) == PAGE_SIZE else None
    return Page("pending.html", {"rows": rows, "more": more})


def candidate(ask: Ask) -> Answer:
    candidate_id = ask.path["candidate_id"]
    shown = ask.run(lambda e, s, op: inspection.pending_show(e, s, candidate_id, op))
    digest = shown["candidate"]["record_digest"]
    return Page(
        "candidate.html",
        {"shown": shown, "memory": memory_from_record(shown["record"], digest=digest)},
    )


def adjudicate(ask: Ask) -> Answer:
    candidate_id = ask.path["candidate_id"]
    decision = ask.form.get("decision", "")
    if decision not in ("accept", "reject"):
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    reason = ask.form.get("reason", "").strip() or None
    outcome = ask.run(
        lambda e, s, op: decisions.adjudicate(e, s, candidate_id, decision, op, reason=reason),  # type: ignore[arg-type]
        mutates=True,
    )
    return Page("decided.html", {"candidate_id": candidate_id, "outcome": outcome})


def approvals(ask: Ask) -> Answer:
    shown = [(row, ask.approvals.view_of(row)) for row in ask.approvals.pending()]
    return Page("approvals.html", {"questions": shown, "now_ms": ask.now_ms})


def answer_approval(ask: Ask) -> Answer:
    """Approve or decline as the terminal does (the first answer wins), audited under the
    operator's name in the question's workspace."""
    approval_id = ask.path["approval_id"]
    decision = ask.form.get("decision", "")
    if decision not in ("approve", "decline"):
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    row = ask.approvals.book.get(approval_id)
    if row is None:
        raise EngramError(ErrorCode.NOT_FOUND)

    def answer(engine: Kernel, scope: Scope, operator: str) -> OpenApproval:
        def recorded(_call: Any) -> OpenApproval:
            first, answered = ask.approvals.answer_by_id(
                approval_id,
                decision == "approve",
                by="console",
                approver=operator_principal(operator),
            )
            if not first or answered is None:
                raise EngramError(ErrorCode.ALREADY_TERMINAL)
            return answered

        return audited(engine, scope, operator, f"approvals_{decision}", approval_id, recorded)

    answered = ask.seat.call(row.workspace_id, answer, mutates=False)
    outcome = outcome_line(answered) if decision == "approve" else "Nothing was changed."
    return Page(
        "answered.html", {"approval_id": approval_id, "decision": decision, "outcome": outcome}
    )


# Whose calls the audit page lists: (value, label); agents' by default, since the console's
# own page views would otherwise fill it.
AUDIT_CALLERS: Final = (
    ("agents", "Agents' tool calls"),
    ("changes", "Operators' actions"),
    ("reads", "Operators' reads (console page views)"),
    ("all", "Everyone"),
)


def caller_of(entry: Mapping[str, Any]) -> str:
    """Whose call an audit entry records: an agent's tool call, or an operator's (``admin.``)
    read or action."""
    tool = str(entry.get("tool", ""))
    if not tool.startswith("admin."):
        return "agents"
    return "reads" if tool.removeprefix("admin.") in inspection.READ_OPERATIONS else "changes"


def _matches(entry: Mapping[str, Any], filters: Mapping[str, str]) -> bool:
    """Whether an audit entry passes the page's filters: whose call it is, tool, principal and
    outcome exactly, ``since``/``until`` as ISO-8601 UTC prefixes (the entries' ``at`` sorts as
    text)."""
    if filters["by"] != "all" and caller_of(entry) != filters["by"]:
        return False
    if not inspection.within(str(entry.get("at", "")), filters["since"], filters["until"]):
        return False
    exact = {"tool": "tool", "principal": "principal", "outcome": "code"}
    return all(
        not filters[name] or str(entry.get(key)) == filters[name] for name, key in exact.items()
    )


def audit(ask: Ask) -> Answer:
    """The audit log, newest first, filtered by tool, principal, outcome and time, a page at a
    time."""
    page = ask.seat.audit(2**31)
    names = ("tool", "principal", "outcome", "since", "until")
    filters = {name: ask.query.get(name, "").strip() for name in names}
    # A tool named is listed whoever's it is: its name says (``admin.`` is an operator's).
    by = ask.query.get("by", "").strip() or "agents"
    if by not in dict(AUDIT_CALLERS):
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    filters["by"] = caller_of({"tool": filters["tool"]}) if filters["tool"] else by
    entries = [entry for entry in reversed(page.entries) if _matches(entry, filters)]
    number = max(1, _int(ask.query.get("page", "1")))
    start = (number - 1) * AUDIT_PAGE_SIZE
    return Page(
        "audit.html",
        {
            "entries": entries[start : start + AUDIT_PAGE_SIZE],
            "filters": filters,
            "page": number,
            "more": start + AUDIT_PAGE_SIZE < len(entries),
            "matching": len(entries),
            "callers": AUDIT_CALLERS,
            "empty_reason": page.empty_reason,
        },
    )


def activity(
    entries: list[dict[str, Any]], now_ms: int, hours: int = ACTIVITY_HOURS
) -> list[dict[str, Any]]:
    """Audit entries per hour over the last ``hours`` (oldest first): the overview's chart."""
    starts = [now_ms - (hours - n) * 3_600_000 for n in range(hours + 1)]
    edges = [format_instant(start) for start in starts]
    counts = [0] * hours
    for entry in entries:
        at = str(entry.get("at", ""))
        if edges[0] <= at < edges[-1]:
            counts[bisect.bisect_right(edges, at) - 1] += 1
    return [
        {"from": edges[n][:13].replace("T", " ") + ":00", "calls": counts[n]} for n in range(hours)
    ]


def backups(ask: Ask, result: Mapping[str, Any] | None = None, done: str = "") -> Answer:
    """The backups the console took into the data directory's ``backups/``, newest first."""
    # Imported here: embedded.backup loads the SQLite store and the vault, which a server must
    # not import before its first call (a stdio server starts without the engine).
    from engram_memory.embedded import backup

    return Page(
        "backups.html",
        {
            "backups": backup.backups_listed(backups_path(ask.data_dir)),
            "result": result,
            "done": done,
        },
    )


def backup_create(ask: Ask) -> Answer:
    """``admin backup`` through the seat (audited under the operator's name) into a new file
    named by the time it was taken; answers the list with what the copy holds."""
    folder = backups_path(ask.data_dir)
    folder.mkdir(mode=0o700, exist_ok=True)
    name = format_instant(ask.now_ms).replace(":", "-") + BACKUP_SUFFIX
    taken = ask.seat.backup(str(folder / name))
    return backups(ask, {**taken, "backup": name}, "created")


def backup_verify(ask: Ask) -> Answer:
    """A restore's check of one listed backup, with this data directory's key store; nothing
    is restored."""
    name = ask.path["name"]
    found = backups_path(ask.data_dir) / name
    if "/" in name or name.startswith(".") or not name.endswith(BACKUP_SUFFIX):
        raise EngramError(ErrorCode.NOT_FOUND)
    if not found.is_file():
        raise EngramError(ErrorCode.NOT_FOUND)
    from engram_memory.embedded import backup

    checked = backup.verify_backup(ask.data_dir, found, ask.session.operator)
    return backups(ask, checked, "verified")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 1


# path -> {method: page}: the console's pages under /console
PAGES: Final[dict[str, dict[str, Callable[[Ask], Answer]]]] = {
    "/": {"GET": overview},
    "/records": {"GET": records},
    "/records/{record_id}": {"GET": record, "POST": record_action},
    "/pending": {"GET": pending},
    "/pending/{candidate_id}": {"GET": candidate, "POST": adjudicate},
    "/approvals": {"GET": approvals},
    "/approvals/{approval_id}": {"POST": answer_approval},
    "/audit": {"GET": audit},
    "/backups": {"GET": backups, "POST": backup_create},
    "/backups/{name}": {"POST": backup_verify},
}

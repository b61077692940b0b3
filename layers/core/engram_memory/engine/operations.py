"""The host operations plane: actions that are never agent tools (CONTRACT.md §1).

Only the host's operator CLI calls these; nothing here is reachable through ``/mcp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ..contract.canonical import digest
from ..contract.errors import EngramError, ErrorCode
from .context import TOOLS, Scope, TrustedContext, new_audit_id
from .kernel import Call, Kernel
from .ports import IndexUnavailable, StoreUnavailable
from .records import decode, scope_ref
from .usecases.admission import settle

OPERATOR_POLICY_ID = "operator-adjudication"


def adjudicate(
    engine: Kernel,
    scope: Scope,
    candidate_id: str,
    decision: Literal["accept", "reject"],
    operator: str,
) -> dict[str, Any]:
    """Resolve a candidate held as ``pending_adjudication``: a human operator accepts or rejects it.

    Idempotent per operator and candidate: repeating the same decision returns the first outcome;
    a different decision afterwards is ``DIGEST_CONFLICT``; a candidate that is not pending is
    ``NOT_FOUND``. The decision is journaled like a policy decision, with the operator as policy.
    """
    if decision not in ("accept", "reject"):
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    principal = f"operator:{operator}"
    ctx = TrustedContext(
        tenant_id=scope.tenant_id,
        workspace_id=scope.workspace_id,
        principal=principal,
        purpose_ref="operations",
        audit_id=new_audit_id(),
        grants=frozenset(TOOLS),
    )
    call = Call(
        tool="request_admission",
        ctx=ctx,
        now_ms=engine.clock.now_ms(),
        target=candidate_id,
    )
    key = f"adjudicate:{candidate_id}"
    intent = digest(
        "intent",
        {
            "tool": "adjudicate",
            "target": candidate_id,
            "arguments": {"decision": decision},
            "purpose": "operations",
            "scope": scope_ref(scope),
        },
    )

    def run() -> dict[str, Any]:
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
            policy_version=principal,
            idempotency_key=key,
            intent=intent,
        )

    result = engine.mutation(call, run)
    outcome: dict[str, Any] = result["outcome"]
    return outcome


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
    except StoreUnavailable:
        raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
    except IndexUnavailable:
        raise EngramError(ErrorCode.RANKING_UNAVAILABLE) from None
    return ReindexReport(indexed=indexed, dropped=dropped, pending_upserts=pending)

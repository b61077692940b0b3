"""The host operations plane: actions that are never agent tools (CONTRACT.md §1).

Only the host's operator CLI calls these; nothing here is reachable through ``/mcp``.
"""

from __future__ import annotations

from typing import Any, Literal

from ..contract.canonical import digest
from ..contract.errors import EngramError, ErrorCode
from .context import TOOLS, Scope, TrustedContext, new_audit_id
from .kernel import Call, Kernel
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
        workflow=engine.confirmations,
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

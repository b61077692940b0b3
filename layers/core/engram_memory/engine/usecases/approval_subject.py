"""The memory a confirmation is about, for the person asked to approve it (CONTRACT.md §8).

forget: the record's text and citations (the record is current knowledge of the scope). withdraw:
the pending candidate's text, opened from the vault only for the principal that captured it (the
only principal that may withdraw it), and every such opening is audited with its digest, never
its text. Anything else (capture, a target that is gone): nothing to show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engram_memory.contract.errors import EngramError
from engram_memory.engine.context import TrustedContext
from engram_memory.engine.kernel import Call, Kernel
from engram_memory.engine.ports import AuditEvent

AUDIT_CODE = "APPROVAL_SUBJECT_OPENED"


@dataclass(frozen=True, slots=True)
class ApprovalSubject:
    record: dict[str, Any]  # components, citations, primary_component_id
    digest: str  # the record digest
    captured_at_ms: int | None


def approval_subject(
    k: Kernel, ctx: TrustedContext, tool: str, target: str | None, now_ms: int
) -> ApprovalSubject | None:
    """The memory behind ``target`` for the approval page and the form, or None."""
    if target is None:
        return None
    try:
        if tool == "forget":
            row = k.read(lambda: k.store.record_get(ctx.scope, target))
            if row is None or row.body is None:
                return None
            return ApprovalSubject(k.body(ctx.scope, row), row.record_digest, None)
        if tool == "withdraw":
            call = Call(tool=tool, ctx=ctx, now_ms=now_ms)
            candidate = k.pending_candidate(call, target)  # NOT_FOUND for another principal
            content = k.open_candidate(call, candidate)
            k.audit.record(
                AuditEvent.of_call(
                    ctx,
                    at_ms=now_ms,
                    tool=tool,
                    ok=True,
                    code=AUDIT_CODE,
                    target=target,
                    digests={"record_digest": candidate.record_digest},
                )
            )
            return ApprovalSubject(
                dict(content["record"]), candidate.record_digest, candidate.created_at_ms
            )
    except EngramError:
        return None  # the page shows no memory; the engine refuses the call itself
    return None

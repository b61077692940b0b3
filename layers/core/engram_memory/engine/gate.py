"""The confirmation gate (CONTRACT.md §8): approvals bound to tool, target, operation, principal.

Whatever workflow obtained the approval (in-process prompt, MCP elicitation, Step Functions task
token), the engine checks the same rules here, so no adapter can loosen them. Single use is
enforced by the store: the approval id is consumed in the same commit as the mutation.
"""

from __future__ import annotations

from typing import Final

from ..contract.errors import EngramError, ErrorCode
from .ports import Approval, ConfirmationRequest

APPROVAL_TTL_MS: Final = 300_000
EXECUTION_WINDOW_MS: Final = 30_000


def check_approval(approval: Approval, request: ConfirmationRequest, now_ms: int) -> None:
    bound = (
        approval.tool == request.tool
        and approval.target == request.target
        and approval.operation_digest == request.operation_digest
        and approval.principal == request.principal
        and approval.scope == request.scope
    )
    timely = (
        approval.issued_at_ms <= approval.approved_at_ms <= now_ms
        and now_ms - approval.issued_at_ms <= APPROVAL_TTL_MS
        and now_ms - approval.approved_at_ms <= EXECUTION_WINDOW_MS
    )
    if not (bound and timely):
        raise EngramError(ErrorCode.GATE_FAILED)

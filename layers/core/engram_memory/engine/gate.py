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


def within_windows(issued_at_ms: int, approved_at_ms: int, now_ms: int) -> bool:
    """Approved after it was asked, within 300 s of the asking and 30 s of the approval."""
    return (
        issued_at_ms <= approved_at_ms <= now_ms
        and now_ms - issued_at_ms <= APPROVAL_TTL_MS
        and now_ms - approved_at_ms <= EXECUTION_WINDOW_MS
    )


def check_approval(approval: Approval, request: ConfirmationRequest, now_ms: int) -> None:
    bound = (
        approval.tool == request.tool
        and approval.target == request.target
        and approval.operation_digest == request.operation_digest
        and approval.principal == request.principal
        and approval.scope == request.scope
    )
    if not (bound and within_windows(approval.issued_at_ms, approval.approved_at_ms, now_ms)):
        raise EngramError(ErrorCode.GATE_FAILED)

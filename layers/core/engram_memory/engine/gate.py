"""The confirmation gate (CONTRACT.md §8): a human approval is data the engine is given.

A use case that needs a human's approval and was not given one answers ``ConfirmationNeeded``
(``Engine.handle`` returns it instead of an envelope); the transport obtains the human's answer
its own way — an elicitation on the request's stream, a round trip with a sealed
``requestState``, an approval page, a Step Functions task token — and calls again with an
``Approval``. The engine never blocks and never re-enters.

This module is the one place that decides whether an approval counts:

- bound: the same tool, target, operation digest, principal and scope as the request;
- in time: approved after it was asked, within 300 s of the asking and 30 s of the approval
  (``within_windows``);
- single use: the approval id is consumed in the same commit as the mutation (``ChangeSet.
  approval_id``); a second commit with it is refused by the store, and ``approval_conflict``
  below turns that refusal into ``gate_failed``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Final

from ..contract.errors import EngramError, ErrorCode
from .context import Scope

APPROVAL_TTL_MS: Final = 300_000
EXECUTION_WINDOW_MS: Final = 30_000

__all__ = [
    "APPROVAL_TTL_MS",
    "EXECUTION_WINDOW_MS",
    "Approval",
    "ConfirmationNeeded",
    "ConfirmationRequest",
    "approval_conflict",
    "check_approval",
    "within_windows",
]


@dataclass(frozen=True, slots=True)
class ConfirmationRequest:
    """What the human is asked to approve (no content: ids, digests, a summary)."""

    tool: str
    target: str | None
    operation_digest: str
    principal: str
    scope: Scope
    reason_ref: str | None
    summary: str  # human-readable: tool, target, reason, scope


@dataclass(frozen=True, slots=True)
class Approval:
    """A human's approval of one operation, however the transport obtained it."""

    approval_id: str  # single use: consumed by the commit it authorizes
    tool: str
    target: str | None
    operation_digest: str
    principal: str
    scope: Scope
    issued_at_ms: int  # when the confirmation was requested
    approved_at_ms: int  # when the human approved

    @classmethod
    def of(
        cls,
        request: ConfirmationRequest,
        *,
        approval_id: str,
        issued_at_ms: int,
        approved_at_ms: int,
    ) -> Approval:
        """The approval of exactly ``request``."""
        return cls(
            approval_id=approval_id,
            tool=request.tool,
            target=request.target,
            operation_digest=request.operation_digest,
            principal=request.principal,
            scope=request.scope,
            issued_at_ms=issued_at_ms,
            approved_at_ms=approved_at_ms,
        )

    @classmethod
    def fresh(
        cls, request: ConfirmationRequest, *, issued_at_ms: int, approved_at_ms: int
    ) -> Approval:
        """A new approval of ``request`` under a fresh id (``apr_`` + 32 hex)."""
        return cls.of(
            request,
            approval_id="apr_" + uuid.uuid4().hex,
            issued_at_ms=issued_at_ms,
            approved_at_ms=approved_at_ms,
        )


@dataclass(frozen=True, slots=True)
class ConfirmationNeeded:
    """``Engine.handle``'s answer when the call needs an approval it was not given.

    Nothing was written. ``url`` and ``elicitation_id`` are set by a transport whose approval
    happens on a page (URL mode); the engine leaves them empty.
    """

    request: ConfirmationRequest
    url: str | None = None
    elicitation_id: str | None = None


def within_windows(issued_at_ms: int, approved_at_ms: int, now_ms: int) -> bool:
    """Approved after it was asked, within 300 s of the asking and 30 s of the approval."""
    return (
        issued_at_ms <= approved_at_ms <= now_ms
        and now_ms - issued_at_ms <= APPROVAL_TTL_MS
        and now_ms - approved_at_ms <= EXECUTION_WINDOW_MS
    )


def check_approval(approval: Approval, request: ConfirmationRequest, now_ms: int) -> None:
    """``gate_failed`` unless ``approval`` binds ``request`` and is within both windows."""
    bound = (
        approval.tool == request.tool
        and approval.target == request.target
        and approval.operation_digest == request.operation_digest
        and approval.principal == request.principal
        and approval.scope == request.scope
    )
    if not (bound and within_windows(approval.issued_at_ms, approval.approved_at_ms, now_ms)):
        raise EngramError(ErrorCode.GATE_FAILED)


def approval_conflict() -> EngramError:
    """The store refused a commit because its approval id was already consumed."""
    return EngramError(ErrorCode.GATE_FAILED)

"""The confirmation gate (CONTRACT.md §8): a human approval is data the engine is given.

A use case that needs a human's approval and was not given one answers ``ConfirmationNeeded``
(``Engine.handle`` returns it instead of an envelope); the transport obtains the human's answer
its own way — an elicitation on the request's stream, a round trip with a sealed
``requestState``, an approval page, a Step Functions task token — and calls again with an
``Approval``. The engine never blocks and never re-enters.

This module is the one place that decides whether an approval counts:

- bound: the same tool, target, operation digest, principal and scope as the request;
- in time: approved after it was asked, within 300 s of the asking and 30 s of the approval
  (``within_windows``; ``Approval.expired`` for a question not answered yet);
- single use: the approval id is consumed in the same commit as the mutation (``ChangeSet.
  approval_id``); a second commit with it is refused by the store, and ``approval_conflict``
  below turns that refusal into ``gate_failed``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.context import Scope

APPROVAL_TTL_MS: Final = 300_000
EXECUTION_WINDOW_MS: Final = 30_000

_Id = Annotated[StrictStr, Field(min_length=1, max_length=1024)]

# Where a human answered a question: the approval page, the host's terminal, the embedded
# console, or the client's own form (``approver_label`` names who, for a record's history).
AnsweredOn = Literal["page", "terminal", "console", "form"]
# The client answered its form: the host cannot name the person behind it.
FORM_ANSWER: Final = "form answered by the client"


def approver_label(on: AnsweredOn, who: str | None = None) -> str:
    """Who approved, as the journal keeps it beside the transition (an operator reads it in
    the record's history): the signed-in subject or the operator, and where they answered.
    ``who`` is None where the host cannot name the person: a form answered by the client, the
    embedded page (whoever holds its link and the terminal's code)."""
    if on == "form":
        return FORM_ANSWER
    place = {"page": "on the approval page", "terminal": "at the terminal"}.get(
        on, "in the console"
    )
    if who is None:
        return "the approval page, with the terminal's code" if on == "page" else place
    return f"{who} {place}"


__all__ = [
    "APPROVAL_TTL_MS",
    "EXECUTION_WINDOW_MS",
    "FORM_ANSWER",
    "AnsweredOn",
    "Approval",
    "ConfirmationNeeded",
    "ConfirmationRequest",
    "approval_conflict",
    "approver_label",
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


class Approval(BaseModel):
    """A human's approval of one operation, however the transport obtained it — the one type.

    Bound to (tool, target, operation digest, principal, scope) and its issue time. Every place
    an approval travels or rests is a serialization of this model, never a parallel class: the
    tool invocation's ``approval`` and the ``SendTaskSuccess`` output (its JSON), the sealed
    ``requestState`` (its JSON, unanswered), the embedded approval book's row and the parked
    task token's DynamoDB item (its fields, plus what that store keeps beside it).

    ``approved_at_ms`` is ``None`` while the question is open (asked, not yet answered): the
    gate refuses such an approval.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    approval_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] = Field(
        description="Single-use id: consumed by the commit it authorizes."
    )
    tool: Annotated[StrictStr, Field(min_length=1, max_length=64)] = Field(
        description="Approved tool."
    )
    target: StrictStr | None = Field(default=None, description="Approved target, if any.")
    operation_digest: Annotated[StrictStr, Field(pattern=r"^sha256:[0-9a-f]{64}$")] = Field(
        description="Digest of the approved operation."
    )
    principal: _Id = Field(description="Principal the approval was given for.")
    tenant_id: _Id = Field(description="Scope: tenant.")
    workspace_id: _Id = Field(description="Scope: workspace.")
    issued_at_ms: StrictInt = Field(description="When the confirmation was requested.")
    approved_at_ms: StrictInt | None = Field(
        default=None, description="When the human approved; None while unanswered."
    )
    # Not part of the binding: who gave the answer (``approver_label``), journaled with the
    # transition it authorizes. None while unanswered, and where the transport cannot say.
    approved_by: Annotated[StrictStr, Field(min_length=1, max_length=1100)] | None = Field(
        default=None, description="Who approved, and where (for the record's history)."
    )

    @property
    def scope(self) -> Scope:
        return Scope(self.tenant_id, self.workspace_id)

    @property
    def expires_at_ms(self) -> int:
        """The last moment the question may be answered or the approval used."""
        return self.issued_at_ms + APPROVAL_TTL_MS

    @classmethod
    def asked(
        cls, request: ConfirmationRequest, *, approval_id: str, issued_at_ms: int
    ) -> Approval:
        """The open question of ``request`` (not answered yet)."""
        return cls(
            approval_id=approval_id,
            tool=request.tool,
            target=request.target,
            operation_digest=request.operation_digest,
            principal=request.principal,
            tenant_id=request.scope.tenant_id,
            workspace_id=request.scope.workspace_id,
            issued_at_ms=issued_at_ms,
        )

    @classmethod
    def of(
        cls,
        request: ConfirmationRequest,
        *,
        approval_id: str,
        issued_at_ms: int,
        approved_at_ms: int,
        by: str | None = None,
    ) -> Approval:
        """The approval of exactly ``request`` (``by``: who gave it, ``approver_label``)."""
        asked = cls.asked(request, approval_id=approval_id, issued_at_ms=issued_at_ms)
        return asked.approved(approved_at_ms, by)

    @classmethod
    def fresh(
        cls,
        request: ConfirmationRequest,
        *,
        issued_at_ms: int,
        approved_at_ms: int,
        by: str | None = None,
    ) -> Approval:
        """A new approval of ``request`` under a fresh id (``apr_`` + 32 hex)."""
        return cls.of(
            request,
            approval_id="apr_" + uuid.uuid4().hex,
            issued_at_ms=issued_at_ms,
            approved_at_ms=approved_at_ms,
            by=by,
        )

    def approved(self, approved_at_ms: int, by: str | None = None) -> Approval:
        """This question, approved at ``approved_at_ms`` by ``by`` (``approver_label``) — only
        the binding, as an ``Approval`` (whatever a store keeps beside it, e.g. a task token,
        stays behind)."""
        binding = {name: getattr(self, name) for name in Approval.model_fields}
        return Approval(**{**binding, "approved_at_ms": approved_at_ms, "approved_by": by})

    def binds(self, request: ConfirmationRequest) -> bool:
        """Is this the approval of exactly ``request`` (tool, target, digest, principal, scope)?"""
        return (
            self.tool == request.tool
            and self.target == request.target
            and self.operation_digest == request.operation_digest
            and self.principal == request.principal
            and self.scope == request.scope
        )

    def expired(self, now_ms: int) -> bool:
        """Past 300 s from the asking: the question can no longer be answered nor used."""
        return now_ms - self.issued_at_ms > APPROVAL_TTL_MS

    def usable_at(self, now_ms: int) -> bool:
        """Approved, and within both windows at ``now_ms`` (``within_windows``)."""
        return self.approved_at_ms is not None and within_windows(
            self.issued_at_ms, self.approved_at_ms, now_ms
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
    if not (approval.binds(request) and approval.usable_at(now_ms)):
        raise EngramError(ErrorCode.GATE_FAILED)


def approval_conflict() -> EngramError:
    """The store refused a commit because its approval id was already consumed."""
    return EngramError(ErrorCode.GATE_FAILED)

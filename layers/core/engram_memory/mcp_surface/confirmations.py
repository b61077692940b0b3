"""Confirmation workflows that ask the human through MCP elicitation (CONTRACT.md §8).

- 2026-07-28 (stateless): the first call raises ``ConfirmationPending``; the surface answers with an
  ``InputRequiredResult`` carrying a form elicitation and a sealed ``requestState``. The client's
  retry brings the human's answer and the state back; ``RoundTripConfirmations`` turns them into an
  ``Approval`` (or a refusal) for the engine to check.
- 2025-11-25: ``StreamConfirmations`` sends ``elicitation/create`` on the request's own stream and
  waits for the answer (the engine runs in a worker thread; the elicitation runs on the event loop).
- URL mode (cloud): withdraw/forget run in a Step Functions execution with its own approval page;
  when the client can open URLs, the adapter raises ``UrlConfirmationRequired`` and the surface
  answers with a URL elicitation instead of a form.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Final

import anyio.from_thread
import mcp.types as types

from ..engine.gate import APPROVAL_TTL_MS
from ..engine.ports import (
    Approval,
    Clock,
    ConfirmationChannelUnavailable,
    ConfirmationDeclined,
    ConfirmationPending,
    ConfirmationRequest,
)
from .request_state import ConfirmationState

ANSWER_KEY: Final = "engram_confirmation"
DECISION_FIELD: Final = "decision"
# An explicit choice, not a checkbox: "accept" with nothing chosen is not an approval.
APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        DECISION_FIELD: {
            "type": "string",
            "title": "Your answer",
            "description": "Approve or decline this memory operation on behalf of the agent.",
            "oneOf": [
                {"const": "approve", "title": "Approve"},
                {"const": "decline", "title": "Decline"},
            ],
        }
    },
    "required": [DECISION_FIELD],
}


def elicitation_message(request: ConfirmationRequest) -> str:
    return "An agent asks to change governed memory. Approve?\n\n" + request.summary


def approved(result: types.ElicitResult) -> bool:
    return result.action == "accept" and (result.content or {}).get(DECISION_FIELD) == "approve"


def can_elicit(capabilities: types.ClientCapabilities | None) -> bool:
    return capabilities is not None and capabilities.elicitation is not None


def can_open_url(capabilities: types.ClientCapabilities | None) -> bool:
    """Did the client declare URL-mode elicitation (2025-11-25 and later)?"""
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


class UrlConfirmationRequired(ConfirmationPending):
    """The confirmation happens on an approval page the human signs in to (cloud, URL mode).

    Raised by the cloud adapter's engine when the tool function answered with the page of its
    run and the client can open URLs; the surface answers with a URL elicitation (an
    ``InputRequiredResult`` on 2026-07-28, the -32042 error on 2025-11-25). Once the human has
    answered on the page, the client's retry of the same call gets the committed receipt.
    """

    def __init__(
        self,
        request: ConfirmationRequest,
        url: str,
        elicitation_id: str,
        *,
        message: str | None = None,
    ) -> None:
        super().__init__(request)
        self.url = url
        self.elicitation_id = elicitation_id
        self.message = message or (
            elicitation_message(request)
            + "\n\nOpen the approval page, sign in, and answer; then retry the same call."
        )

    def params(self) -> types.ElicitRequestURLParams:
        return types.ElicitRequestURLParams(
            message=self.message,
            url=self.url,
            elicitation_id=self.elicitation_id,
        )


def state_for(request: ConfirmationRequest, issued_at_ms: int) -> ConfirmationState:
    return ConfirmationState(
        nonce="rs_" + uuid.uuid4().hex,
        principal=request.principal,
        tenant_id=request.scope.tenant_id,
        workspace_id=request.scope.workspace_id,
        tool=request.tool,
        target=request.target or "",
        operation_digest=request.operation_digest,
        issued_at_ms=issued_at_ms,
    )


class RoundTripConfirmations:
    """2026-07-28: the answer arrives with the retry, next to the state that asked for it."""

    def __init__(
        self,
        clock: Clock,
        *,
        capabilities: types.ClientCapabilities | None,
        state: ConfirmationState | None,
        answer: types.ElicitResult | None,
        claim: Callable[[str, int], bool] | None = None,
    ) -> None:
        self._clock = clock
        self._capabilities = capabilities
        self._state = state
        self._answer = answer
        self._claim = claim

    def opens_urls(self) -> bool:
        """URL mode is preferred where the host offers it: the human signs in on the page."""
        return can_open_url(self._capabilities)

    def request_approval(self, request: ConfirmationRequest) -> Approval:
        if not can_elicit(self._capabilities):
            raise ConfirmationChannelUnavailable("client declared no elicitation capability")
        state, answer = self._state, self._answer
        if state is None:
            raise ConfirmationPending(request)
        bound = (
            state.principal == request.principal
            and state.tenant_id == request.scope.tenant_id
            and state.workspace_id == request.scope.workspace_id
            and state.tool == request.tool
            and state.target == (request.target or "")
            and state.operation_digest == request.operation_digest
        )
        if not bound or answer is None or not approved(answer):
            raise ConfirmationDeclined("declined, cancelled or not bound to this operation")
        # Single use, enforced server-side; claimed only now, so an attempt for another
        # operation (refused above) does not use up the state of the legitimate retry.
        expires_at_ms = state.issued_at_ms + APPROVAL_TTL_MS
        if self._claim is not None and not self._claim(state.nonce, expires_at_ms):
            raise ConfirmationDeclined("this confirmation was already used")
        return Approval(
            approval_id=state.nonce,
            tool=request.tool,
            target=request.target,
            operation_digest=request.operation_digest,
            principal=request.principal,
            scope=request.scope,
            issued_at_ms=state.issued_at_ms,
            approved_at_ms=self._clock.now_ms(),
        )


class StreamConfirmations:
    """2025-11-25: ask with ``elicitation/create`` on the request's stream and wait."""

    def __init__(self, clock: Clock, *, session: Any, request_id: Any) -> None:
        self._clock = clock
        self._session = session
        self._request_id = request_id

    def opens_urls(self) -> bool:
        """A client that declared URL elicitation; also a stateless 2025-11-25 request, which
        declares nothing (no ``initialize`` on this connection): the -32042 answer is the one
        way such a client can reach the human, and one that cannot open it sees an error."""
        capabilities = self._session.client_capabilities
        return capabilities is None or can_open_url(capabilities)

    def request_approval(self, request: ConfirmationRequest) -> Approval:
        if not can_elicit(self._session.client_capabilities) or not self._session.can_send_request:
            raise ConfirmationChannelUnavailable("no way to ask the human on this connection")
        issued_at = self._clock.now_ms()
        result: types.ElicitResult = anyio.from_thread.run(
            self._elicit, elicitation_message(request)
        )
        if not approved(result):
            raise ConfirmationDeclined("declined or cancelled")
        return Approval(
            approval_id="apr_" + uuid.uuid4().hex,
            tool=request.tool,
            target=request.target,
            operation_digest=request.operation_digest,
            principal=request.principal,
            scope=request.scope,
            issued_at_ms=issued_at,
            approved_at_ms=self._clock.now_ms(),
        )

    async def _elicit(self, message: str) -> types.ElicitResult:
        result: types.ElicitResult = await self._session.elicit_form(
            message, APPROVAL_SCHEMA, related_request_id=self._request_id
        )
        return result

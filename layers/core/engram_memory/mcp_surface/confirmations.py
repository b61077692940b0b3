"""How the MCP surface obtains a human's approval (CONTRACT.md §8).

The engine answers ``ConfirmationNeeded`` for a call that needs an approval it was not given;
the surface asks the human and calls again with the ``Approval``:

- 2026-07-28 (stateless): an ``InputRequiredResult`` carrying a form elicitation and a sealed
  ``requestState``; the client's retry brings the human's answer and the state back, and
  ``approval_of_state`` turns them into the approval (the state's nonce is its id).
- 2025-11-25: ``elicitation/create`` on the request's own stream (``elicit_on_stream``), then
  the engine runs again in the same request.
- URL mode: a ``ConfirmationNeeded`` with a ``url`` (the approval page of a cloud run) goes to a
  client that opens URLs as a URL elicitation; once the human has answered there, the client's
  retry of the same call gets the committed receipt.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import mcp.types as types

from engram_memory.engine.gate import (
    FORM_ANSWER,
    Approval,
    ConfirmationNeeded,
    ConfirmationRequest,
)
from engram_memory.engine.ports import Clock

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


def approved(result: types.ElicitResult | None) -> bool:
    return (
        result is not None
        and result.action == "accept"
        and (result.content or {}).get(DECISION_FIELD) == "approve"
    )


def can_elicit(capabilities: types.ClientCapabilities | None) -> bool:
    return capabilities is not None and capabilities.elicitation is not None


def can_open_url(capabilities: types.ClientCapabilities | None) -> bool:
    """Did the client declare URL-mode elicitation (2025-11-25 and later)?"""
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and elicitation.url is not None


def opens_urls(capabilities: types.ClientCapabilities | None, *, modern: bool) -> bool:
    """URL mode is preferred where the host offers a page: the human signs in there.

    A stateless 2025-11-25 request declares nothing (no ``initialize`` on this connection): the
    -32042 answer is the one way such a client can reach the human, and one that cannot open it
    sees an error.
    """
    return can_open_url(capabilities) or (not modern and capabilities is None)


def url_params(needed: ConfirmationNeeded) -> types.ElicitRequestURLParams:
    assert needed.url is not None
    return types.ElicitRequestURLParams(
        message=elicitation_message(needed.request)
        + "\n\nOpen the approval page, sign in, and answer; then retry the same call.",
        url=needed.url,
        elicitation_id=needed.elicitation_id or "",
    )


def form_params(
    request: ConfirmationRequest, message: str | None = None
) -> types.ElicitRequestFormParams:
    """The form: the summary (``message``, or the request's own) and an explicit choice."""
    return types.ElicitRequestFormParams(
        message=message or elicitation_message(request), requested_schema=APPROVAL_SCHEMA
    )


def state_for(
    request: ConfirmationRequest, issued_at_ms: int, approval_id: str | None = None
) -> Approval:
    """The sealed ``requestState``'s content: the open approval of ``request``, under the id of
    the host's question when it keeps one (``approval_id``), else a fresh one."""
    chosen = approval_id or "rs_" + uuid.uuid4().hex
    return Approval.asked(request, approval_id=chosen, issued_at_ms=issued_at_ms)


def approval_of_state(state: Approval, approved_at_ms: int) -> Approval:
    """The approval the human gave on the retry that brought ``state`` back.

    It binds what the state names; the engine's gate checks that this is the operation of the
    retried call, and the windows. The state's id is the approval id: the commit consumes it.
    """
    return state.approved(approved_at_ms, FORM_ANSWER)


async def elicit_form(session: Any, request_id: Any, message: str) -> types.ElicitResult:
    """2025-11-25: the form on the request's own stream (the answer comes back on it)."""
    result: types.ElicitResult = await session.elicit_form(
        message, APPROVAL_SCHEMA, related_request_id=request_id
    )
    return result


async def elicit_on_stream(
    session: Any, request_id: Any, request: ConfirmationRequest, clock: Clock
) -> Approval | None:
    """2025-11-25: ask on the request's stream and wait; ``None`` when declined or cancelled."""
    issued_at = clock.now_ms()
    result = await elicit_form(session, request_id, elicitation_message(request))
    if not approved(result):
        return None
    return Approval.fresh(
        request, issued_at_ms=issued_at, approved_at_ms=clock.now_ms(), by=FORM_ANSWER
    )

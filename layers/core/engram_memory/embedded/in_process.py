"""The in-process transport: the engine called directly, the human asked through a callback.

The CLI's tour asks at the terminal; tests script the human. Like every transport, it calls the
engine, and when the answer is ``ConfirmationNeeded`` obtains the human's answer and calls again
with the ``Approval`` (``engine.gate`` checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engram_memory.contract.errors import ErrorCode, NoConfirmationChannel
from engram_memory.engine.gate import Approval, ConfirmationNeeded, ConfirmationRequest

if TYPE_CHECKING:
    from engram_memory.engine.context import TrustedContext
    from engram_memory.engine.ports import Clock
    from engram_memory.engine.service import Engine

AskHuman = Callable[[ConfirmationRequest], bool]
# The human's answer as data: an approval, or ``None`` when they declined.
ObtainApproval = Callable[[ConfirmationRequest], "Approval | None"]

__all__ = ["AskHuman", "ObtainApproval", "ask_approval", "call_in_process"]


def ask_approval(ask: AskHuman, clock: Clock) -> ObtainApproval:
    """Ask through ``ask``; an approval stamped with when it was asked and given."""

    def obtain(request: ConfirmationRequest) -> Approval | None:
        issued_at = clock.now_ms()
        if not ask(request):
            return None
        return Approval.fresh(request, issued_at_ms=issued_at, approved_at_ms=clock.now_ms())

    return obtain


def call_in_process(
    engine: Engine,
    tool: str,
    arguments: Any,
    ctx: TrustedContext,
    obtain: ObtainApproval | None,
) -> dict[str, Any]:
    """One tool call with the human in the loop: the envelope.

    With nobody to ask (``obtain`` is ``None``) a call that needs an approval is refused like a
    context the host cannot provide (-32603); a declined one answers ``gate_failed``.
    """
    answer = engine.handle(tool, arguments, ctx)
    if not isinstance(answer, ConfirmationNeeded):
        return answer
    if obtain is None:
        engine.refuse(tool, ctx, ctx.audit_id, "PROTOCOL_CONTEXT_UNAVAILABLE")
        raise NoConfirmationChannel()
    approval = obtain(answer.request)
    if approval is None:
        return engine.refuse(tool, ctx, ctx.audit_id, ErrorCode.GATE_FAILED)
    final = engine.handle(tool, arguments, ctx, approval=approval)
    assert not isinstance(final, ConfirmationNeeded)  # an approval was given: checked, not asked
    return final

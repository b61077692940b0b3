"""The in-process confirmation workflow of the embedded mode.

It asks a human through a callback (a terminal prompt, a test, or the MCP surface's elicitation)
and turns the answer into an ``Approval`` stamped with when it was requested and approved. The
engine checks the binding, the 300 s lifetime, the 30 s execution window and single use.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from ...engine.ports import (
    Approval,
    Clock,
    ConfirmationChannelUnavailable,
    ConfirmationDeclined,
    ConfirmationRequest,
)

AskHuman = Callable[[ConfirmationRequest], bool]


class InProcessConfirmations:
    def __init__(self, ask: AskHuman | None, clock: Clock) -> None:
        self._ask = ask
        self._clock = clock

    def request_approval(self, request: ConfirmationRequest) -> Approval:
        if self._ask is None:
            raise ConfirmationChannelUnavailable("no way to ask a human")
        issued_at = self._clock.now_ms()
        if not self._ask(request):
            raise ConfirmationDeclined("declined")
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

"""withdraw and forget in the cloud: the human's approval and the commit run in an execution.

The tool function never commits a confirmation-gated transition itself. It runs the engine up to
the gate — validation, ``NOT_FOUND``, state checks and the replay of a committed key all happen
first, so nobody is asked to approve an operation that cannot run — and then ``ExecutionGate``:

1. starts (or finds) the Standard execution named from the ledger key (scope, principal,
   idempotency key): a retried call can never start a second run;
2. waits for the execution's ``await_approval`` step to park its task token (``ApprovalStore``);
3. form mode — the call carries the human's approval, obtained by the MCP adapter through an
   elicitation round trip: hands it to the execution (``SendTaskSuccess``) and waits for the
   commit; URL mode — no approval yet: answers ``confirmation_required`` with the approval page
   of this run (``approval_url``), where the signed-in human answers the task token;
4. once the execution has committed the transition, answers with the engine's stored output (the
   replay of the ledger key, with the current ``projection_invalidation``/``key_destruction``).

An execution that ended without a commit (declined, no answer within 300 s, approved but started
past the 30 s window, failed) answers ``gate_failed``: the ledger key is spent on that run, so the
agent asks again with a new key. A run still going at the call's deadline answers the retriable
``DEADLINE_EXCEEDED``; the retry finds the same run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ...contract.errors import ErrorCode
from ...engine.gate import ConfirmationNeeded, ConfirmationRequest
from ...engine.ports import StoreUnavailable
from .step_functions import (
    ENDED_WAIT_ERRORS,
    ApprovalStore,
    ParkedApproval,
    WorkflowRequest,
    execution_name,
    start_confirmed_execution,
)

if TYPE_CHECKING:
    from ...aws_composition import ToolInvocation
    from ...engine.context import TrustedContext
    from ...engine.service import Engine

__all__ = ["ExecutionGate", "ledger_key"]

# How long a call waits for a fresh execution to park its task token when it has no deadline.
PARK_WAIT_MS: Final = 5_000
POLL_INTERVAL_S: Final = 0.2
_DEADLINE_MARGIN_MS: Final = 300


def ledger_key(tenant_id: str, workspace_id: str, principal: str, idempotency_key: str) -> str:
    """The ledger key as one string (JSON array: unambiguous for any id)."""
    return json.dumps(
        [tenant_id, workspace_id, principal, idempotency_key],
        ensure_ascii=False,
        separators=(",", ":"),
    )


class ExecutionGate:
    """Runs a confirmation-gated call through its Step Functions execution (module doc)."""

    def __init__(
        self,
        *,
        sfn: Any,
        approvals: ApprovalStore,
        state_machine_arn: str,
        approval_base_url: str,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.sfn = sfn
        self.approvals = approvals
        self.state_machine_arn = state_machine_arn
        self.approval_base_url = approval_base_url.rstrip("/")
        self._sleep = sleep
        self._poll_interval_s = poll_interval_s

    def run(
        self,
        engine: Engine,
        invocation: ToolInvocation,
        ctx: TrustedContext,
        request: ConfirmationRequest,
    ) -> dict[str, Any]:
        """The function's answer: an envelope, or ``confirmation_required`` with the page URL."""
        from ...aws_composition import confirmation_required

        arguments = invocation.arguments
        assert isinstance(arguments, dict)  # the engine validated them before asking
        key = ledger_key(
            ctx.tenant_id, ctx.workspace_id, ctx.principal, str(arguments["idempotency_key"])
        )
        name = execution_name(invocation.tool, key)
        workflow_request = WorkflowRequest(
            invocation=invocation.model_copy(update={"approval": None}),
            target=request.target,
            operation_digest=request.operation_digest,
            reason_ref=request.reason_ref,
        )
        try:
            execution_arn = start_confirmed_execution(
                self.sfn, self.state_machine_arn, ledger_key=key, request=workflow_request
            )
        except Exception:  # the service refused or is unreachable: nothing started
            return engine.refuse(invocation.tool, ctx, ctx.audit_id, ErrorCode.STORE_UNAVAILABLE)
        now = engine.clock.now_ms()
        deadline = self._deadline(ctx, now)
        try:
            parked = self._poll(
                engine,
                lambda: self.approvals.for_execution(name),
                min(deadline, now + PARK_WAIT_MS),
                execution_arn,
            )
        except StoreUnavailable:
            return engine.refuse(invocation.tool, ctx, ctx.audit_id, ErrorCode.STORE_UNAVAILABLE)
        if parked is None:
            return self._unfinished(engine, invocation, ctx, execution_arn)
        if parked.operation_digest != request.operation_digest:
            # the same key started a run for other arguments: a conflicting retry
            return engine.refuse(invocation.tool, ctx, ctx.audit_id, ErrorCode.DIGEST_CONFLICT)
        delivered = False
        if invocation.approval is not None and not parked.used:
            delivered = self._deliver(engine, parked, invocation)
        elif not parked.used:
            if parked.expired(engine.clock.now_ms()) or not self._running(execution_arn):
                # nobody answered in time: the run has ended (or is about to) without a commit
                return self._unfinished(engine, invocation, ctx, execution_arn)
            answer = confirmation_required(request)
            answer["confirmation_required"]["approval_id"] = parked.approval_id
            answer["confirmation_required"]["approval_url"] = (
                f"{self.approval_base_url}/approvals/{parked.approval_id}"
            )
            return answer
        envelope: dict[str, Any] | None = self._poll(
            engine, lambda: self._committed(engine, invocation, ctx), deadline, execution_arn
        )
        if envelope is None:
            return self._unfinished(engine, invocation, ctx, execution_arn)
        if delivered and envelope.get("ok"):
            # this call brought the approval that committed it: for the agent it is no replay
            envelope["output"]["value"]["replayed"] = False
        return envelope

    # -- steps ------------------------------------------------------------------------------------

    def _deliver(self, engine: Engine, parked: ParkedApproval, invocation: ToolInvocation) -> bool:
        """Hand the carried approval to the waiting execution (single use of the token)."""
        assert invocation.approval is not None
        taken = self.approvals.take(parked.approval_id, engine.clock.now_ms())
        if taken is None or taken.task_token is None:
            return False  # answered meanwhile (e.g. on the approval page): wait for that run
        from botocore.exceptions import ClientError

        try:
            self.sfn.send_task_success(
                taskToken=taken.task_token, output=invocation.approval.model_dump_json()
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ENDED_WAIT_ERRORS:
                raise
            return False  # the run stopped waiting: no commit will come (gate_failed below)
        return True

    @staticmethod
    def _committed(
        engine: Engine, invocation: ToolInvocation, ctx: TrustedContext
    ) -> dict[str, Any] | None:
        """The replay of the ledger key once the execution committed it; ``None`` before."""
        answer = engine.handle(invocation.tool, invocation.arguments, ctx)
        return None if isinstance(answer, ConfirmationNeeded) else answer

    def _poll(
        self, engine: Engine, probe: Callable[[], Any], until_ms: int, execution_arn: str
    ) -> Any:
        """``probe()`` until it returns something, the execution ends, or ``until_ms``."""
        while True:
            found = probe()
            if found is not None:
                return found
            if engine.clock.now_ms() >= until_ms or not self._running(execution_arn):
                return probe()  # one last look: the run may have just finished its commit
            self._sleep(self._poll_interval_s)

    def _running(self, execution_arn: str) -> bool:
        try:
            status = self.sfn.describe_execution(executionArn=execution_arn)["status"]
        except Exception:
            return True  # unknown: keep waiting until the deadline
        return bool(status == "RUNNING")

    def _unfinished(
        self, engine: Engine, invocation: ToolInvocation, ctx: TrustedContext, execution_arn: str
    ) -> dict[str, Any]:
        """No commit: still running at the deadline (retriable), or ended without one."""
        code = (
            ErrorCode.DEADLINE_EXCEEDED if self._running(execution_arn) else ErrorCode.GATE_FAILED
        )
        return engine.refuse(invocation.tool, ctx, ctx.audit_id, code)

    @staticmethod
    def _deadline(ctx: TrustedContext, now_ms: int) -> int:
        if ctx.deadline_ms is None:
            return now_ms + PARK_WAIT_MS
        return ctx.deadline_ms - _DEADLINE_MARGIN_MS

"""withdraw and forget in the cloud: the human's approval and the commit run in an execution.

The tool function never commits a confirmation-gated transition itself. It runs the engine up to
the gate — validation, ``NOT_FOUND``, state checks and the replay of a committed key all happen
first, so nobody is asked to approve an operation that cannot run — and then ``WorkflowRuns``,
once per MCP request (the adapter attaches the approval it holds up front):

1. finds the Standard execution named from the ledger key (scope, principal, idempotency key)
   through its parked approval, or starts it and waits for its ``await_approval`` step to park
   the task token (``ParkedApprovalBook``): a retried call never starts a second run;
2. with the human's approval (form mode: the adapter's elicitation round trip, attested by the
   adapter's MAC, ``cloud.proofs``) hands it to the execution (``SendTaskSuccess``), whose
   commit step verifies it; without one, and nobody has answered yet, answers
   ``confirmation_required`` with the approval page of this run (``approval_url``);
   A run it starts is announced on the stack's approval topic (``ApprovalTopic``): the
   operation, who asks and the page, so a person learns of it whatever the client shows;
3. waits — a ledger read per poll, no use case — until the execution's commit step has run the
   use case once with the approval, and answers with that commit's output. The first success the
   agent sees reports ``replayed: false`` in either mode (``ParkedApprovalBook.first_report``).

An execution that ended without a commit (declined, no answer within 300 s, approved but started
past the 30 s window, failed) answers ``gate_failed``: the ledger key is spent on that run, so the
agent asks again with a new key. Every wait is bounded by the call's deadline: a run still going
then answers the retriable ``DEADLINE_EXCEEDED``, and the retry finds the same run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from engram_memory.adapters.aws.calls import error_code
from engram_memory.cloud.parked_approvals import (
    ENDED_WAIT_ERRORS,
    ApprovalTopic,
    ParkedApproval,
    ParkedApprovalBook,
    WorkflowRequest,
    execution_name,
    start_confirmed_execution,
)
from engram_memory.contract.errors import ErrorCode
from engram_memory.engine.gate import ConfirmationRequest
from engram_memory.engine.ports import StoreUnavailable

if TYPE_CHECKING:
    from engram_memory.cloud.tool_invocation import ToolInvocation
    from engram_memory.engine.context import TrustedContext
    from engram_memory.engine.service import Engine

__all__ = ["WorkflowRuns", "ledger_key"]

log = logging.getLogger(__name__)

# How long a call without a deadline waits for a step of its execution (parking, committing).
PARK_WAIT_MS: Final = 5_000
POLL_INTERVAL_S: Final = 0.2
_DEADLINE_MARGIN_MS: Final = 300


class _NotStarted(Exception):
    """Step Functions refused or could not be reached: no execution was started."""


def ledger_key(tenant_id: str, workspace_id: str, principal: str, idempotency_key: str) -> str:
    """The ledger key as one string (JSON array: unambiguous for any id)."""
    return json.dumps(
        [tenant_id, workspace_id, principal, idempotency_key],
        ensure_ascii=False,
        separators=(",", ":"),
    )


class WorkflowRuns:
    """Runs a confirmation-gated call through its Step Functions execution (module doc)."""

    def __init__(
        self,
        *,
        sfn: Any,
        approvals: ParkedApprovalBook,
        state_machine_arn: str,
        approval_base_url: str,
        sleep: Callable[[float], None] = time.sleep,
        poll_interval_s: float = POLL_INTERVAL_S,
        topic: ApprovalTopic | None = None,
    ) -> None:
        self.sfn = sfn
        self.approvals = approvals
        self.state_machine_arn = state_machine_arn
        self.approval_base_url = approval_base_url.rstrip("/")
        self._sleep = sleep
        self._poll_interval_s = poll_interval_s
        self.topic = topic  # where a new request is announced (None: nowhere)

    def run(
        self,
        engine: Engine,
        invocation: ToolInvocation,
        ctx: TrustedContext,
        request: ConfirmationRequest,
    ) -> dict[str, Any]:
        """The function's answer: an envelope, or ``confirmation_required`` with the page URL."""
        from engram_memory.cloud.tool_invocation import confirmation_required

        key = self._key(invocation, ctx)
        name = execution_name(invocation.tool, key)
        deadline = self._deadline(ctx, engine.clock.now_ms())
        try:
            parked = self.approvals.for_execution(name)
            if parked is None:
                parked = self._start(engine, invocation, request, key, name, deadline)
        except _NotStarted:
            return engine.refuse(invocation.tool, ctx, ctx.audit_id, ErrorCode.STORE_UNAVAILABLE)
        except StoreUnavailable:
            return engine.refuse(invocation.tool, ctx, ctx.audit_id, ErrorCode.STORE_UNAVAILABLE)
        execution_arn = self._execution_arn(name)
        if parked is None:
            return self._unfinished(engine, invocation, ctx, execution_arn)
        if parked.operation_digest != request.operation_digest:
            # the same key started a run for other arguments: a conflicting retry
            return engine.refuse(invocation.tool, ctx, ctx.audit_id, ErrorCode.DIGEST_CONFLICT)
        if not parked.used:
            if invocation.approval is not None:
                self._deliver(engine, parked, invocation)
            elif parked.expired(engine.clock.now_ms()) or not self._running(execution_arn):
                # nobody answered in time: the run has ended (or is about to) without a commit
                return self._unfinished(engine, invocation, ctx, execution_arn)
            else:
                answer = confirmation_required(request)
                answer["confirmation_required"]["approval_id"] = parked.approval_id
                answer["confirmation_required"]["approval_url"] = self._page(parked)
                return answer
        idempotency_key = str(cast("dict[str, Any]", invocation.arguments)["idempotency_key"])
        envelope: dict[str, Any] | None = self._poll(
            engine,
            lambda: engine.committed(invocation.tool, ctx, idempotency_key),
            deadline,
            execution_arn,
        )
        if envelope is None:
            return self._unfinished(engine, invocation, ctx, execution_arn)
        return self._as_reported(engine, parked.approval_id, envelope)

    def reported(
        self,
        engine: Engine,
        invocation: ToolInvocation,
        ctx: TrustedContext,
        envelope: dict[str, Any],
    ) -> dict[str, Any]:
        """A replay the engine answered: the first report of its run's commit is no replay."""
        value = envelope.get("output", {}).get("value", {}) if envelope.get("ok") else {}
        if value.get("replayed") is not True:
            return envelope
        try:
            parked = self.approvals.for_execution(
                execution_name(invocation.tool, self._key(invocation, ctx))
            )
            if parked is None:
                return envelope
            return self._as_reported(engine, parked.approval_id, envelope)
        except StoreUnavailable:
            return envelope  # a replay is a truthful answer; only the first-report mark is lost

    def decline(self, engine: Engine, invocation: ToolInvocation, ctx: TrustedContext) -> None:
        """The person declined in the client's form: end the run now (``SendTaskFailure``,
        ``ApprovalDeclined``) rather than let it wait out its 300 s. Single use like an
        approval: a run answered meanwhile (on the page) keeps that answer. Best effort: the
        decline itself is already spent in the store (``Engine.decline``)."""
        from botocore.exceptions import BotoCoreError, ClientError

        arguments = invocation.arguments
        if not isinstance(arguments, dict) or not isinstance(arguments.get("idempotency_key"), str):
            return
        try:
            parked = self.approvals.for_execution(
                execution_name(invocation.tool, self._key(invocation, ctx))
            )
            token = None if parked is None else self._take_token(engine, parked)
            if token is None:
                return  # not parked yet, or answered meanwhile (on the page)
            self.sfn.send_task_failure(
                taskToken=token,
                error="ApprovalDeclined",
                cause="The human declined the operation.",
            )
        except (StoreUnavailable, ClientError, BotoCoreError):
            log.warning("a declined run could not be ended: it waits out its 300 s")

    # -- steps ------------------------------------------------------------------------------------

    @staticmethod
    def _key(invocation: ToolInvocation, ctx: TrustedContext) -> str:
        arguments = invocation.arguments
        assert isinstance(arguments, dict)  # the engine validated them before this
        return ledger_key(
            ctx.tenant_id, ctx.workspace_id, ctx.principal, str(arguments["idempotency_key"])
        )

    def _start(
        self,
        engine: Engine,
        invocation: ToolInvocation,
        request: ConfirmationRequest,
        key: str,
        name: str,
        deadline: int,
    ) -> ParkedApproval | None:
        """Start the execution of ``key`` and wait (bounded) for it to park its task token."""
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
        except Exception as exc:  # the service refused or is unreachable: nothing started
            raise _NotStarted() from exc
        parked: ParkedApproval | None = self._poll(
            engine, lambda: self.approvals.for_execution(name), deadline, execution_arn
        )
        if parked is not None:
            self._announce(parked)
        return parked

    def _announce(self, parked: ParkedApproval) -> None:
        """The person learns that something waits, whatever the agent's client can show."""
        if self.topic is not None and not self.topic.announce(parked, self._page(parked)):
            log.warning("the approval request could not be announced")

    def _page(self, parked: ParkedApproval) -> str:
        return f"{self.approval_base_url}/approvals/{parked.approval_id}"

    def _execution_arn(self, name: str) -> str:
        machine = self.state_machine_arn.split(":stateMachine:", 1)
        return f"{machine[0]}:execution:{machine[1]}:{name}"

    def _as_reported(
        self, engine: Engine, approval_id: str, envelope: dict[str, Any]
    ) -> dict[str, Any]:
        if envelope.get("ok"):
            first = self.approvals.first_report(approval_id, engine.clock.now_ms())
            envelope["output"]["value"]["replayed"] = not first
        return envelope

    def _deliver(self, engine: Engine, parked: ParkedApproval, invocation: ToolInvocation) -> None:
        """Hand the carried approval to the waiting execution (single use of the token)."""
        from engram_memory.cloud.proofs import form_proof

        assert invocation.approval is not None
        if invocation.approval_mac is None:
            return  # nothing vouches for the answer: the run waits for the page
        proof = form_proof(invocation.approval, invocation.approval_mac)
        token = self._take_token(engine, parked)
        if token is None:
            return  # answered meanwhile (e.g. on the approval page): wait for that run
        from botocore.exceptions import ClientError

        try:
            # the adapter's attestation of the client's answer: the run verifies it
            self.sfn.send_task_success(taskToken=token, output=proof.model_dump_json())
        except ClientError as exc:
            if error_code(exc) not in ENDED_WAIT_ERRORS:
                raise
            # the run stopped waiting: no commit will come (gate_failed once it has ended)

    def _take_token(self, engine: Engine, parked: ParkedApproval) -> str | None:
        """The parked run's task token, taken (single use); None when it was answered already."""
        taken = self.approvals.take(parked.approval_id, engine.clock.now_ms())
        return None if taken is None else taken.task_token

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

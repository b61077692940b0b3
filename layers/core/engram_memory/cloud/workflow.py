"""The Task steps of the withdraw/forget state machines (``infra/statemachines/README.md``).

Three steps: ``await_approval`` parks the task token; ``commit_transition`` checks the delivered
approval's windows (``Approval.usable_at``, the engine gate's own check) and runs the use case
once with it; ``finish_tail`` drains the scope's projection drops and key destructions. One
handler dispatches on ``event["step"]``. A step's failure is an exception whose class name is the
Step Functions error the machine catches or retries (``ApprovalWindowExpired``, ``GateFailed``,
``StoreUnavailable``, ``IndexUnavailable``, ``VaultUnavailable``...).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from engram_memory.cloud.composition import AwsClients, approval_store, mac_key
from engram_memory.cloud.observability import get_logger, record_projection_lag
from engram_memory.cloud.parked_approvals import (
    ApprovalWindowExpired,
    GateFailed,
    ParkedApprovalBook,
    WorkflowRequest,
)
from engram_memory.cloud.proofs import (
    ApprovalProof,
    MacKey,
    invocation_verifies,
    proven_approval,
)
from engram_memory.cloud.settings import (
    LAMBDA_DEADLINE_MARGIN_MS,
    HostBinding,
    WorkflowSettings,
)
from engram_memory.cloud.tool_handler import EngineHandler
from engram_memory.contract.errors import ErrorCode
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationNeeded
from engram_memory.engine.ports import (
    CommitOutcomeUnknown,
    IndexUnavailable,
    StoreUnavailable,
    VaultUnavailable,
)
from engram_memory.engine.service import Engine

_TRANSIENT = {
    ErrorCode.STORE_UNAVAILABLE.value: StoreUnavailable,
    ErrorCode.MUTATION_OUTCOME_UNKNOWN.value: CommitOutcomeUnknown,
    ErrorCode.DEADLINE_EXCEEDED.value: StoreUnavailable,
}


class WorkflowHandler(EngineHandler):
    """The cold-start singletons (``settings``, ``engine``, ``approvals``, ``binding``) and the
    steps."""

    settings_model = WorkflowSettings
    approvals: ParkedApprovalBook | None = None  # made with the engine, on the first step
    proof_key: MacKey | None = None  # the approval proof key (tests may set it)

    def _ready_steps(self) -> tuple[Engine, ParkedApprovalBook, HostBinding]:
        with self._lock:
            engine, binding = self._ready_locked()
            if self.approvals is None:
                settings = self._settings_locked()
                self.approvals = approval_store(AwsClients(settings.session), settings.table)
            return engine, self.approvals, binding

    def _handle(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        engine, approvals, binding = self._ready_steps()
        step = event.get("step")
        get_logger().append_keys(step=str(step), execution_name=str(event.get("execution_name")))
        request = WorkflowRequest.model_validate(event["request"])
        if step == "await_approval":
            return self.await_approval(engine, approvals, event, request)
        if step == "commit_transition":
            return self.commit_transition(engine, binding, event, request, context)
        if step == "finish_tail":
            return self.finish_tail(engine, event, request)
        raise ValueError(f"unknown step: {step!r}")

    def await_approval(
        self,
        engine: Engine,
        approvals: ParkedApprovalBook,
        event: Mapping[str, Any],
        request: WorkflowRequest,
    ) -> dict[str, Any]:
        approval_id = approvals.park(
            approval_id=ParkedApprovalBook.new_approval_id(),
            task_token=str(event["task_token"]),
            execution_name=str(event["execution_name"]),
            workflow=str(event["workflow"]),
            request=request,
            issued_at_ms=engine.clock.now_ms(),
        )
        with self._lock:
            settings = self._settings_locked()
        assert isinstance(settings, WorkflowSettings)
        base = settings.approval_base_url.rstrip("/")
        return {"approval_id": approval_id, "approval_url": f"{base}/approvals/{approval_id}"}

    def commit_transition(
        self,
        engine: Engine,
        binding: HostBinding,
        event: Mapping[str, Any],
        request: WorkflowRequest,
        context: Any,
    ) -> dict[str, Any]:
        invocation = request.invocation
        ctx = invocation.trusted_context(binding)
        # Whatever completed the wait is checked before anything else: only the page's proof (or
        # the adapter's attestation of a form answer, when the host lets forms answer) commits.
        approval = self.proven(engine, request, event.get("approval"), ctx)
        # The one window check (300 s from the asking, 30 s from the approval), here rather than
        # in a step of its own: a retry of this step takes time, so it must check again anyway.
        if not approval.usable_at(engine.clock.now_ms()):
            raise ApprovalWindowExpired(approval.approval_id)
        # The tool call's own deadline has passed long ago: this step is bounded by its Lambda.
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        deadline = (
            None
            if remaining is None
            else engine.clock.now_ms() + int(remaining()) - LAMBDA_DEADLINE_MARGIN_MS
        )
        ctx = dataclasses.replace(ctx, deadline_ms=deadline)
        envelope = engine.handle(invocation.tool, invocation.arguments, ctx, approval)
        if isinstance(envelope, ConfirmationNeeded):  # unreachable: an approval was given
            raise GateFailed(approval.approval_id)
        if not envelope.get("ok"):
            code = str(envelope["error"]["code"])
            if code == ErrorCode.GATE_FAILED.value:
                raise GateFailed(approval.approval_id)
            transient = _TRANSIENT.get(code)
            if transient is not None:
                raise transient(code)
        # the envelope holds receipts and digests only (withdraw/forget outputs carry no content)
        return {"envelope": envelope, "committed_at_ms": engine.clock.now_ms()}

    def _keys(self) -> tuple[MacKey, MacKey | None]:
        """The approval proof key and, unless the host requires the page, the adapter's
        invocation key (which attests form answers); made on first use."""
        with self._lock:
            settings = self._settings_locked()
            assert isinstance(settings, WorkflowSettings)
            if self.proof_key is None:
                clients = AwsClients(settings.session)
                self.proof_key = mac_key(clients, settings.approval_proof_key_arn)
        form_key = None if settings.approval_page_required else self._invocation_key()
        return self.proof_key, form_key

    def proven(
        self, engine: Engine, request: WorkflowRequest, answer: Any, ctx: TrustedContext
    ) -> Approval:
        """The approval the wait was completed with, if a proof vouches for it; else the refusal
        is audited and the run ends ``NotApproved`` (``GateFailed``): a stolen task token, a
        forged ``SendTaskSuccess``, a replayed or another operation's proof commit nothing."""
        invocation = request.invocation
        approval_id = "?"
        with contextlib.suppress(KeyError, TypeError):  # not shaped like a proof: refused below
            approval_id = str(answer["approval"]["approval_id"])
        try:
            proof = ApprovalProof.model_validate(answer)
            page_key, form_key = self._keys()
            call = {**invocation.to_event(), "proof": invocation.proof}
            approval = (
                proven_approval(
                    proof, page_key=page_key, form_key=form_key, now_ms=engine.clock.now_ms()
                )
                if invocation_verifies(self._invocation_key(), call)
                else None
            )
        except (ValidationError, AttributeError, TypeError):
            approval = None
        if approval is None:
            get_logger().warning(
                "approval refused: no valid proof", extra={"approval": approval_id}
            )
            engine.refuse(invocation.tool, ctx, ctx.audit_id, "APPROVAL_PROOF_INVALID")
            raise GateFailed(approval_id)
        return approval

    @staticmethod
    def finish_tail(
        engine: Engine, event: Mapping[str, Any], request: WorkflowRequest
    ) -> dict[str, Any]:
        """Drop the target from the projections and destroy its keys: the scope's own pending
        items of both kinds (never other scopes' queue).

        One step, not two: both drains are idempotent (a done item is not pending any more), so
        a retry re-runs only what is left; and both are attempted on every try, so an index
        outage never holds back the key destruction. The first kind still pending is the error
        (``IndexUnavailable`` | ``VaultUnavailable``) the machine retries.
        """
        ctx = request.invocation.context
        scope = Scope(ctx.tenant_id, ctx.workspace_id)
        drops_left = engine.drain_scope(scope, "drop_projection")
        if not drops_left:
            committed_at = (event.get("commit") or {}).get("committed_at_ms")
            if isinstance(committed_at, int):
                record_projection_lag(
                    str(event.get("workflow")), engine.clock.now_ms() - committed_at
                )
        keys_left = engine.drain_scope(scope, "destroy_key")
        if drops_left:
            raise IndexUnavailable(f"{drops_left} drop_projection item(s) still pending")
        if keys_left:
            raise VaultUnavailable(f"{keys_left} destroy_key item(s) still pending")
        return {"projections": "complete", "keys": "complete"}

"""The engine: the six use cases of CONTRACT.md §4–§10 against the ports.

``Engine.handle(tool, arguments, context, approval=None)`` is the single entry point the MCP
surface and the Lambdas call. It validates the raw arguments against the closed models, runs the
use case, writes one audit event, and returns the result envelope. Protocol refusals (``-32602``
/ ``-32603``) are raised as ``ProtocolRefusal``. A call that needs a human approval it was not
given answers ``ConfirmationNeeded(request)`` (nothing written); the transport obtains the
human's answer and calls again with ``approval=`` (``engine.gate``). Every other outcome is an
envelope.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import ValidationError

from engram_memory.contract.envelope import envelope_json, failure, success
from engram_memory.contract.errors import (
    EngramError,
    ErrorCode,
    ProtocolRefusal,
    UnknownTool,
    Violation,
    schema_violation,
    top_level_violation,
)
from engram_memory.contract.models import (
    INPUT_MODELS,
    CaptureInput,
    ClosedModel,
    ForgetInput,
    GetInput,
    RequestAdmissionInput,
    SearchInput,
    WithdrawInput,
)
from engram_memory.contract.types import INVALID_DIGEST_ERROR, MAX_ARGUMENT_BYTES
from engram_memory.engine.context import TOOLS, TrustedContext, new_audit_id
from engram_memory.engine.gate import Approval, ConfirmationNeeded
from engram_memory.engine.kernel import ApprovalNeeded, Call, EngineSettings, Kernel
from engram_memory.engine.ports import StoreUnavailable
from engram_memory.engine.records import decode
from engram_memory.engine.usecases.admission import request_admission
from engram_memory.engine.usecases.capture import capture
from engram_memory.engine.usecases.reads import get, search
from engram_memory.engine.usecases.transitions import forget, withdraw

log = logging.getLogger(__name__)

__all__ = ["Approval", "ConfirmationNeeded", "Engine", "EngineSettings", "new_audit_id"]

_NOT_ONE_OBJECT = top_level_violation("not_one_object")
_TOO_LARGE = top_level_violation("too_large", max_bytes=MAX_ARGUMENT_BYTES)


class Engine(Kernel):
    """The six tools behind one entry point (see the module docstring)."""

    def handle(
        self,
        tool: str,
        arguments: Any,
        ctx: TrustedContext,
        approval: Approval | None = None,
    ) -> dict[str, Any] | ConfirmationNeeded:
        """Run one tool call: its envelope, or ``ConfirmationNeeded`` (module docstring)."""
        call = Call(
            tool=tool,
            ctx=ctx,
            now_ms=self.clock.now_ms(),
            approval=approval,
            audit_in_commit=self.committed_audit is not None,
        )
        if tool not in TOOLS or tool not in ctx.grants:
            self._audit(call, ok=False, code="PROTOCOL_UNKNOWN_TOOL")
            raise UnknownTool()
        try:
            self.check_live(call)
            self.check_revoked(call)
            model = self._validate(tool, arguments)
            value = self._dispatch(call, model)
            envelope = success(value, ctx.audit_id)
            if len(envelope_json(envelope)) > self.settings.transport_ceiling_bytes:
                raise EngramError(ErrorCode.RESULT_TOO_LARGE)
        except EngramError as error:
            self._audit(call, ok=False, code=error.code.value, violation=error.violation)
            return failure(error.code, ctx.audit_id)
        except ProtocolRefusal:
            self._audit(call, ok=False, code="PROTOCOL_CONTEXT_UNAVAILABLE")
            raise
        except ApprovalNeeded as needed:
            self._audit(call, ok=False, code="CONFIRMATION_PENDING")
            return ConfirmationNeeded(needed.request)
        self._audit(call, ok=True, code="OK")
        return envelope

    def refuse(
        self, tool: str, ctx: TrustedContext | None, audit_id: str, code: ErrorCode | str
    ) -> dict[str, Any]:
        """Audit a call the surface refused before the engine ran it.

        A contract code (e.g. ``gate_failed`` for a replayed confirmation round) returns its
        failure envelope; a protocol refusal code is only audited (the caller raises).
        """
        bound = ctx or TrustedContext.unbound(audit_id)
        call = Call(tool=tool, ctx=bound, now_ms=self.clock.now_ms())
        label = code.value if isinstance(code, ErrorCode) else code
        self._audit(call, ok=False, code=label)
        return failure(code, audit_id) if isinstance(code, ErrorCode) else {}

    def decline(self, tool: str, ctx: TrustedContext, approval: Approval) -> dict[str, Any]:
        """The human declined the question ``approval`` answers: its id is spent in the store
        (a replay of the same ``requestState`` or question can never commit, CONTRACT.md §8)
        and the call answers ``gate_failed``, audited. ``STORE_UNAVAILABLE`` (retriable) when
        the id could not be spent: the decline is then not yet durable."""
        call = Call(tool=tool, ctx=ctx, now_ms=self.clock.now_ms(), target=approval.target)
        try:
            self.store.spend_approval(approval.scope, approval.approval_id)
            code = ErrorCode.GATE_FAILED
        except StoreUnavailable:
            code = ErrorCode.STORE_UNAVAILABLE
        self._audit(call, ok=False, code=code.value)
        return failure(code, ctx.audit_id)

    def committed(
        self, tool: str, ctx: TrustedContext, idempotency_key: str
    ) -> dict[str, Any] | None:
        """The envelope of ``tool``'s commit under ``idempotency_key``, as it was committed
        (``replayed: false``), or ``None`` before it. A ledger read: no use case runs.

        For a transport whose commit runs elsewhere (a Step Functions execution) and that waits
        for it to land.
        """
        entry = self.read(lambda: self.store.ledger_get(ctx.scope, ctx.principal, idempotency_key))
        if entry is None or entry.tool != tool:
            return None
        return success(decode(entry.output), ctx.audit_id)

    def _dispatch(self, call: Call, model: ClosedModel) -> dict[str, Any]:
        if isinstance(model, SearchInput):
            return search(self, call, model)
        if isinstance(model, GetInput):
            return get(self, call, model)
        if isinstance(model, CaptureInput):
            return self.mutation(call, lambda: capture(self, call, model))
        if isinstance(model, RequestAdmissionInput):
            return self.mutation(call, lambda: request_admission(self, call, model))
        if isinstance(model, WithdrawInput):
            return self.mutation(call, lambda: withdraw(self, call, model))
        if isinstance(model, ForgetInput):
            return self.mutation(call, lambda: forget(self, call, model))
        raise AssertionError("unreachable: every tool has a model")

    @staticmethod
    def _validate(tool: str, arguments: Any) -> ClosedModel:
        if not isinstance(arguments, dict):
            raise EngramError(ErrorCode.INVALID_SCHEMA, _NOT_ONE_OBJECT)
        try:
            size = len(
                json.dumps(arguments, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            )
        except (TypeError, ValueError):
            raise EngramError(ErrorCode.INVALID_SCHEMA, _NOT_ONE_OBJECT) from None
        if size > MAX_ARGUMENT_BYTES:
            raise EngramError(ErrorCode.INVALID_SCHEMA, _TOO_LARGE)
        try:
            return INPUT_MODELS[tool].model_validate(arguments)
        except ValidationError as exc:
            errors = exc.errors(include_input=False, include_url=False)
            if {error["type"] for error in errors} == {INVALID_DIGEST_ERROR}:
                raise EngramError(ErrorCode.INVALID_DIGEST) from None
            raise EngramError(ErrorCode.INVALID_SCHEMA, schema_violation(errors)) from None

    def _audit(
        self, call: Call, *, ok: bool, code: str, violation: Violation | None = None
    ) -> None:
        if ok and call.audited:
            return  # its line was committed with the mutation (``Call.audit_in_commit``)
        event = self.audit_event(call, ok=ok, code=code, violation=violation)
        try:
            self.audit.record(event)
        except Exception:  # an audit outage must not turn a committed mutation into an error
            log.exception("audit sink failed", extra={"audit_id": call.ctx.audit_id})
        self.settle_audit()  # the committed lines that sync made durable leave the outbox

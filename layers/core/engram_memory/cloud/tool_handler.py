"""What a function's Lambda init imports: the handler object, nothing more.

The tool functions' ``functions/<tool>/app.py`` is ``tool_handler(tool)``; the workflow, drainer,
approval and Cognito claims functions' is ``deferred_handler("<module>:<factory>")``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from engram_memory.cloud.observability import (
    count_admission_outcome,
    get_logger,
    get_tracer,
    instrumented,
)

# What a Lambda init imports is Powertools and this module, nothing more: the engine, the
# contract's models (pydantic), the settings and the wire are imported by the first invocation
# (``_ready``), as boto3, the Encryption SDK and opensearch-py already were
# (bench.cold_imports --built; tests/integration/test_cold_imports.py keeps it so).
if TYPE_CHECKING:
    from aws_lambda_powertools import Logger, Tracer

    from engram_memory.cloud.proofs import MacKey
    from engram_memory.cloud.settings import EngineEnvironment, HostBinding
    from engram_memory.cloud.tool_invocation import ToolInvocation
    from engram_memory.cloud.workflow_runs import WorkflowRuns
    from engram_memory.contract.errors import ProtocolRefusal
    from engram_memory.engine.context import TrustedContext
    from engram_memory.engine.ports import Clock
    from engram_memory.engine.service import Engine


def _build_engine(settings: EngineEnvironment) -> Engine:
    from engram_memory.cloud.composition import build_engine

    return build_engine(settings)


def _build_workflow_runs(tool: str, env: Mapping[str, str]) -> WorkflowRuns | None:
    from engram_memory.cloud.composition import build_workflow_runs

    return build_workflow_runs(tool, env)


class EngineHandler:
    """A Lambda handler whose cold-start singletons are its ``settings``, the ``engine`` and the
    ``HostBinding``.

    Created at import of the handler module (cheap: no client, no environment read); the first
    invocation parses the environment once with the function kind's model
    (``settings_model.from_env``), builds the engine (``build(settings)``) and keeps all three
    for the warm container; tests may set them beforehand. Subclasses implement ``_handle``,
    which runs instrumented (``observability.instrumented``).
    """

    # The function kind's settings model; None: the tool functions' (ToolFunctionSettings).
    settings_model: ClassVar[type[EngineEnvironment] | None] = None

    def __init__(
        self,
        *,
        env: Mapping[str, str] = os.environ,
        build: Callable[[EngineEnvironment], Engine] = _build_engine,
    ) -> None:
        self.settings: EngineEnvironment | None = None
        self.engine: Engine | None = None
        self.binding: HostBinding | None = None
        # the KMS HMAC key of the adapter's invocations (``cloud.proofs``); tests may set it
        self.invocation_key: MacKey | None = None
        self._env = env
        self._build = build
        self._lock = threading.Lock()
        self._entry = instrumented(self._handle)

    def __call__(self, event: Any, context: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._entry(event, context)
        return answer

    def _ready(self) -> tuple[Engine, HostBinding]:
        with self._lock:
            return self._ready_locked()

    def _settings_locked(self) -> EngineEnvironment:
        if self.settings is None:
            from engram_memory.cloud.settings import ToolFunctionSettings

            model = self.settings_model or ToolFunctionSettings
            self.settings = model.from_env(self._env)
        return self.settings

    def _ready_locked(self) -> tuple[Engine, HostBinding]:
        self._validate()
        if self.binding is None:
            self.binding = self._settings_locked().binding()
        if self.engine is None:
            self.engine = self._build(self._settings_locked())
        return self.engine, self.binding

    def _validate(self) -> None:
        """Run by every invocation before the engine: the checks that need what init does not
        import (ToolHandler: its tool is one of the six)."""

    def _invocation_key(self) -> MacKey:
        """The key that verifies the adapter's MAC of an invocation (made on first use)."""
        with self._lock:
            if self.invocation_key is None:
                from engram_memory.cloud.composition import AwsClients, mac_key

                settings = self._settings_locked()
                arn = getattr(settings, "invocation_key_arn", None)
                if not isinstance(arn, str):
                    raise TypeError(f"{type(settings).__name__} names no invocation key")
                self.invocation_key = mac_key(AwsClients(settings.session), arn)
            return self.invocation_key

    def authentic(self, invocation: ToolInvocation) -> bool:
        """Whether ``invocation`` carries the adapter's MAC of itself (``cloud.proofs``): over
        its event as the model writes it, which is what the adapter signed and what the run's
        copy of the call is checked by again."""
        from engram_memory.cloud.proofs import invocation_verifies

        event = {**invocation.to_event(), "proof": invocation.proof}
        return invocation_verifies(self._invocation_key(), event)

    def _handle(self, event: Any, context: Any) -> dict[str, Any]:
        raise NotImplementedError


class ToolHandler(EngineHandler):
    """The Lambda handler of the function serving ``tool`` (``functions/<tool>/app.py``).

    Created at import of the handler module (cheap: no client, no environment read). The first
    invocation builds the engine (``build(env)``) and the ``HostBinding`` and keeps them for
    the warm container: ``engine`` and ``binding`` are the cold-start singletons, and may be
    set beforehand (tests). withdraw and forget also build their ``WorkflowRuns``
    (``build_runs(tool, env)``, default ``build_workflow_runs``): the confirmation and the
    commit then run in the tool's state machine. A ``build_runs`` answering ``None`` composes
    the function without one: it answers ``confirmation_required`` and commits itself when the
    adapter calls again carrying the human's approval. Each invocation: validate the event, refuse another tool's event
    (-32602) or a malformed/foreign context (-32603) — both audited —, bound the call by the
    Lambda's remaining time, run ``engine.handle`` and return its envelope.
    """

    def __init__(
        self,
        tool: str,
        *,
        env: Mapping[str, str] = os.environ,
        build: Callable[[EngineEnvironment], Engine] = _build_engine,
        build_runs: Callable[[str, Mapping[str, str]], WorkflowRuns | None] | None = None,
    ) -> None:
        self.tool = tool
        self.runs: WorkflowRuns | None = None
        self._runs_built = False
        self._build_runs = build_runs or _build_workflow_runs
        self._logger: Logger = get_logger()
        self._tracer: Tracer = get_tracer()
        super().__init__(env=env, build=build)

    def _validate(self) -> None:
        from engram_memory.engine.context import TOOLS

        if self.tool not in TOOLS:
            raise ValueError(f"not one of the six tools: {self.tool!r}")

    def use_runs(self, runs: WorkflowRuns | None) -> None:
        """Compose withdraw/forget with ``runs`` (``None``: no state machine) instead of the
        environment's."""
        with self._lock:
            self.runs, self._runs_built = runs, True

    def _runs(self) -> WorkflowRuns | None:
        """withdraw/forget's Step Functions runs, built on first use; ``None`` for other tools."""
        from engram_memory.cloud.composition import GATED_TOOLS

        if self.tool not in GATED_TOOLS:
            return None
        with self._lock:
            if not self._runs_built:
                self.runs = self._build_runs(self.tool, self._env)
                self._runs_built = True
            return self.runs

    def _refuse(
        self,
        engine: Engine,
        refusal: ProtocolRefusal,
        reason: str,
        audit_id: str,
        ctx: TrustedContext | None = None,
    ) -> dict[str, Any]:
        from engram_memory.cloud.tool_invocation import protocol_error
        from engram_memory.contract.errors import UnknownTool

        unknown = isinstance(refusal, UnknownTool)
        code = "PROTOCOL_UNKNOWN_TOOL" if unknown else "PROTOCOL_CONTEXT_UNAVAILABLE"
        engine.refuse(self.tool, ctx, audit_id, code)
        self._logger.warning("invocation refused", extra={"reason": reason, "code": code})
        return protocol_error(refusal)

    def _attested(self, invocation: ToolInvocation) -> bool:
        """Whether the form answer ``invocation`` carries is the adapter's (``cloud.proofs``)."""
        from engram_memory.cloud.proofs import form_proof, proven_approval
        from engram_memory.engine.ports import StoreUnavailable

        if invocation.approval is None or invocation.approval_mac is None:
            return False
        key = self._invocation_key()
        proof = form_proof(invocation.approval, invocation.approval_mac)
        try:
            now_ms = self._ready()[0].clock.now_ms()
            return proven_approval(proof, page_key=None, form_key=key, now_ms=now_ms) is not None
        except StoreUnavailable:
            return False

    def _signed_by_adapter(self, invocation: ToolInvocation) -> bool | None:
        """Whether the adapter signed ``invocation``; None when the key cannot be reached."""
        from engram_memory.engine.ports import StoreUnavailable

        try:
            return self.authentic(invocation)
        except StoreUnavailable:
            return None

    def _handle(self, event: Any, context: Any) -> dict[str, Any]:
        from engram_memory.cloud.tool_invocation import (
            confirmation_required,
            parse_invocation,
            protocol_error,
        )
        from engram_memory.contract.errors import (
            ErrorCode,
            ProtocolRefusal,
            RefusalReason,
            TrustedContextUnavailable,
            UnknownTool,
        )
        from engram_memory.engine.gate import ConfirmationNeeded
        from engram_memory.engine.service import new_audit_id

        engine, binding = self._ready()
        self._tracer.put_annotation("tool", self.tool)
        try:
            invocation = parse_invocation(event)
        except TrustedContextUnavailable as refusal:
            return self._refuse(engine, refusal, "invalid_event", new_audit_id())
        signed = self._signed_by_adapter(invocation)
        if signed is None:  # KMS unreachable: retriable, nothing ran
            return engine.refuse(self.tool, None, invocation.audit_id, ErrorCode.STORE_UNAVAILABLE)
        if not signed:
            # invoked by someone other than the adapter: the context is nobody's word
            unsigned = TrustedContextUnavailable(RefusalReason.INTERNAL_ERROR)
            return self._refuse(engine, unsigned, "unsigned_invocation", invocation.audit_id)
        self._logger.append_keys(audit_id=invocation.audit_id, tool=self.tool)
        self._tracer.put_annotation("audit_id", invocation.audit_id)
        try:
            ctx = invocation.trusted_context(binding)
        except TrustedContextUnavailable as refusal:
            return self._refuse(engine, refusal, "foreign_tenant", invocation.audit_id)
        if invocation.tool != self.tool:
            return self._refuse(engine, UnknownTool(), "wrong_function", ctx.audit_id, ctx)
        ctx = _bounded_by_lambda(ctx, engine.clock, context)
        carried = invocation.approval
        runs = self._runs()
        if invocation.declined and carried is not None:
            if runs is not None:  # the decline ends the run it answers (signed: the adapter's)
                runs.decline(engine, invocation, ctx)
            return engine.decline(self.tool, ctx, carried)
        if runs is not None or not self._attested(invocation):
            carried = None  # a gated tool's run verifies the answer; here only an attested one
        try:
            # a gated tool with its state machine never commits here (see workflow_runs)
            answer = engine.handle(self.tool, invocation.arguments, ctx, carried)
        except ProtocolRefusal as refusal:  # audited by the engine
            return protocol_error(refusal)
        if isinstance(answer, ConfirmationNeeded):
            if runs is not None:
                return runs.run(engine, invocation, ctx, answer.request)
            return confirmation_required(answer.request)  # the adapter asks, then calls again
        envelope = answer if runs is None else runs.reported(engine, invocation, ctx, answer)
        if self.tool == "request_admission" and envelope.get("ok"):
            count_admission_outcome(str(envelope["output"]["value"]["outcome"]["status"]))
        return envelope


def _bounded_by_lambda(ctx: TrustedContext, clock: Clock, context: Any) -> TrustedContext:
    from engram_memory.cloud.settings import LAMBDA_DEADLINE_MARGIN_MS

    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return ctx
    deadline = clock.now_ms() + int(remaining()) - LAMBDA_DEADLINE_MARGIN_MS
    if ctx.deadline_ms is not None and ctx.deadline_ms <= deadline:
        return ctx
    return dataclasses.replace(ctx, deadline_ms=deadline)


def tool_handler(tool: str) -> ToolHandler:
    """The Lambda handler of ``tool``'s function: ``handler = tool_handler("search")``."""
    return ToolHandler(tool)


class DeferredHandler:
    """A function's handler whose module is imported, and whose real handler is made, by its
    first invocation (``loaded``): Lambda's init imports this module only (not even Powertools:
    the real handler instruments itself), and the warm container keeps the real handler.

    ``target`` names the real handler's factory as Lambda names a handler:
    ``"engram_memory.cloud.workflow:WorkflowHandler"`` (called without arguments).
    """

    def __init__(self, target: str) -> None:
        module, _, factory = target.partition(":")
        if not module or not factory:
            raise ValueError(f"a deferred handler is named '<module>:<factory>', not {target!r}")
        self.target = target
        self._module, self._factory = module, factory
        self._handler: Callable[[Any, Any], Any] | None = None
        self._lock = threading.Lock()

    def loaded(self) -> Any:
        """The real handler, imported and made on the first call (tests set its singletons)."""
        with self._lock:
            if self._handler is None:
                make = getattr(importlib.import_module(self._module), self._factory)
                self._handler = make()
            return self._handler

    def __call__(self, event: Any, context: Any) -> Any:
        return self.loaded()(event, context)


def deferred_handler(target: str) -> DeferredHandler:
    """The Lambda handler of a function whose module loads the engine, pydantic or an AWS client
    at import: ``handler = deferred_handler("engram_memory.cloud.drainer:drainer_handler")``."""
    return DeferredHandler(target)

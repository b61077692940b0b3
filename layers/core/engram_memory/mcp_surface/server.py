"""The MCP server: host binding, the six tools, envelopes and confirmation round trips."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, runtime_checkable

import anyio.to_thread
import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from engram_memory import CONNECTOR
from engram_memory.binding.host_config import HostConfig
from engram_memory.binding.tokens import (
    InvalidToken,
    VerifiedClaims,
    context_from_claims,
    refusal_of,
)
from engram_memory.binding.verified_tokens import ClaimsVerifier
from engram_memory.contract.envelope import envelope_text
from engram_memory.contract.errors import (
    ErrorCode,
    NoConfirmationChannel,
    ProtocolRefusal,
    RefusalReason,
    TrustedContextUnavailable,
    UnknownTool,
)
from engram_memory.engine.context import TrustedContext, new_audit_id
from engram_memory.engine.gate import Approval, ConfirmationNeeded, ConfirmationRequest
from engram_memory.engine.ports import Clock
from engram_memory.mcp_surface.approval_channel import (
    ApprovalChannel,
    Declined,
    Question,
    confirmation_mode,
)
from engram_memory.mcp_surface.catalog import GRANT_OF, INSTRUCTIONS, for_purpose, load_tools
from engram_memory.mcp_surface.confirmations import (
    ANSWER_KEY,
    approval_of_state,
    approved,
    can_elicit,
    can_open_url,
    elicit_form,
    elicit_on_stream,
    form_params,
    opens_urls,
    state_for,
    url_params,
)
from engram_memory.mcp_surface.request_state import RequestStateInvalid, RequestStateSealer
from engram_memory.mcp_surface.wire_screen import INVALID_ARGUMENTS_META

log = logging.getLogger(__name__)

SERVER_VERSION = "0.1.0"
UNKNOWN_NAME = "unknown"  # the audit log's tool for a name that is not one of the six


class SurfaceEngine(Protocol):
    """What the surface needs from an engine: the local ``Engine``, or the cloud adapter's
    ``LambdaToolEngine`` that invokes one Lambda per tool."""

    def handle(
        self, tool: str, arguments: Any, ctx: TrustedContext, approval: Approval | None = None
    ) -> dict[str, Any] | ConfirmationNeeded: ...

    def refuse(
        self, tool: str, ctx: TrustedContext | None, audit_id: str, code: ErrorCode | str
    ) -> dict[str, Any]: ...

    def decline(
        self, tool: str, ctx: TrustedContext, approval: Approval, arguments: Any = None
    ) -> dict[str, Any]: ...


@runtime_checkable
class IdleWorkHost(Protocol):
    """An engine that takes work for the server's idle time (``engine.idle``): a transport that
    runs it once each answer has left accepts it (the stdio server, the embedded HTTP app)."""

    def accept_idle_work(self) -> None: ...

    def run_idle_work(self) -> None: ...


@dataclass
class SurfaceRuntime:
    """What the MCP surface needs from its host: the engine, token checks, config, keys."""

    engine: SurfaceEngine
    verifier: ClaimsVerifier
    host: HostConfig
    sealer: RequestStateSealer
    clock: Clock
    stdio_token: str | None = None  # stdio: the token the host started the process with
    # The host's questions to humans, kept beyond one request (the embedded host's approval
    # book); None in the cloud, whose runs ask (see ``approval_channel``).
    approvals: ApprovalChannel | None = None
    # The host's revocation list, for the HTTP transport: a revoked token is then a 401 that
    # says so, like an expired one (``Kernel.credential_revoked``). None: the cloud, whose tool
    # functions read the list per call and answer ``AUTHORIZATION_REVOKED``.
    revoked: Callable[[TrustedContext], bool] | None = None


def envelope_result(envelope: dict[str, Any]) -> types.CallToolResult:
    """The envelope as ``structuredContent`` and, byte for byte, as the JSON text content."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=envelope_text(envelope))],
        structured_content=envelope,
        is_error=not envelope["ok"],
    )


def _refusal(error: ProtocolRefusal) -> MCPError:
    """The JSON-RPC error of a refusal: the code's constant message, and its ``data`` (for
    -32603: the reason, and what a person can do instead) when it has one."""
    return MCPError(code=error.jsonrpc_code, message=error.message, data=error.data)


class EngramMcp:
    """Builds and serves the ``mcp`` low-level ``Server`` for one runtime."""

    def __init__(self, runtime: SurfaceRuntime, *, instructions: str = INSTRUCTIONS) -> None:
        self.runtime = runtime
        self.server: Server[Any] = Server(
            CONNECTOR,
            version=SERVER_VERSION,
            instructions=instructions,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            get_tool_input_schema=self._input_schema,
        )
        self.server.middleware.append(self._internal_errors)
        # The calls waiting, shielded, on a human's answer (``_answer_on_stream``), and whether
        # the host is stopping: ``stop_waiting`` wakes them, and no call starts a wait after it.
        self._waits: set[anyio.CancelScope] = set()
        self._stopping = False
        # Whether a call's engine work runs on the event loop rather than in a worker thread:
        # the stdio transport's choice (``serve_stdio``), one client whose calls then answer in
        # arrival order without two thread hops each (~0.2 ms a call); HTTP serves many clients
        # and keeps the threads.
        self.engine_on_loop = False

    def stop_waiting(self) -> None:
        """The host is stopping: every call waiting on a human's answer stops waiting now and
        answers ``CANCELLED`` (retriable); its question stays open in the host's approval
        channel, so the page, the terminal and the client's retry still take the answer.

        Without this a waiting call holds the server up for as long as its question lives: the
        wait is shielded from the transport's cancellation. Call it on the event loop's thread.
        """
        self._stopping = True
        for waiting in list(self._waits):
            waiting.cancel()

    @functools.cached_property
    def tools(self) -> dict[str, types.Tool]:
        """The six tools, read on first use from the catalog's snapshot (``load_tools``)."""
        return load_tools()

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        grant = GRANT_OF.get(name)
        return self.tools[grant].input_schema if grant else None

    @staticmethod
    async def _internal_errors(ctx: Any, call_next: Any) -> Any:
        """Nothing unexpected leaks: any crash is -32603 with its constant message and the
        reason ``internal_error``."""
        try:
            return await call_next(ctx)
        except (MCPError, ValidationError):
            raise
        except Exception:
            log.exception("unexpected error while serving an MCP request")
            raise _refusal(TrustedContextUnavailable(RefusalReason.INTERNAL_ERROR)) from None

    # -- host binding ---------------------------------------------------------------------------

    def _bearer(self) -> str | None:
        access = get_access_token()
        if access is not None:
            return access.token
        return self.runtime.stdio_token

    def revoked(self, token: str, claims: VerifiedClaims) -> bool:
        """Whether the host's operator revoked this verified token (False when the host keeps
        no list at its transport, or the claims bind no context: the call will say why)."""
        if self.runtime.revoked is None:
            return False
        try:
            ctx = context_from_claims(
                claims, audit_id=new_audit_id(), host=self.runtime.host, raw_token=token
            )
        except TrustedContextUnavailable:
            return False
        return self.runtime.revoked(ctx)

    def _trusted(self, audit_id: str) -> TrustedContext:
        token = self._bearer()
        if not token:
            raise TrustedContextUnavailable(RefusalReason.MISSING_TOKEN)
        try:
            claims = self.runtime.verifier.verify(token)
        except InvalidToken as error:
            raise refusal_of(error) from None
        return context_from_claims(
            claims, audit_id=audit_id, host=self.runtime.host, raw_token=token
        )

    # -- handlers -------------------------------------------------------------------------------

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        try:
            trusted = self._trusted(new_audit_id())
        except TrustedContextUnavailable:
            return types.ListToolsResult(tools=[])  # memory is off unless the host grants it
        return types.ListToolsResult(
            tools=[
                for_purpose(tool, trusted.purpose_ref)
                for grant, tool in self.tools.items()
                if grant in trusted.grants
            ]
        )

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        engine = self.runtime.engine
        audit_id = new_audit_id()
        grant = GRANT_OF.get(params.name)
        audited = grant or UNKNOWN_NAME  # never the caller's text in the audit log
        try:
            trusted = self._trusted(audit_id)
        except TrustedContextUnavailable as refusal:
            engine.refuse(audited, None, audit_id, "PROTOCOL_CONTEXT_UNAVAILABLE")
            raise _refusal(refusal) from None
        if grant is None:  # only the six engram_memory_* names name a tool (CONTRACT.md §1)
            engine.refuse(audited, trusted, audit_id, "PROTOCOL_UNKNOWN_TOOL")
            raise _refusal(UnknownTool())
        # Arguments the wire screen refused (duplicate keys, -0, a lone surrogate) reach the
        # engine as something that is not an object: INVALID_SCHEMA, audited like any other.
        meta = params.meta or {}
        arguments: Any = [] if meta.get(INVALID_ARGUMENTS_META) else params.arguments or {}
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        call = _Call(ctx, grant, arguments, trusted, modern=modern)

        approval: Approval | None = None
        # A requestState only means something to a call that is waiting for a confirmation.
        if modern and params.request_state is not None and trusted.needs_confirmation(grant):
            retried = await self._retried(call, params)
            if isinstance(retried, types.CallToolResult):
                return retried
            approval = retried
        answer = await self._handle(call, approval)
        channel = self.runtime.approvals
        if isinstance(answer, ConfirmationNeeded):
            if channel is not None:
                return await self._confirm_by_channel(channel, call, answer)
            return await self._confirm(call, answer)
        if channel is not None and trusted.needs_confirmation(grant):
            answer = await anyio.to_thread.run_sync(
                channel.reported, grant, trusted, arguments, answer
            )
        return envelope_result(answer)

    async def _retried(
        self, call: _Call, params: types.CallToolRequestParams
    ) -> Approval | types.CallToolResult:
        """2026-07-28: the retry of a form round trip brings the sealed state and the human's
        answer back: the approval they gave, or ``gate_failed``.

        The state is spent by its first answer, whatever it is: a decline (in the form, or on
        the page or at the terminal before it) has the engine spend its id, so a replay of the
        same state with another answer is ``gate_failed`` too."""
        assert params.request_state is not None
        try:
            state = self.runtime.sealer.open(params.request_state)
        except RequestStateInvalid:
            return self._refused(call, ErrorCode.GATE_FAILED)
        trusted = call.trusted
        owner = (state.principal, state.tenant_id, state.workspace_id)
        if owner != (trusted.principal, trusted.tenant_id, trusted.workspace_id):
            return self._refused(call, ErrorCode.GATE_FAILED)
        approval = approval_of_state(state, self.runtime.clock.now_ms())
        channel = self.runtime.approvals
        still_open = channel is None or await anyio.to_thread.run_sync(
            channel.close_round_trip, approval
        )
        if not (still_open and approved(_answer(params.input_responses))):
            return await self._declined(call, approval)
        return approval

    async def _handle(
        self, call: _Call, approval: Approval | None
    ) -> dict[str, Any] | ConfirmationNeeded:
        work = functools.partial(
            self.runtime.engine.handle, call.grant, call.arguments, call.trusted, approval
        )
        try:
            return work() if self.engine_on_loop else await anyio.to_thread.run_sync(work)
        except ProtocolRefusal as refusal:
            raise _refusal(refusal) from None

    async def _declined(self, call: _Call, approval: Approval) -> types.CallToolResult:
        """The human declined ``approval``'s question: its id spent, ``gate_failed``."""
        # the call's arguments go with it: a host whose question is a run finds the run to end
        decline = functools.partial(
            self.runtime.engine.decline, call.grant, call.trusted, approval, call.arguments
        )
        return envelope_result(await anyio.to_thread.run_sync(decline))

    def _refused(self, call: _Call, code: ErrorCode) -> types.CallToolResult:
        """The call's envelope for ``code``, audited."""
        trusted = call.trusted
        return envelope_result(
            self.runtime.engine.refuse(call.grant, trusted, trusted.audit_id, code)
        )

    def _unavailable(self, call: _Call, refusal: NoConfirmationChannel) -> NoReturn:
        """No way to reach the human through this client: -32603, audited, its ``data`` naming
        what a person can do instead (``refusal``)."""
        trusted = call.trusted
        self.runtime.engine.refuse(
            call.grant, trusted, trusted.audit_id, "PROTOCOL_CONTEXT_UNAVAILABLE"
        )
        raise _refusal(refusal)

    def _form_round_trip(
        self, request: ConfirmationRequest, issued_at_ms: int, question: Question | None = None
    ) -> types.InputRequiredResult:
        """2026-07-28: the form, and the sealed state the client's retry brings back (under the
        host's ``question`` id when it asked one: one id, spent by the first answer)."""
        message = question.message if question else None
        state = state_for(request, issued_at_ms, question.approval_id if question else None)
        return types.InputRequiredResult(
            input_requests={ANSWER_KEY: types.ElicitRequest(params=form_params(request, message))},
            request_state=self.runtime.sealer.seal(state),
        )

    async def _confirm(
        self, call: _Call, needed: ConfirmationNeeded
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Ask the human for the approval the engine needs (module ``confirmations``)."""
        session = call.ctx.session
        capabilities = session.client_capabilities
        if needed.url is not None and opens_urls(capabilities, modern=call.modern):
            return _url_elicitation(url_params(needed), modern=call.modern)
        if (
            not can_elicit(capabilities)
            or not (call.modern or session.can_send_request)
            or self.runtime.host.approval_page_required  # the client's form is not enough
        ):
            # the cloud: its run's approval page, where the approver signs in
            self._unavailable(
                call, NoConfirmationChannel(approval_id=needed.elicitation_id, page=needed.url)
            )
        if call.modern:
            return self._form_round_trip(needed.request, self.runtime.clock.now_ms())
        approval = await elicit_on_stream(
            session, call.ctx.request_id, needed.request, self.runtime.clock
        )
        return await self._approved(call, approval)

    async def _approved(
        self, call: _Call, approval: Approval | Declined | None
    ) -> types.CallToolResult:
        """Run the call again with the human's approval (``Declined``: its id spent; None: no
        answer to use; both ``gate_failed``)."""
        if isinstance(approval, Declined):
            return await self._declined(call, approval.approval)
        if approval is None:
            return self._refused(call, ErrorCode.GATE_FAILED)
        answer = await self._handle(call, approval)
        if isinstance(answer, ConfirmationNeeded):  # a transport that ignored the approval
            return self._refused(call, ErrorCode.GATE_FAILED)
        return envelope_result(answer)

    async def _confirm_by_channel(
        self, channel: ApprovalChannel, call: _Call, needed: ConfirmationNeeded
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Ask through the host's approval channel (module ``approval_channel``): an answer
        already given wins; else URL mode (the question's link) for a client that declared URL
        only, a form for one that declared form; a client that can do neither (or URL only
        where the host serves no page) gets -32603 whose ``data`` names the question, the
        terminal's command and the page, and its retry takes the answer given there."""
        request = needed.request
        given = await anyio.to_thread.run_sync(channel.given, request)
        if given is not None:
            return await self._approved(call, given)
        session = call.ctx.session
        mode = confirmation_mode(session.client_capabilities)
        if mode == "form" and self.runtime.host.approval_page_required:
            # the host does not take the client's word: its page, or its terminal
            mode = "url" if can_open_url(session.client_capabilities) else "terminal"
        if (
            mode is None
            or (mode == "url" and not channel.has_page)
            or (mode == "form" and not (call.modern or session.can_send_request))
        ):
            mode = "terminal"
        question = await anyio.to_thread.run_sync(
            channel.ask, request, call.trusted, mode, call.arguments
        )
        if mode == "terminal":
            refusal = NoConfirmationChannel(
                approval_id=question.approval_id,
                approve_with=question.approve_with,
                page=question.link,
            )
            self._unavailable(call, refusal)
        if mode == "url" and question.link is not None:
            link = types.ElicitRequestURLParams(
                message=question.message, url=question.link, elicitation_id=question.approval_id
            )
            return _url_elicitation(link, modern=call.modern)
        if call.modern:
            return self._form_round_trip(request, question.issued_at_ms, question)
        return await self._answer_on_stream(channel, call, question)

    async def _answer_on_stream(
        self, channel: ApprovalChannel, call: _Call, question: Question
    ) -> types.CallToolResult:
        """2025-11-25: the form on the request's stream, its answer recorded on the question.

        The client may stop waiting for this call (a timeout, a cancel) while its person is
        still answering the form: the wait is shielded, for as long as the question lives, so
        that answer is still recorded and the client's retry takes it (``given``). Unanswered,
        the question stays open for the page and the terminal. ``stop_waiting`` cancels the
        shielded scope itself: the host is stopping."""
        approval: Approval | Declined | None = None
        left_s = (question.expires_at_ms - self.runtime.clock.now_ms()) / 1000
        with anyio.CancelScope(shield=True) as waiting, anyio.move_on_after(max(left_s, 0)):
            self._waits.add(waiting)
            try:
                if self._stopping:
                    waiting.cancel()
                result = await elicit_form(call.ctx.session, call.ctx.request_id, question.message)
                approval = await anyio.to_thread.run_sync(
                    channel.answer, question, approved(result)
                )
            finally:
                self._waits.discard(waiting)
        if waiting.cancelled_caught:
            return self._refused(call, ErrorCode.CANCELLED)
        return await self._approved(call, approval)


@dataclass(frozen=True, slots=True)
class _Call:
    """One ``tools/call`` being served: its request, tool, arguments and trusted context, and
    whether it speaks the stateless revision (2026-07-28)."""

    ctx: ServerRequestContext[Any, Any]
    grant: str
    arguments: Any
    trusted: TrustedContext
    modern: bool


def _url_elicitation(
    link: types.ElicitRequestURLParams, *, modern: bool
) -> types.InputRequiredResult:
    """URL mode: an input request (2026-07-28), or -32042 (2025-11-25)."""
    if modern:
        return types.InputRequiredResult(
            input_requests={ANSWER_KEY: types.ElicitRequest(params=link)}
        )
    raise UrlElicitationRequiredError([link])


def _answer(responses: dict[str, Any] | None) -> types.ElicitResult | None:
    if not responses or ANSWER_KEY not in responses:
        return None
    answer = responses[ANSWER_KEY]
    if isinstance(answer, types.ElicitResult):
        return answer
    try:
        return types.ElicitResult.model_validate(answer)
    except ValidationError:
        return None


__all__ = ["EngramMcp", "SurfaceEngine", "SurfaceRuntime", "envelope_result"]

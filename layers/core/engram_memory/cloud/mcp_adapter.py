"""The MCP adapter Lambda: the MCP surface, stateless, in front of the six tool functions.

``composition.build_adapter`` wires the same ``EngramMcp`` the embedded server runs, but over a
``LambdaToolEngine``: each tool call is a ``RequestResponse`` invocation of the tool's function
(``ENGRAM_TOOL_FUNCTIONS``) with ``ToolInvocation.from_trusted(...)``. ``LambdaAdapter`` serves
API Gateway HTTP API (payload v2) events through a small ASGI bridge: the Starlette app (bearer
auth, RFC 9728 metadata, Origin checks; ``stateless_http=True, json_response=True``) runs on one
event loop per container, its lifespan entered once, on the first invocation (cold start).

Environment (the SAM template's): ``ENGRAM_TOOL_FUNCTIONS`` (JSON object tool → function name),
``ENGRAM_RESOURCE_URI``, ``ENGRAM_ISSUER`` (its OIDC discovery document names the JWKS:
``cloud/oidc.py``),
``ENGRAM_ALLOWED_ORIGINS`` (comma-separated), ``ENGRAM_REQUEST_STATE_SECRET_ARN`` (the
request-state key is HKDF-SHA256 of the secret), ``ENGRAM_TENANT_ID``,
``ENGRAM_RETENTION_CEILING_S`` (optional), and
``ENGRAM_ALLOWED_HOSTS`` (optional, comma-separated extra ``Host`` values besides the resource
URI's host, e.g. a second custom domain).

The API's own default endpoint (``<api-id>.execute-api.<region>.<suffix>``) is accepted too, but
it is learned from the request, not configured: API Gateway names it in ``requestContext``
(``apiId``, ``domainName``), and the function's ``AWS_REGION`` pins the region. A template that
put ``!Ref HttpApi`` in the functions' environment would be a dependency cycle (the API's
definition references the functions).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast
from urllib.parse import urlparse

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import ValidationError

from engram_memory.adapters.aws.calls import error_code
from engram_memory.binding.host_config import HostConfig, RetentionConfig
from engram_memory.binding.tokens import TokenVerifier
from engram_memory.cloud.observability import instrumented
from engram_memory.cloud.oidc import IssuerKeysUnavailable, oidc_verifier
from engram_memory.cloud.settings import (
    AdapterSettings,
    ConfigurationError,
    read_secret_versions,
)
from engram_memory.cloud.tool_invocation import ToolInvocation, request_of
from engram_memory.contract.envelope import failure
from engram_memory.contract.errors import (
    ErrorCode,
    ProtocolRefusal,
    RefusalReason,
    TrustedContextUnavailable,
    UnknownTool,
    refusal_of_data,
)
from engram_memory.engine.context import TOOLS, TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationNeeded
from engram_memory.engine.keyring import KeyRing
from engram_memory.engine.ports import AuditEvent, AuditSink, Clock, StoreUnavailable
from engram_memory.mcp_surface.server import EngramMcp
from engram_memory.mcp_surface.transports import McpGate, streamable_app

if TYPE_CHECKING:
    from engram_memory.cloud.proofs import MacKey

    pass

log = logging.getLogger(__name__)

MIN_REQUEST_STATE_SECRET_BYTES: Final = 32
_HKDF_INFO: Final = b"engram-memory/request-state-key/v1"
_INVOKE_PAYLOAD_LIMIT: Final = 6 * 1024 * 1024
# A tool function may run up to API Gateway's 30 s integration limit, less the adapter's margin.
TOOL_INVOKE_TIMEOUT_S: Final = 28
# The outer bound of every MCP request (API Gateway's integration limit), and how much of it the
# adapter keeps for itself (answering, and its own cold start): a call's deadline is the earlier
# of the two bounds less this margin, so it ends as DEADLINE_EXCEEDED, never a timed-out 5xx.
API_GATEWAY_LIMIT_MS: Final = 30_000
ADAPTER_MARGIN_MS: Final = 1_500

# ``_invoke``'s answer when the function did not run to an answer, as the code the caller gets:
# it outlived the request's bound, or Lambda throttled it (its reserved concurrency, the
# tenant's budget, was taken: botocore's own retries are spent by then).
_TIMED_OUT: Final = ErrorCode.DEADLINE_EXCEEDED
_THROTTLED: Final = ErrorCode.RATE_LIMITED
_LAMBDA_THROTTLES: Final = frozenset({"TooManyRequestsException", "ThrottlingException"})

__all__ = [
    "AsgiLambdaBridge",
    "LambdaAdapter",
    "LambdaToolEngine",
    "host_config_of",
    "request_state_key",
    "token_verifier",
]


# --------------------------------------------------------------------------------------------
# The engine seen by the MCP surface: one Lambda invocation per tool call
# --------------------------------------------------------------------------------------------


class LambdaToolEngine:
    """What ``EngramMcp`` needs of an engine, over the six tool functions.

    ``handle`` invokes the tool's function and returns its envelope; a ``protocol_error`` answer
    becomes the matching ``ProtocolRefusal`` (its ``data`` checked against the closed set); a
    function error or a transport failure is a -32603 whose ``data.reason`` is
    ``internal_error`` and whose text never reaches the client.
    ``refuse`` audits a call the surface refused itself.
    """

    def __init__(
        self,
        functions: Mapping[str, str],
        *,
        clock: Clock,
        audit: AuditSink,
        lambda_client: Any = None,
        client_factory: Callable[[], Any] | None = None,
        invocation_key: MacKey,
    ) -> None:
        self.functions = dict(functions)
        # signs every invocation (the tool refuses an unsigned one) and attests form answers
        self.invocation_key = invocation_key
        self.clock = clock
        self.audit = audit
        self._lambda = lambda_client
        self._client_factory = client_factory
        self._lock = threading.Lock()
        self.deadline_ms: int | None = None  # of the request being served (``bound_by``)

    def bound_by(self, context: Any) -> None:
        """Bound the calls of this Lambda invocation by its remaining time and API Gateway's
        limit (a container serves one invocation at a time)."""
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        budget = API_GATEWAY_LIMIT_MS
        if remaining is not None:
            budget = min(budget, int(remaining()))
        self.deadline_ms = self.clock.now_ms() + budget - ADAPTER_MARGIN_MS

    # -- clients (created on first use) ---------------------------------------------------------

    def _lambda_client(self) -> Any:
        with self._lock:
            if self._lambda is None:
                if self._client_factory is None:
                    raise ConfigurationError("no Lambda client")
                self._lambda = self._client_factory()
            return self._lambda

    # -- the engine surface -------------------------------------------------------------------

    def handle(
        self, tool: str, arguments: Any, ctx: TrustedContext, approval: Approval | None = None
    ) -> dict[str, Any] | ConfirmationNeeded:
        """Run ``tool`` in its function: the envelope, ``ConfirmationNeeded``, or a refusal.

        ``approval`` (the human's, obtained by the surface) travels with the invocation; the
        function's engine (or the run it hands it to) checks and consumes it. A function that
        needs one it was not given answers ``confirmation_required`` — with the approval page
        of its run for withdraw/forget (``url``).
        """
        if tool not in TOOLS or tool not in ctx.grants:
            self._audit(tool, ctx, ctx.audit_id, "PROTOCOL_UNKNOWN_TOOL")
            raise UnknownTool()
        function = self._function(tool)
        if self.deadline_ms is not None and (
            ctx.deadline_ms is None or self.deadline_ms < ctx.deadline_ms
        ):
            ctx = dataclasses.replace(ctx, deadline_ms=self.deadline_ms)
        if ctx.deadline_ms is not None and self.clock.now_ms() >= ctx.deadline_ms:
            return self.refuse(tool, ctx, ctx.audit_id, ErrorCode.DEADLINE_EXCEEDED)
        try:
            payload = self._signed(ToolInvocation.from_trusted(tool, arguments, ctx, approval))
        except ValidationError:
            # the arguments or context cannot be sent (e.g. not JSON): the function would
            # refuse it as malformed
            self._audit(tool, ctx, ctx.audit_id, "PROTOCOL_CONTEXT_UNAVAILABLE")
            raise _host_failure() from None
        answer = self._invoke(function, payload, ctx.audit_id)
        if answer is _TIMED_OUT or answer is _THROTTLED:
            return self.refuse(tool, ctx, ctx.audit_id, answer)
        if isinstance(answer, dict) and "confirmation_required" in answer:
            try:
                request = request_of(answer)
            except (KeyError, TypeError):
                raise _host_failure() from None
            page = answer["confirmation_required"]
            url = page.get("approval_url")
            return ConfirmationNeeded(
                request,
                url=url if isinstance(url, str) else None,
                elicitation_id=str(page.get("approval_id", "")) or None,
            )
        if not isinstance(answer, dict):
            raise _host_failure()
        if "protocol_error" in answer:
            raise _refusal_of(answer["protocol_error"])
        if not isinstance(answer.get("ok"), bool):
            log.error("a tool function answered without an envelope", extra={"tool": tool})
            raise _host_failure()
        return cast("dict[str, Any]", answer)

    def _signed(self, invocation: ToolInvocation) -> dict[str, Any]:
        """The invocation's event, with the adapter's MAC (and its attestation of a form answer
        it carries): only this function can make either (``cloud.proofs``). KMS unreachable is
        -32603, like any other transport failure."""
        from engram_memory.cloud.proofs import signed_event

        try:
            return signed_event(self.invocation_key, invocation.to_event())
        except StoreUnavailable:
            log.exception("the invocation key is unavailable")
            raise _host_failure() from None

    def _function(self, tool: str) -> str:
        function = self.functions.get(tool)
        if function is None:
            log.error("no function configured for a granted tool", extra={"tool": tool})
            raise _host_failure()
        return function

    def _invoke(self, function: str, payload: dict[str, Any], audit_id: str) -> Any:
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        if len(body) > _INVOKE_PAYLOAD_LIMIT:
            raise _host_failure()
        from botocore.exceptions import ClientError, ReadTimeoutError

        try:
            response = self._lambda_client().invoke(
                FunctionName=function, InvocationType="RequestResponse", Payload=body
            )
            raw = response["Payload"].read()
        except ReadTimeoutError:  # the function outlived the request's bound: retriable
            log.warning("tool function invocation timed out", extra={"audit_id": audit_id})
            return _TIMED_OUT
        except ClientError as exc:
            if error_code(exc) not in _LAMBDA_THROTTLES:
                log.exception("tool function invocation failed", extra={"audit_id": audit_id})
                raise _host_failure() from None
            log.warning("tool function throttled", extra={"audit_id": audit_id})
            return _THROTTLED
        except Exception:  # a transport failure is an internal error, nothing more
            log.exception("tool function invocation failed", extra={"audit_id": audit_id})
            raise _host_failure() from None
        if response.get("FunctionError"):
            # The function's error text stays in the logs (its own and ours), never the client.
            log.error(
                "tool function error",
                extra={"audit_id": audit_id, "function_error": str(response["FunctionError"])},
            )
            raise _host_failure()
        try:
            return json.loads(raw)
        except (ValueError, TypeError):
            log.error("tool function answer is not JSON", extra={"audit_id": audit_id})
            raise _host_failure() from None

    def decline(
        self, tool: str, ctx: TrustedContext, approval: Approval, arguments: Any = None
    ) -> dict[str, Any]:
        """The human declined ``approval``'s question: the tool's function spends its id in the
        store (``Engine.decline``), ends the run that waits for it (found from ``arguments``'
        idempotency key) and answers ``gate_failed``."""
        try:
            invocation = ToolInvocation.from_trusted(
                tool, arguments or {}, ctx, approval, declined=True
            )
        except ValidationError:  # arguments that cannot travel: the id is spent all the same
            invocation = ToolInvocation.from_trusted(tool, {}, ctx, approval, declined=True)
        answer = self._invoke(self._function(tool), self._signed(invocation), ctx.audit_id)
        if answer is _TIMED_OUT or answer is _THROTTLED:
            return self.refuse(tool, ctx, ctx.audit_id, answer)
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise _host_failure()
        return cast("dict[str, Any]", answer)

    def refuse(
        self, tool: str, ctx: TrustedContext | None, audit_id: str, code: ErrorCode | str
    ) -> dict[str, Any]:
        """Audit a call the surface refused (like ``Engine.refuse``)."""
        label = code.value if isinstance(code, ErrorCode) else code
        self._audit(tool, ctx, audit_id, label)
        return failure(code, audit_id) if isinstance(code, ErrorCode) else {}

    def _audit(self, tool: str, ctx: TrustedContext | None, audit_id: str, code: str) -> None:
        event = AuditEvent(
            audit_id=audit_id,
            at_ms=self.clock.now_ms(),
            tenant_id=ctx.tenant_id if ctx else "",
            workspace_id=ctx.workspace_id if ctx else "",
            principal=ctx.principal if ctx else "",
            agent_id=ctx.agent_id if ctx else None,
            session_id=ctx.session_id if ctx else None,
            tool=tool,
            ok=False,
            code=code,
        )
        try:
            self.audit.record(event)
        except Exception:
            log.exception("audit sink failed", extra={"audit_id": audit_id})


def _refusal_of(error: Any) -> ProtocolRefusal:
    """The refusal a function answered: -32602, or -32603 with the ``data`` it gave (only the
    closed keys and reasons); the function's message is never passed on, the code's is."""
    code = error.get("code") if isinstance(error, dict) else None
    if code == UnknownTool.jsonrpc_code:
        return UnknownTool()
    return refusal_of_data(error.get("data") if isinstance(error, dict) else None)


def _host_failure() -> TrustedContextUnavailable:
    """-32603 for what failed on the host's side (an invocation, an answer): ``internal_error``."""
    return TrustedContextUnavailable(RefusalReason.INTERNAL_ERROR)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


def request_state_key(
    secrets_client: Any, secret_arn: str, *, clock: Callable[[], float] = time.time
) -> KeyRing:
    """The 32-byte request-state keys: HKDF-SHA256 of each version of the secret (binary, or
    string as UTF-8), current first. The secret rotates; a state sealed under the previous
    version still opens (``RequestStateSealer``), and the versions are read again as ``KeyRing``
    says."""

    def load() -> tuple[bytes, ...]:
        versions = read_secret_versions(
            secrets_client,
            secret_arn,
            name="request-state",
            variable="ENGRAM_REQUEST_STATE_SECRET_ARN",
            minimum=MIN_REQUEST_STATE_SECRET_BYTES,
        )
        return tuple(
            HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(secret)
            for secret in versions
        )

    return KeyRing(load, minimum=32, clock=clock)


def host_config_of(settings: AdapterSettings) -> HostConfig:
    options: dict[str, Any] = {
        "resource": settings.resource_uri,
        "issuer": settings.issuer,
        "tenant_id": settings.tenant_id,
        "allowed_origins": settings.allowed_origins,
        "approval_page_required": settings.approval_page_required,
        "approver_claim": settings.approver_claim,
    }
    if settings.retention_ceiling_s is not None:
        options["retention"] = RetentionConfig(
            allow_retain=False, max_expires_in_s=settings.retention_ceiling_s
        )
    try:
        return HostConfig(**options)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        variable = _HOST_VARIABLES.get(str(loc[0]) if loc else "", "ENGRAM_RESOURCE_URI")
        raise ConfigurationError(
            f"{variable} is invalid: set it as the host configuration requires"
            f" ({exc.errors()[0]['msg']})"
        ) from None


_HOST_VARIABLES: Final = {
    "approver_claim": "ENGRAM_APPROVER_CLAIM",
    "resource": "ENGRAM_RESOURCE_URI",
    "issuer": "ENGRAM_ISSUER",
    "tenant_id": "ENGRAM_TENANT_ID",
    "allowed_origins": "ENGRAM_ALLOWED_ORIGINS",
    "retention": "ENGRAM_RETENTION_CEILING_S",
}


def token_verifier(
    host: HostConfig,
    jwks: Mapping[str, Any] | None,
    jwks_fetcher: Callable[[str], dict[str, Any]] | None,
    audience_aliases: Sequence[str] = (),
) -> TokenVerifier:
    """The bearer tokens' verifier: the issuer's keys from its discovery document (following its
    rotations), or the pinned ``jwks``; ``aud`` the resource or one of ``audience_aliases``.
    Raises ``ConfigurationError``."""
    aliases = tuple(audience_aliases)
    try:
        if jwks is None and jwks_fetcher is not None:
            jwks = jwks_fetcher(host.issuer)
        if jwks is None:
            return oidc_verifier(host.issuer, audience=host.resource, audience_aliases=aliases)
        return TokenVerifier.from_jwks(
            jwks, issuer=host.issuer, audience=host.resource, audience_aliases=aliases
        )
    except IssuerKeysUnavailable as exc:
        raise ConfigurationError(f"ENGRAM_ISSUER: {exc}") from exc
    except ValueError as exc:
        raise ConfigurationError(
            "ENGRAM_ISSUER is invalid: its JWKS has no usable signing key"
        ) from exc


def stateless_app(surface: EngramMcp, *, extra_hosts: list[str] | None = None) -> McpGate:
    """``transports.http_app`` for a Lambda: stateless, JSON responses, the resource's host."""
    resource = urlparse(surface.runtime.host.resource)
    return streamable_app(
        surface,
        stateless=True,
        allowed_hosts=sorted({resource.netloc, *(extra_hosts or [])}),
        bind_host=resource.hostname or "localhost",
    )


def execute_api_host(event: Mapping[str, Any], region: str) -> str | None:
    """The API's default endpoint when API Gateway says the request came through it.

    ``requestContext`` is written by API Gateway, not by the client: ``domainName`` is the
    domain the request reached and ``apiId`` the API that routed it. Only the default endpoint
    of that API in this function's region qualifies (``<apiId>.execute-api.<region>.`` and a
    partition suffix); a custom domain must be the resource URI's host or in
    ``ENGRAM_ALLOWED_HOSTS``.
    """
    context = event.get("requestContext")
    if not isinstance(context, Mapping) or not region:
        return None
    api_id, domain = context.get("apiId"), context.get("domainName")
    if not isinstance(api_id, str) or not isinstance(domain, str) or not api_id.isalnum():
        return None
    prefix = f"{api_id}.execute-api.{region}."
    suffix = domain[len(prefix) :]
    if domain.lower() != domain or not domain.startswith(prefix):
        return None
    if suffix not in ("amazonaws.com", "amazonaws.com.cn"):
        return None
    return domain


# --------------------------------------------------------------------------------------------
# ASGI over Lambda (API Gateway HTTP API, payload format 2.0)
# --------------------------------------------------------------------------------------------


class AsgiLambdaBridge:
    """Serves API Gateway v2 events with an ASGI app on one event loop per container.

    The loop runs in a daemon thread (Lambda freezes it between invocations); the app's lifespan
    starts on the first event and stays up for the container's life.
    """

    def __init__(self, app: Any, *, timeout_s: float = 28.0) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._lifespan_done: asyncio.Event | None = None

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="asgi-bridge", daemon=True).start()
                asyncio.run_coroutine_threadsafe(self._startup(), loop).result(self.timeout_s)
                self._loop = loop
            return self._loop

    async def _startup(self) -> None:
        inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        await inbox.put({"type": "lifespan.startup"})

        async def receive() -> dict[str, Any]:
            return await inbox.get()

        async def send(message: dict[str, Any]) -> None:
            if message["type"].startswith("lifespan.startup") and not started.done():
                started.set_result(message)

        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}}
        task = asyncio.ensure_future(self.app(scope, receive, send))

        def ended(_: asyncio.Future[Any]) -> None:
            if not started.done():
                started.set_exception(RuntimeError("the lifespan ended before startup"))

        task.add_done_callback(ended)
        message = await started
        if message["type"] != "lifespan.startup.complete":
            raise RuntimeError("the app failed to start")
        self._lifespan_task = task  # keeps the lifespan (and its task group) alive

    def __call__(self, event: Mapping[str, Any]) -> dict[str, Any]:
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(self._serve(event), loop)
        return future.result(self.timeout_s)

    async def _serve(self, event: Mapping[str, Any]) -> dict[str, Any]:
        scope, body = _scope_of(event)
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.Event().wait()  # the request is complete: wait for cancellation
            return {"type": "http.disconnect"}

        status = 500
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        done = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))
                if not message.get("more_body", False):
                    done.set()

        app_task = asyncio.ensure_future(self.app(scope, receive, send))
        done_task = asyncio.ensure_future(done.wait())
        await asyncio.wait({app_task, done_task}, return_when=asyncio.FIRST_COMPLETED)
        if not app_task.done():
            app_task.cancel()
        done_task.cancel()
        if app_task.done() and not app_task.cancelled() and app_task.exception() is not None:
            log.error("the ASGI app failed", exc_info=app_task.exception())
            if not done.is_set():
                return {"statusCode": 500, "headers": {}, "body": "", "isBase64Encoded": False}
        return _response(status, headers, b"".join(chunks))


def _scope_of(event: Mapping[str, Any]) -> tuple[dict[str, Any], bytes]:
    http = event.get("requestContext", {}).get("http", {})
    method = str(http.get("method") or event.get("httpMethod") or "GET").upper()
    path = str(event.get("rawPath") or http.get("path") or "/")
    query = str(event.get("rawQueryString") or "")
    headers: list[tuple[bytes, bytes]] = []
    for name, value in (event.get("headers") or {}).items():
        headers.append((str(name).lower().encode("latin-1"), str(value).encode("latin-1")))
    cookies = event.get("cookies")
    if cookies:
        headers.append((b"cookie", "; ".join(cookies).encode("latin-1")))
    raw_body = event.get("body") or ""
    body = (
        base64.b64decode(raw_body)
        if event.get("isBase64Encoded")
        else str(raw_body).encode("utf-8")
    )
    source_ip = str(http.get("sourceIp") or "0.0.0.0")  # noqa: S104 - a client address
    host = next((v.decode() for k, v in headers if k == b"host"), "localhost")
    forwarded_proto = next((v.decode() for k, v in headers if k == b"x-forwarded-proto"), "https")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": forwarded_proto,
        "path": path,
        "raw_path": path.encode("utf-8"),
        "root_path": "",
        "query_string": query.encode("latin-1"),
        "headers": headers,
        "client": (source_ip, 0),
        "server": (host.split(":")[0], 443 if forwarded_proto == "https" else 80),
    }
    return scope, body


_TEXT_TYPES: Final = ("application/json", "text/", "application/problem+json")


def _response(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    merged: dict[str, str] = {}
    cookies: list[str] = []
    for raw_name, raw_value in headers:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        if name == "set-cookie":
            cookies.append(value)
        elif name in merged:
            merged[name] = f"{merged[name]}, {value}"
        else:
            merged[name] = value
    content_type = merged.get("content-type", "")
    textual = not body or content_type.startswith(_TEXT_TYPES)
    try:
        text = body.decode("utf-8") if textual else None
    except UnicodeDecodeError:
        text = None
    response: dict[str, Any] = {
        "statusCode": status,
        "headers": merged,
        "body": text if text is not None else base64.b64encode(body).decode("ascii"),
        "isBase64Encoded": text is None,
    }
    if cookies:
        response["cookies"] = cookies
    return response


class LambdaAdapter:
    """The adapter's Lambda handler: the surface and the bridge are cold-start singletons."""

    def __init__(
        self,
        *,
        build: Callable[[AdapterSettings], EngramMcp],
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self._env = env
        self._build = build
        self.settings: AdapterSettings | None = None
        self._lock = threading.Lock()
        self.surface: EngramMcp | None = None
        self.bridge: AsgiLambdaBridge | None = None
        self.gate: McpGate | None = None
        self._entry = instrumented(self._serve)

    def _ready(self, event: Mapping[str, Any]) -> AsgiLambdaBridge:
        with self._lock:
            if self.settings is None:
                self.settings = AdapterSettings.from_env(self._env)
            if self.bridge is None:
                if self.surface is None:
                    self.surface = self._build(self.settings)
                self.gate = stateless_app(self.surface, extra_hosts=self.settings.allowed_hosts)
                self.bridge = AsgiLambdaBridge(self.gate)
            assert self.gate is not None
            # The API's default endpoint, when API Gateway's request context vouches for it.
            default_host = execute_api_host(event, self.settings.region)
            if default_host is not None and default_host not in self.gate.allowed_hosts:
                self.gate.allowed_hosts.append(default_host)
            return self.bridge

    def __call__(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._entry(event, context)
        return answer

    def _serve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        bridge = self._ready(event)
        assert self.surface is not None
        engine = self.surface.runtime.engine
        if isinstance(engine, LambdaToolEngine):
            engine.bound_by(context)
        return bridge(event)

"""Serving the MCP surface: Streamable HTTP (with bearer auth, RFC 9728 metadata and Origin
checks) and stdio (with the token from the environment)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Final, cast
from urllib.parse import urlparse

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, cors_middleware
from mcp.server.auth.settings import AuthSettings
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from engram_memory.binding.host_config import host_matches
from engram_memory.binding.tokens import LEEWAY_S, InvalidToken, VerifiedClaims
from engram_memory.binding.verified_tokens import ClaimsVerifier
from engram_memory.mcp_surface.server import EngramMcp, IdleWorkHost
from engram_memory.mcp_surface.stdio_streams import protocol_out, stdin_lines
from engram_memory.mcp_surface.wire_screen import PARSE_ERROR, Screened, error_body, screen

log = logging.getLogger(__name__)

MCP_PATH: Final = "/mcp"
WELL_KNOWN: Final = "/.well-known/oauth-protected-resource"
MAX_BODY_BYTES: Final = (
    4 * 1024 * 1024
)  # the SDK's own limit; the contract's arguments are <= 1 MiB


class BearerVerifier:
    """The SDK's ``TokenVerifier``: a token that does not verify is a 401 at the transport."""

    def __init__(self, verifier: ClaimsVerifier) -> None:
        self._verifier = verifier

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            claims = self._verifier.verify(token)
        except InvalidToken:
            return None
        return AccessToken(
            token=token,
            client_id=claims.subject,
            scopes=[],
            # The SDK refuses a token once ``expires_at`` is past: give it the verifier's leeway,
            # which has already judged the expiry.
            expires_at=claims.expires_at + LEEWAY_S,
            resource=claims.audience,
            subject=claims.subject,
            claims={"iss": claims.issuer},
        )


class BearerChallenge:
    """The 401 for a request to ``/mcp`` whose bearer token is missing or refused, saying which
    (RFC 6750 ``error_description``): none sent, expired, issued for another resource (another
    port, another server), badly signed or malformed, or revoked by the host's operator where
    the host keeps its revocation list at the transport (``revoked``; elsewhere each call says
    ``AUTHORIZATION_REVOKED``). Never the token itself."""

    def __init__(
        self,
        verifier: ClaimsVerifier,
        resource: str,
        revoked: Callable[[str, VerifiedClaims], bool] | None = None,
    ) -> None:
        self._verifier = verifier
        self._resource = resource
        self._revoked = revoked
        self._metadata = str(build_resource_metadata_url(AnyHttpUrl(resource)))

    def refusal(self, authorization: str | None) -> str | None:
        """Why the request is refused (one sentence), or None when its token verifies."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "no bearer token was sent: send Authorization: Bearer <token>"
        try:
            claims = self._verifier.verify(token.strip())
        except InvalidToken as refused:
            if refused.reason == "expired":
                return "the bearer token has expired: get a new one"
            if refused.reason == "audience":
                return (
                    "the bearer token was issued for another resource (audience), e.g. another"
                    f" port: this server is {self._resource}"
                )
            return str(refused)
        if self._revoked is not None and self._revoked(token.strip(), claims):
            return "the bearer token was revoked by the host's operator: ask them for a new one"
        return None

    async def send(self, description: str, scope: Scope, receive: Receive, send: Send) -> None:
        quoted = description.replace("\\", "").replace('"', "'")
        challenge = (
            f'Bearer error="invalid_token", error_description="{quoted}",'
            f' resource_metadata="{self._metadata}"'
        )
        body = {"error": "invalid_token", "error_description": description}
        await JSONResponse(body, 401, headers={"WWW-Authenticate": challenge})(scope, receive, send)


def _issuer_url(issuer: str, resource: str) -> str:
    parsed = urlparse(issuer)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return issuer
    resource_url = urlparse(resource)
    return f"{resource_url.scheme}://{resource_url.netloc}"  # a local issuer has no URL of its own


def authorization_servers(issuer: str) -> list[str]:
    """The authorization servers to advertise (RFC 9728): the issuer when it is a URL (a cloud
    identity provider serving its own metadata), none for the embedded host's local issuer —
    it mints tokens from the command line and serves no OAuth metadata, so naming it would send
    clients into an OAuth flow that cannot succeed."""
    parsed = urlparse(issuer)
    return [issuer] if parsed.scheme in ("http", "https") and parsed.netloc else []


def _metadata_routes(resource: str, issuer: str) -> list[Route]:
    """RFC 9728 protected-resource metadata at the root and the path-specific well-known URI."""
    document: dict[str, Any] = {"resource": resource}
    servers = authorization_servers(issuer)
    if servers:
        document["authorization_servers"] = servers
    document |= {"bearer_methods_supported": ["header"], "resource_name": "Engram Memory"}

    async def metadata(_request: Request) -> Response:
        return JSONResponse(document, headers={"Cache-Control": "public, max-age=3600"})

    endpoint = cors_middleware(metadata, ["GET", "OPTIONS"])
    path = urlparse(resource).path.rstrip("/")
    return [
        Route(WELL_KNOWN + suffix, endpoint=endpoint, methods=["GET", "OPTIONS"])
        for suffix in dict.fromkeys(["", path])
    ]


def streamable_app(
    surface: EngramMcp, *, stateless: bool, allowed_hosts: list[str], bind_host: str
) -> McpGate:
    """The SDK's Streamable HTTP app behind the gate: bearer auth, RFC 9728 metadata (ours,
    served before the SDK's own), exact Host and Origin checks, screened JSON-RPC bodies."""
    host = surface.runtime.host
    app: Starlette = surface.server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=stateless,
        json_response=stateless,
        token_verifier=BearerVerifier(surface.runtime.verifier),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(_issuer_url(host.issuer, host.resource)),
            resource_server_url=AnyHttpUrl(host.resource),
            validate_token_resource=False,  # the verifier checks the audience itself
        ),
        # Host and Origin are checked by the gate, exactly (the SDK matches patterns by prefix).
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        host=bind_host,
        # An idle session's memory comes back; its id then answers 404 (the client re-opens).
        session_idle_timeout=None if stateless else host.http_session_idle_s,
    )
    app.router.routes[:0] = _metadata_routes(host.resource, host.issuer)
    app.router.lifespan_context = _stopping_waits(surface, app.router.lifespan_context)
    return McpGate(
        app,
        allowed_hosts=allowed_hosts,
        origin_allowed=host.origin_allowed,
        bearer=BearerChallenge(surface.runtime.verifier, host.resource, surface.revoked),
    )


def _stopping_waits(
    surface: EngramMcp, lifespan: Callable[[Any], AbstractAsyncContextManager[Any]]
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """The app's lifespan, waking the calls that wait on a human's answer when it ends.

    The SDK's session manager cancels its sessions when its lifespan ends and then waits for
    them; a call waiting on an answer is shielded from that cancellation (``EngramMcp``), so it
    is woken first (``stop_waiting``), before the manager waits."""

    @contextlib.asynccontextmanager
    async def stopping(app: Any) -> AsyncIterator[Any]:
        async with lifespan(app) as state:
            try:
                yield state
            finally:
                surface.stop_waiting()

    return stopping


# A host's own pages beside ``/mcp`` (the embedded approval page), given the Host values served.
HostRoutes = Callable[[list[str]], Sequence[BaseRoute]]


def http_app(surface: EngramMcp, *, bind_host: str, routes: HostRoutes | None = None) -> McpGate:
    """The ASGI app serving ``/mcp`` and the protected-resource metadata (embedded host), and
    the caller's ``routes`` on the same loopback address.

    An engine that takes work for the idle time (``IdleWorkHost``) has it run once each MCP
    answer has left (``McpGate.after_response``), as the stdio server runs it once each message
    is on the pipe."""
    resource_host = urlparse(surface.runtime.host.resource).netloc
    hosts = sorted({f"{bind_host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*", resource_host})
    # 2025-11-25 needs the session's stream for elicitation/create: not stateless.
    gate = streamable_app(surface, stateless=False, allowed_hosts=hosts, bind_host=bind_host)
    engine = surface.runtime.engine
    if isinstance(engine, IdleWorkHost):
        engine.accept_idle_work()
        gate.after_response = engine.run_idle_work
    if routes is not None:
        gate.app.router.routes[:0] = routes(hosts)
    return gate


class McpGate:
    """ASGI middleware in front of the SDK's app, for the MCP endpoint:

    - A bearer token that is missing or does not verify is a 401 saying why (``BearerChallenge``).
    - ``Host`` must name an allowed host exactly (else 421) and ``Origin``, when sent, an allowed
      origin exactly (else 403): host and port parsed and compared whole, never by prefix.
    - A POSTed JSON body is screened (``wire.screen``): one JSON-RPC object in JSON the contract
      accepts, or a 400 with a constant JSON-RPC error.

    ``after_response``, when set, runs once the last byte of the answer to a screened POST has
    been handed to the server (the host's idle work, ``engine.idle``): the client already has its
    answer, and the work is done while it reads it and sends its next call.
    """

    after_response: Callable[[], None] | None = None

    def __init__(
        self,
        app: Any,
        *,
        allowed_hosts: list[str],
        origin_allowed: Callable[[str], bool],
        bearer: BearerChallenge | None = None,
    ) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts
        self.origin_allowed = origin_allowed
        self.bearer = bearer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != MCP_PATH:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not host_matches(headers.get("host", ""), self.allowed_hosts):
            log.warning("refused a request addressed to a foreign Host")
            await PlainTextResponse("Invalid Host header", 421)(scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin):
            log.warning("refused a request from a foreign Origin")
            await PlainTextResponse("Invalid Origin header", 403)(scope, receive, send)
            return
        if self.bearer is not None and scope["method"] != "OPTIONS":
            refusal = await anyio.to_thread.run_sync(
                self.bearer.refusal, headers.get("authorization")
            )
            if refusal is not None:
                await self.bearer.send(refusal, scope, receive, send)
                return
        content_type = headers.get("content-type", "").lower()
        if scope["method"] != "POST" or not content_type.startswith("application/json"):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive, MAX_BODY_BYTES)
        if body is None:
            await PlainTextResponse("Request body too large", 413)(scope, receive, send)
            return
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        screened = Screened(error=error_body(PARSE_ERROR)) if text is None else screen(text)
        if screened.error is not None or screened.text is None:
            await JSONResponse(screened.error, 400)(scope, receive, send)
            return
        replay = body if screened.text is text else screened.text.encode("utf-8")
        after = self.after_response
        await self.app(
            scope, _replaying(replay, receive), send if after is None else _then(send, after)
        )


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is larger than ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _then(send: Send, after_response: Callable[[], None]) -> Send:
    """``send``, running ``after_response`` once the response's last body message is sent (on
    the loop, as the stdio server runs it: the work it does would otherwise be done by the call
    that follows, on the same engine)."""

    async def sending(message: Message) -> None:
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            after_response()

    return sending


def _replaying(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def serve_stdio(surface: EngramMcp) -> None:
    """Serve on stdin/stdout. Every line is screened (``wire.screen``) before the SDK reads it; a
    refused line is answered with its constant JSON-RPC error. While serving, file descriptor 1
    points at stderr so that nothing but the protocol reaches the client (as the SDK does).

    The one client's calls run their engine work on the event loop (``engine_on_loop``): they
    are served in the order they arrive, as the engine's lock on a scope's writes would order
    most of them anyway, and each answer leaves without two thread hops."""
    surface.engine_on_loop = True
    engine = surface.runtime.engine
    idle = engine if isinstance(engine, IdleWorkHost) else None
    if idle is not None:
        idle.accept_idle_work()  # run below, once each message is on the pipe
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        async with (
            protocol_out(protocol_fd, idle.run_idle_work if idle is not None else None) as out,
            stdin_lines(sys.stdin.fileno()) as read,
        ):

            async def screened_lines() -> AsyncIterator[str]:
                async for line in read:
                    if not line.strip():
                        continue
                    screened = screen(line)
                    if screened.error is not None:
                        await out.write(json.dumps(screened.error) + "\n")
                    elif screened.text is not None:
                        yield screened.text

            lines = cast("anyio.AsyncFile[str]", _Lines(screened_lines()))
            async with stdio_server(stdin=lines, stdout=cast("anyio.AsyncFile[str]", out)) as (
                read_stream,
                write_stream,
            ):
                await surface.server.run(
                    read_stream, write_stream, surface.server.create_initialization_options()
                )
    finally:
        os.dup2(2, 1)


@dataclass
class _Lines:
    """An async iterable of lines, as ``stdio_server`` reads its ``stdin``."""

    lines: AsyncIterator[str]

    def __aiter__(self) -> AsyncIterator[str]:
        return self.lines


__all__: list[Any] = [
    "MCP_PATH",
    "BearerVerifier",
    "HostRoutes",
    "McpGate",
    "authorization_servers",
    "http_app",
    "serve_stdio",
    "streamable_app",
]

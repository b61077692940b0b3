"""Serving the MCP surface: Streamable HTTP (with bearer auth, RFC 9728 metadata and Origin
checks) and stdio (with the token from the environment)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from mcp.server.auth.handlers.metadata import ProtectedResourceMetadataHandler
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import cors_middleware
from mcp.server.auth.settings import AuthSettings
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.applications import Starlette
from starlette.routing import Route

from ..host.tokens import InvalidToken, TokenVerifier
from .server import EngramMcp

MCP_PATH = "/mcp"


class BearerVerifier:
    """The SDK's ``TokenVerifier``: a token that does not verify is a 401 at the transport."""

    def __init__(self, verifier: TokenVerifier) -> None:
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
            expires_at=claims.expires_at,
            resource=claims.audience,
            subject=claims.subject,
            claims={"iss": claims.issuer},
        )


def _issuer_url(issuer: str, resource: str) -> str:
    parsed = urlparse(issuer)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return issuer
    resource_url = urlparse(resource)
    return f"{resource_url.scheme}://{resource_url.netloc}"  # a local issuer has no URL of its own


def http_app(surface: EngramMcp, *, bind_host: str) -> Starlette:
    """The ASGI app serving ``/mcp`` and the protected-resource metadata."""
    host = surface.runtime.host
    issuer_url = _issuer_url(host.issuer, host.resource)
    metadata = ProtectedResourceMetadata(
        resource=AnyHttpUrl(host.resource),
        authorization_servers=[AnyHttpUrl(issuer_url)],
        resource_name="Engram Memory",
    )
    # RFC 9728 path-specific metadata is served by the SDK; the contract also wants the root.
    root_metadata = Route(
        "/.well-known/oauth-protected-resource",
        endpoint=cors_middleware(
            ProtectedResourceMetadataHandler(metadata).handle, ["GET", "OPTIONS"]
        ),
        methods=["GET", "OPTIONS"],
    )
    hosts = sorted(
        {f"{bind_host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*", urlparse(host.resource).netloc}
    )
    app: Starlette = surface.server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        stateless_http=False,  # 2025-11-25 needs the session's stream for elicitation/create
        json_response=False,
        token_verifier=BearerVerifier(surface.runtime.verifier),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer_url),
            resource_server_url=AnyHttpUrl(host.resource),
            validate_token_resource=False,  # the verifier checks the audience itself
        ),
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=hosts,
            allowed_origins=list(host.allowed_origins),
        ),
        host=bind_host,
        custom_starlette_routes=[root_metadata],
    )
    return app


async def serve_stdio(surface: EngramMcp) -> None:
    async with stdio_server() as (read_stream, write_stream):
        await surface.server.run(
            read_stream, write_stream, surface.server.create_initialization_options()
        )


__all__: list[Any] = ["MCP_PATH", "BearerVerifier", "http_app", "serve_stdio"]

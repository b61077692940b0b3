"""A small OpenID Connect provider for tests: authorization code with PKCE (S256 only).

Discovery, ``/authorize`` (a sign-in page: the person picks who they are and presses Sign in),
``/token`` (single-use codes, bound to client, redirect URI and code challenge) and ``/jwks``.
ID tokens are EdDSA JWTs signed with an Ed25519 key, published with the project's own
``public_jwks``. Served by uvicorn on a free 127.0.0.1 port in a background thread.

ID tokens carry ``auth_time``: the sign-in's time, or — while ``signed_in_s_ago`` says the
browser holds an earlier session — that session's, unless the request's ``max_age`` (when the
provider ``honours_max_age``; Cognito does not) or ``prompt=login`` (``honours_prompt``) asks
for a fresh one.
``claims_for`` shapes a user's ID token as a provider would (Cognito's ``cognito:groups``,
Entra's ``idtyp``, Okta's ``cid``...; ``None`` removes a claim, e.g. ``auth_time``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import secrets
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx2
import jwt
import uvicorn
from bs4 import BeautifulSoup, Tag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from engram_memory.binding.tokens import key_id, public_jwks

from engram_testing import served


@dataclass
class _Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    nonce: str
    subject: str
    auth_time: int


@dataclass
class LocalOidcProvider:
    issuer: str = ""
    clients: dict[str, str] = field(default_factory=dict)  # client_id -> redirect_uri
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    codes: dict[str, _Grant] = field(default_factory=dict)
    extra_audiences: list[str] = field(default_factory=list)  # ID tokens' aud besides the client
    claims_for: dict[str, dict[str, Any]] = field(default_factory=dict)  # user -> ID-token claims
    signed_in_s_ago: int = 0  # the browser's session at the provider (0: none, a fresh sign-in)
    honours_max_age: bool = True
    honours_prompt: bool = True
    asked: list[dict[str, str]] = field(default_factory=list)  # each authorization request

    def reset(self) -> None:
        """Forget what a test set: its users' claims, the browser's session, what was asked."""
        self.claims_for.clear()
        self.signed_in_s_ago = 0
        self.honours_max_age = self.honours_prompt = True
        self.asked.clear()

    @property
    def kid(self) -> str:
        return key_id(self.key.public_key())

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/.well-known/openid-configuration", self.discovery),
                Route("/authorize", self.authorize, methods=["GET", "POST"]),
                Route("/token", self.token, methods=["POST"]),
                Route("/jwks", self.jwks),
            ]
        )

    async def discovery(self, _request: Request) -> Response:
        return JSONResponse(
            {
                "issuer": self.issuer,
                "authorization_endpoint": self.issuer + "/authorize",
                "token_endpoint": self.issuer + "/token",
                "jwks_uri": self.issuer + "/jwks",
                "response_types_supported": ["code"],
                "code_challenge_methods_supported": ["S256"],
                "id_token_signing_alg_values_supported": ["EdDSA"],
            }
        )

    async def jwks(self, _request: Request) -> Response:
        return JSONResponse(public_jwks(self.key, self.kid))

    async def authorize(self, request: Request) -> Response:
        params = dict(request.query_params)
        if request.method == "POST":
            params |= {k: str(v) for k, v in (await request.form()).items()}
        client_id = params.get("client_id", "")
        redirect_uri = params.get("redirect_uri", "")
        if self.clients.get(client_id) != redirect_uri:
            return HTMLResponse("<h1>Unknown client or redirect URI</h1>", 400)
        if params.get("code_challenge_method") != "S256" or not params.get("code_challenge"):
            return HTMLResponse("<h1>PKCE (S256) is required</h1>", 400)
        if request.method == "GET":  # the sign-in page
            self.asked.append(params)
            hidden = "".join(
                f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
                for k, v in params.items()
            )
            return HTMLResponse(
                "<!doctype html><title>Sign in</title><form method=post>"
                f'{hidden}<label>User <input name="username" id="username"></label>'
                '<button type="submit" id="sign-in">Sign in</button></form>'
            )
        code = secrets.token_urlsafe(24)
        self.codes[code] = _Grant(
            client_id=client_id,
            redirect_uri=redirect_uri,
            challenge=params["code_challenge"],
            nonce=params.get("nonce", ""),
            subject=params.get("username", ""),
            auth_time=self._auth_time(params),
        )
        query = urlencode({"code": code, "state": params.get("state", "")})
        return RedirectResponse(f"{redirect_uri}?{query}", 303)

    def _auth_time(self, params: dict[str, str]) -> int:
        """When the person signed in: now, or the browser's earlier session when the request
        lets the provider reuse it."""
        now = int(time.time())
        max_age = params.get("max_age")
        fresh = (self.honours_prompt and params.get("prompt") == "login") or (
            self.honours_max_age and max_age is not None and self.signed_in_s_ago > int(max_age)
        )
        return now if fresh else now - self.signed_in_s_ago

    async def token(self, request: Request) -> Response:
        form = {k: str(v) for k, v in (await request.form()).items()}
        grant = self.codes.pop(form.get("code", ""), None)  # single use
        if (
            grant is None
            or form.get("grant_type") != "authorization_code"
            or form.get("client_id") != grant.client_id
            or form.get("redirect_uri") != grant.redirect_uri
        ):
            return JSONResponse({"error": "invalid_grant"}, 400)
        verifier = form.get("code_verifier", "")
        challenge = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
            .decode()
            .rstrip("=")
        )
        if challenge != grant.challenge:
            return JSONResponse({"error": "invalid_grant"}, 400)
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": [grant.client_id, *self.extra_audiences]
            if self.extra_audiences
            else grant.client_id,
            "sub": grant.subject,
            "iat": now,
            "exp": now + 300,
            "nonce": grant.nonce,
            "auth_time": grant.auth_time,
        }
        for name, value in self.claims_for.get(grant.subject, {}).items():
            if value is None:
                claims.pop(name, None)
            else:
                claims[name] = value
        id_token = jwt.encode(claims, self.key, algorithm="EdDSA", headers={"kid": self.kid})
        return JSONResponse({"id_token": id_token, "token_type": "Bearer", "expires_in": 300})


def sign_in(authorization_url: str, username: str, *, verify: ssl.SSLContext | bool = True) -> str:
    """What the person does at the provider: open its sign-in page, type who they are, press
    Sign in. Where the provider sends the browser back (the redirect URI with code and state)."""
    page = httpx2.get(authorization_url, verify=verify, timeout=10)
    form = BeautifulSoup(page.text, "html.parser").find("form")
    assert isinstance(form, Tag), page.text
    fields = {str(i["name"]): str(i.get("value", "")) for i in form.find_all("input")}
    fields["username"] = username
    answer = httpx2.post(authorization_url.split("?")[0], data=fields, verify=verify, timeout=10)
    assert answer.status_code == 303
    return str(answer.headers["location"])


@contextlib.contextmanager
def serve_provider(
    clients: dict[str, str], *, tls: tuple[Path, Path] | None = None, host: str = "127.0.0.1"
) -> Iterator[LocalOidcProvider]:
    """The provider on a free loopback port; over HTTPS with ``tls`` (certificate, key), named
    ``host`` in its issuer (``localhost``: another site than ``127.0.0.1`` for a browser)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    scheme = "https" if tls else "http"
    provider = LocalOidcProvider(
        issuer=f"{scheme}://{host}:{sock.getsockname()[1]}", clients=clients
    )
    config = uvicorn.Config(
        provider.app(),
        log_level="warning",
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )
    server = uvicorn.Server(config)
    with served(server, sock, "the local OIDC provider", stop_s=10):
        yield provider

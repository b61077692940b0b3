"""Signing a person in to the cloud approval page: OpenID Connect authorization code with PKCE,
a short-lived session cookie, and the CSRF token of the page's form.

- ``OidcClient``: discovery (the issuer must name itself exactly), the authorization URL with
  ``state``, ``nonce`` and an S256 ``code_challenge``, the code exchange with the verifier, and
  the ID token checked against the issuer's JWKS (algorithm allow-list of ``tokens``, ``iss``,
  ``aud`` = the client id, ``nonce``, ``exp``/``iat`` with the same leeway). HTTP is injected
  (``Fetch``): the module makes no network call of its own, and tests use a local provider.
- ``SignedCookies``: the pending sign-in (state, nonce, verifier, where to return) and the signed-in
  session (the approver's subject and expiry), each an HMAC-signed value in a cookie that is
  ``HttpOnly; Secure; SameSite=Strict`` and short-lived. A tampered, expired or foreign cookie
  reads as absent.
- ``CookieKeys``: the MAC keys of the session secret's versions. The secret rotates
  (``cloud.session_rotation``); the current version signs, the current and the previous one
  verify, so a session signed just before a rotation stays valid until it expires.

The cloud approval function (``engram_memory.cloud.approval_page``) puts them together; they are
also tested on their own (tests/integration/test_approver_signin.py).

Why the pending sign-in cookie is ``SameSite=Lax`` and the session ``Strict``: the browser comes
back from the identity provider (another site) to the callback with a top-level GET, which
carries Lax cookies but never Strict ones. The session cookie is set on that callback and first
sent by the callback page's own navigation to the approval (same site), so it can be Strict.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import jwt

from engram_memory.binding.tokens import ALLOWED_ALGORITHMS, LEEWAY_S

# GET (form None) or POST form-encoded (form given) a URL; the decoded JSON object.
Fetch = Callable[[str, Mapping[str, str] | None], Mapping[str, Any]]
# The issuer's signing key named ``kid`` (``cloud.oidc.IssuerKeys``: cached JWKS), or None.
KeySource = Callable[[str], "jwt.PyJWK | None"]

SESSION_COOKIE: Final = "engram_approver"
SIGNIN_COOKIE: Final = "engram_signin"
SESSION_TTL_S: Final = 600  # a session lives long enough to answer a few approvals
SIGNIN_TTL_S: Final = 300
# Another container may rotate-read first: keys are read again this often, and sooner (at most
# every KEY_RETRY_S) when a cookie verifies under none of them.
KEY_REFRESH_S: Final = 300.0
KEY_RETRY_S: Final = 60.0
MIN_COOKIE_KEY_BYTES: Final = 32


class SignInFailed(Exception):
    """The sign-in cannot complete; the message is constant and holds no token or secret."""


def pkce_pair() -> tuple[str, str]:
    """A PKCE ``code_verifier`` (RFC 7636, 64 URL-safe characters) and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    return verifier, _b64(hashlib.sha256(verifier.encode("ascii")).digest())


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


@dataclass(frozen=True, slots=True)
class PendingSignIn:
    """What the browser keeps (signed, in ``SIGNIN_COOKIE``) between leaving and coming back."""

    state: str
    nonce: str
    verifier: str
    return_to: str


@dataclass(frozen=True, slots=True)
class Approver:
    subject: str
    expires_at: int


class OidcClient:
    """The approval page as a confidential-less OIDC client (PKCE, no client secret)."""

    def __init__(
        self,
        *,
        issuer: str,
        client_id: str,
        redirect_uri: str,
        fetch: Fetch,
        keys: KeySource,
        refused_audiences: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self.redirect_uri = redirect_uri
        self._fetch = fetch
        self._keys = keys
        # an ID token whose aud also names one of these (the MCP resource) is an agent's token
        self._refused_audiences = refused_audiences
        self._clock = clock
        self._metadata: ProviderMetadata | None = None

    def metadata(self) -> ProviderMetadata:
        if self._metadata is None:
            found = self._fetch(self.issuer.rstrip("/") + "/.well-known/openid-configuration", None)
            try:
                metadata = ProviderMetadata(
                    issuer=str(found["issuer"]),
                    authorization_endpoint=str(found["authorization_endpoint"]),
                    token_endpoint=str(found["token_endpoint"]),
                    jwks_uri=str(found["jwks_uri"]),
                )
            except KeyError:
                raise SignInFailed("the identity provider's metadata is incomplete") from None
            if metadata.issuer != self.issuer:  # OpenID Connect Discovery §4.3
                raise SignInFailed("the identity provider names another issuer")
            self._metadata = metadata
        return self._metadata

    def start(self, return_to: str) -> tuple[str, PendingSignIn]:
        """The authorization URL to send the browser to, and what to keep until it returns."""
        verifier, challenge = pkce_pair()
        pending = PendingSignIn(
            state=secrets.token_urlsafe(24),
            nonce=secrets.token_urlsafe(24),
            verifier=verifier,
            return_to=return_to,
        )
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.client_id,
                "redirect_uri": self.redirect_uri,
                "scope": "openid",
                "state": pending.state,
                "nonce": pending.nonce,
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        )
        return f"{self.metadata().authorization_endpoint}?{query}", pending

    def finish(self, *, code: str, state: str, pending: PendingSignIn) -> str:
        """Exchange the code (with the PKCE verifier) and return the verified ``sub``."""
        if not code or not hmac.compare_digest(state.encode(), pending.state.encode()):
            raise SignInFailed("the sign-in does not match the one this browser started")
        metadata = self.metadata()
        tokens = self._fetch(
            metadata.token_endpoint,
            {
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": self.redirect_uri,
                "client_id": self.client_id,
                "code_verifier": pending.verifier,
            },
        )
        id_token = tokens.get("id_token")
        if not isinstance(id_token, str):
            raise SignInFailed("the identity provider returned no ID token")
        claims = self._verify(id_token, metadata)
        if not hmac.compare_digest(str(claims.get("nonce", "")).encode(), pending.nonce.encode()):
            raise SignInFailed("the ID token was not issued for this sign-in (nonce)")
        audiences = claims.get("aud")
        named = {audiences} if isinstance(audiences, str) else set(audiences or [])
        if named & self._refused_audiences:
            raise SignInFailed("the ID token is also valid for the MCP endpoint (an agent's)")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise SignInFailed("the ID token names no subject")
        return subject

    def _verify(self, id_token: str, metadata: ProviderMetadata) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(id_token)
            key = self._keys(str(header.get("kid", "")))
            if key is None:
                raise SignInFailed("the ID token is signed with a key the issuer does not publish")
            if header.get("alg") not in ALLOWED_ALGORITHMS:
                raise SignInFailed("the ID token's algorithm is not accepted")
            claims: dict[str, Any] = jwt.decode(
                id_token,
                key.key,
                algorithms=[str(header["alg"])],
                audience=self.client_id,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["iss", "aud", "sub", "exp", "iat"]},
            )
        except (jwt.PyJWTError, KeyError, ValueError):
            raise SignInFailed("the ID token does not verify") from None
        return claims


class CookieKeys:
    """The cookie MAC keys, newest first: ``load`` reads them (the session secret's current and
    previous versions); the first signs, every one verifies."""

    def __init__(
        self,
        load: Callable[[], Sequence[bytes]],
        *,
        clock: Callable[[], float] = time.time,
        held: Sequence[bytes] | None = None,
    ) -> None:
        self._load = load
        self._clock = clock
        self._keys = self._checked(load() if held is None else held)
        self._read_at = clock()

    @staticmethod
    def _checked(keys: Sequence[bytes]) -> tuple[bytes, ...]:
        if not keys or any(len(key) < MIN_COOKIE_KEY_BYTES for key in keys):
            raise ValueError(f"a cookie key must be at least {MIN_COOKIE_KEY_BYTES} bytes")
        return tuple(keys)

    def all(self) -> tuple[bytes, ...]:
        if self._clock() - self._read_at >= KEY_REFRESH_S:
            self.reread()
        return self._keys

    def reread(self) -> bool:
        """Read the keys again unless they were read within ``KEY_RETRY_S``; whether they
        changed. A failed read keeps the keys held: the page goes on with what it knows."""
        if self._clock() - self._read_at < KEY_RETRY_S:
            return False
        self._read_at = self._clock()
        try:
            keys = self._checked(self._load())
        except Exception:  # the secret unreadable for a moment: the held keys still verify
            return False
        changed, self._keys = keys != self._keys, keys
        return changed


class SignedCookies:
    """HMAC-signed cookie values (not secret: they hold no token, only what they say)."""

    def __init__(self, key: bytes | CookieKeys, *, clock: Callable[[], float] = time.time) -> None:
        if isinstance(key, CookieKeys):
            self._keys = key
        else:
            fixed = (key,)
            self._keys = CookieKeys(lambda: fixed, clock=clock)
        self._clock = clock

    def _seal(self, purpose: str, body: Mapping[str, Any]) -> str:
        payload = _b64(json.dumps({"p": purpose, **body}, sort_keys=True).encode())
        mac = hmac.new(self._keys.all()[0], payload.encode(), hashlib.sha256).digest()
        return f"{payload}.{_b64(mac)}"

    def _verifies(self, payload: str, mac: str) -> bool:
        return any(
            hmac.compare_digest(
                mac.encode(),
                _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest()).encode(),
            )
            for key in self._keys.all()
        )

    def _open(self, purpose: str, value: str | None) -> dict[str, Any] | None:
        if not value or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        # a newer secret version another container signed with: read the versions once more
        if not self._verifies(payload, mac) and not (
            self._keys.reread() and self._verifies(payload, mac)
        ):
            return None
        try:
            body: dict[str, Any] = json.loads(_unb64(payload))
        except ValueError:
            return None
        if body.get("p") != purpose or int(body.get("exp", 0)) <= self._clock():
            return None
        return body

    @staticmethod
    def header(
        name: str, value: str, max_age: int, path: str = "/approvals", same_site: str = "Strict"
    ) -> str:
        """A ``Set-Cookie`` value: never readable by scripts, HTTPS only, never cross-site
        (``Lax`` only for the pending sign-in: see the module docstring)."""
        return (
            f"{name}={value}; Max-Age={max_age}; Path={path}; HttpOnly; Secure; "
            f"SameSite={same_site}"
        )

    @classmethod
    def cleared(cls, name: str) -> str:
        """A ``Set-Cookie`` value that removes cookie ``name``."""
        return cls.header(name, "", 0)

    def pending_cookie(self, pending: PendingSignIn) -> str:
        body = {
            "state": pending.state,
            "nonce": pending.nonce,
            "verifier": pending.verifier,
            "return_to": pending.return_to,
            "exp": int(self._clock()) + SIGNIN_TTL_S,
        }
        return self.header(SIGNIN_COOKIE, self._seal("signin", body), SIGNIN_TTL_S, same_site="Lax")

    def pending(self, value: str | None) -> PendingSignIn | None:
        body = self._open("signin", value)
        if body is None:
            return None
        return PendingSignIn(body["state"], body["nonce"], body["verifier"], body["return_to"])

    def session_cookie(self, subject: str) -> str:
        body = {"sub": subject, "exp": int(self._clock()) + SESSION_TTL_S}
        return self.header(SESSION_COOKIE, self._seal("session", body), SESSION_TTL_S)

    def approver(self, value: str | None) -> Approver | None:
        body = self._open("session", value)
        if body is None or not isinstance(body.get("sub"), str):
            return None
        return Approver(subject=body["sub"], expires_at=int(body["exp"]))


def cookie_value(cookie_header: str | None, name: str) -> str | None:
    """The value of cookie ``name`` in a ``Cookie`` request header."""
    for part in (cookie_header or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


__all__ = [
    "SESSION_COOKIE",
    "SIGNIN_COOKIE",
    "Approver",
    "Fetch",
    "KeySource",
    "OidcClient",
    "PendingSignIn",
    "ProviderMetadata",
    "SignInFailed",
    "SignedCookies",
    "cookie_value",
    "pkce_pair",
]

"""Signing a person in to the cloud approval page: OpenID Connect authorization code with PKCE,
a short-lived session cookie, and the CSRF token of the page's form.

- ``OidcClient``: discovery (the issuer must name itself exactly), the authorization URL with
  ``state``, ``nonce``, an S256 ``code_challenge`` and ``max_age`` (``prompt=login`` too when a
  sign-in is asked again), the code exchange with the verifier, and the ID token checked against
  the issuer's JWKS (algorithm allow-list of ``tokens``, ``iss``, ``aud`` = the client id,
  ``nonce``, ``exp``/``iat`` with the same leeway), then as a person's (``PersonRule``, below).
  HTTP is injected (``Fetch``): the module makes no network call of its own, and tests use a
  local provider.
- ``PersonRule``: the approver is never an agent. An ID token is refused (``NotAPerson``) when its
  groups claim lists the agents' group, when it is an application's (Entra ``idtyp: app``, a
  client-credentials grant, a ``token_use`` other than ``id``, a ``sub`` that is the client id
  ``azp``/``cid``/``client_id``/``appid`` name), when the provider left the groups out (an overage:
  ``hasgroups`` or a distributed ``_claim_names`` entry), and when it carries no ``auth_time`` (no
  interactive sign-in). An ``auth_time`` older than ``max_age`` (with the leeway) is
  ``StaleSignIn``: the provider reused an earlier session (Cognito ignores ``max_age``), and the
  page asks once more with ``prompt=login``.
- ``SignedCookies``: the pending sign-in (state, nonce, verifier, where to return, whether it
  already asked with ``prompt=login``) and the signed-in session (the approver's subject, the
  sign-in's ``auth_time`` and the expiry), each an HMAC-signed value in a cookie that is
  ``HttpOnly; Secure; SameSite=Strict`` and short-lived. A tampered, expired or foreign cookie
  reads as absent, and so does a session without an ``auth_time`` (signed before these checks).
- ``CookieKeys``: the MAC keys of the session secret's versions. The secret rotates
  (``cloud.secret_rotation``); the current version signs, the current and the previous one
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
from engram_memory.engine.keyring import KeyRing

# GET (form None) or POST form-encoded (form given) a URL; the decoded JSON object.
Fetch = Callable[[str, Mapping[str, str] | None], Mapping[str, Any]]
# The issuer's signing key named ``kid`` (``cloud.oidc.IssuerKeys``: cached JWKS), or None.
KeySource = Callable[[str], "jwt.PyJWK | None"]

SESSION_COOKIE: Final = "engram_approver"
SIGNIN_COOKIE: Final = "engram_signin"
SESSION_TTL_S: Final = 600  # a session lives long enough to answer a few approvals
SIGNIN_TTL_S: Final = 300
MIN_COOKIE_KEY_BYTES: Final = 32
# The authorization request's max_age: the person signed in (typed a password, used a key) at
# most this long before the ID token; auth_time is held to it, with the tokens' leeway.
SIGN_IN_MAX_AGE_S: Final = 300
# Claims that name the OAuth client: an ID token whose sub is one of them is an application's.
_CLIENT_CLAIMS: Final = ("azp", "cid", "client_id", "appid")


class SignInFailed(Exception):
    """The sign-in cannot complete; the message is constant and holds no token or secret."""


class NotAPerson(SignInFailed):
    """The ID token is an agent's or an application's, or comes from no interactive sign-in:
    it never answers a confirmation (the message names the reason, never a claim's value)."""


class StaleSignIn(SignInFailed):
    """The ID token's ``auth_time`` is older than ``max_age``: the provider reused a session."""


@dataclass(frozen=True, slots=True)
class PersonRule:
    """What makes an ID token a person's: not in ``agents_group`` (listed by ``groups_claim``),
    not an application's, signed in interactively within ``max_age_s`` (see the module doc)."""

    groups_claim: str = "groups"
    agents_group: str = "engram-agents"
    max_age_s: int = SIGN_IN_MAX_AGE_S

    def auth_time(self, claims: Mapping[str, Any], now: float) -> int:
        """The sign-in's ``auth_time`` when ``claims`` are a person's fresh sign-in; else
        ``NotAPerson`` or ``StaleSignIn``."""
        if claims.get("idtyp") == "app" or claims.get("gty") == "client-credentials":
            raise NotAPerson("the ID token is an application's, not a person's")
        if claims.get("token_use", "id") != "id":
            raise NotAPerson("the token is not an ID token")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise SignInFailed("the ID token names no subject")
        if any(claims.get(name) == subject for name in _CLIENT_CLAIMS):
            raise NotAPerson("the ID token's subject is an application (a client id)")
        if self.agents_group in self._groups(claims):
            raise NotAPerson("the ID token is an agent's (a member of the agents' group)")
        auth_time = claims.get("auth_time")
        if isinstance(auth_time, bool) or not isinstance(auth_time, int | float):
            raise NotAPerson("the ID token names no interactive sign-in (auth_time)")
        if auth_time > now + LEEWAY_S:
            raise SignInFailed("the ID token's sign-in is in the future (auth_time)")
        if now - auth_time > self.max_age_s + LEEWAY_S:
            raise StaleSignIn("the ID token's sign-in is older than max_age (auth_time)")
        return int(auth_time)

    def _groups(self, claims: Mapping[str, Any]) -> list[str]:
        """The groups the token lists; ``NotAPerson`` when the provider left them out (an
        overage) or wrote something else than names."""
        distributed = claims.get("_claim_names")
        if claims.get("hasgroups") is not None or (
            isinstance(distributed, Mapping) and self.groups_claim in distributed
        ):
            raise NotAPerson("the ID token leaves the groups out (an overage): cannot tell")
        groups = claims.get(self.groups_claim)
        if groups is None:
            return []
        if isinstance(groups, str):
            return [groups]
        if isinstance(groups, list) and all(isinstance(group, str) for group in groups):
            return groups
        raise NotAPerson("the ID token's groups claim is not a list of names")


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A person's verified sign-in: its ``sub`` and when they signed in (``auth_time``)."""

    subject: str
    auth_time: int


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
    forced: bool = False  # asked with prompt=login (once: a stale sign-in is not asked again)


@dataclass(frozen=True, slots=True)
class Approver:
    """A signed-in session: the person's subject, when they signed in, when it ends."""

    subject: str
    expires_at: int
    auth_time: int


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
        person: PersonRule = PersonRule(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.issuer = issuer
        self.client_id = client_id
        self.redirect_uri = redirect_uri
        self._fetch = fetch
        self._keys = keys
        # an ID token whose aud also names one of these (the MCP resource) is an agent's token
        self._refused_audiences = refused_audiences
        self.person = person
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

    def start(self, return_to: str, *, force_login: bool = False) -> tuple[str, PendingSignIn]:
        """The authorization URL to send the browser to, and what to keep until it returns.

        It asks for a sign-in no older than ``max_age``; ``force_login`` adds ``prompt=login``
        (a provider that ignores ``max_age`` still asks the person to sign in again)."""
        verifier, challenge = pkce_pair()
        pending = PendingSignIn(
            state=secrets.token_urlsafe(24),
            nonce=secrets.token_urlsafe(24),
            verifier=verifier,
            return_to=return_to,
            forced=force_login,
        )
        query = {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": "openid",
            "state": pending.state,
            "nonce": pending.nonce,
            "code_challenge": challenge,
            "code_challenge_method": "S256",
            "max_age": str(self.person.max_age_s),
        }
        if force_login:
            query["prompt"] = "login"
        return f"{self.metadata().authorization_endpoint}?{urlencode(query)}", pending

    def finish(self, *, code: str, state: str, pending: PendingSignIn) -> SignedIn:
        """Exchange the code (with the PKCE verifier) and return the verified person's sign-in:
        ``SignInFailed``, or its kinds ``NotAPerson`` and ``StaleSignIn`` (see ``PersonRule``)."""
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
        return SignedIn(subject, self.person.auth_time(claims, self._clock()))

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


class CookieKeys(KeyRing):
    """The cookie MAC keys, newest first: ``load`` reads them (the session secret's current and
    previous versions); the first signs, every one verifies (``engine.keyring.KeyRing``)."""

    def __init__(
        self,
        load: Callable[[], Sequence[bytes]],
        *,
        clock: Callable[[], float] = time.time,
        held: Sequence[bytes] | None = None,
    ) -> None:
        super().__init__(load, minimum=MIN_COOKIE_KEY_BYTES, clock=clock, held=held)


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
            "forced": pending.forced,
            "exp": int(self._clock()) + SIGNIN_TTL_S,
        }
        return self.header(SIGNIN_COOKIE, self._seal("signin", body), SIGNIN_TTL_S, same_site="Lax")

    def pending(self, value: str | None) -> PendingSignIn | None:
        body = self._open("signin", value)
        if body is None:
            return None
        return PendingSignIn(
            body["state"],
            body["nonce"],
            body["verifier"],
            body["return_to"],
            forced=body.get("forced") is True,
        )

    def session_cookie(self, signed_in: SignedIn) -> str:
        """The session of a person's verified sign-in (what the page's answer check reads)."""
        body = {
            "sub": signed_in.subject,
            "auth_time": signed_in.auth_time,
            "exp": int(self._clock()) + SESSION_TTL_S,
        }
        return self.header(SESSION_COOKIE, self._seal("session", body), SESSION_TTL_S)

    def approver(self, value: str | None) -> Approver | None:
        """The signed-in person; None for no session, and for one signed before the person
        checks (no ``auth_time``): that browser signs in again."""
        body = self._open("session", value)
        if body is None or not isinstance(body.get("sub"), str):
            return None
        auth_time = body.get("auth_time")
        if isinstance(auth_time, bool) or not isinstance(auth_time, int):
            return None
        return Approver(subject=body["sub"], expires_at=int(body["exp"]), auth_time=auth_time)


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
    "SIGN_IN_MAX_AGE_S",
    "Approver",
    "Fetch",
    "KeySource",
    "NotAPerson",
    "OidcClient",
    "PendingSignIn",
    "PersonRule",
    "ProviderMetadata",
    "SignInFailed",
    "SignedCookies",
    "SignedIn",
    "StaleSignIn",
    "cookie_value",
    "pkce_pair",
]

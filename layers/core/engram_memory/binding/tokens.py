"""Bearer tokens: the local issuer key, minting, verification, and claims → ``TrustedContext``.

CONTRACT.md §1: every HTTP request carries ``Authorization: Bearer <JWT>``, an access token whose
``aud`` is this service's resource URI (§12). Its verified claims are the trusted context.

Two steps, two failures:

- ``TokenVerifier.verify`` answers "is this an authentic, current token for this service?": the
  signature (algorithm allow-list ``EdDSA``, ``RS256``, ``ES256``; the algorithm is fixed by the
  key, never chosen by the token), ``iss``, ``aud`` (exactly the configured resource, or exactly
  one of its configured aliases: the client id an Entra ID v2 or Cognito token names), ``exp``,
  ``nbf`` and ``iat`` with a 30 s leeway, and the presence of the required claims. Any failure is
  ``InvalidToken``.
- ``context_from_claims`` answers "does this authentic token bind a usable context for this
  host?": the tenant, the claim types, the grant names, no maintenance grant. A failure is the
  protocol refusal ``TrustedContextUnavailable`` (``-32603``).

No message or exception raised here ever contains the token. There are no network calls in this
module: for an external identity provider, the caller fetches its JWKS and passes the dict, or
passes a key source (``TokenVerifier.from_key_source``; ``cloud/oidc.py`` is the one that follows
the issuer's OIDC discovery document and its key rotations).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NoReturn, TypeAlias

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engram_memory.binding.host_config import HostConfig
from engram_memory.contract.errors import RefusalReason, TrustedContextUnavailable
from engram_memory.engine.context import (
    CONFIRMABLE,
    TOOLS,
    RetentionPolicy,
    Scope,
    TrustedContext,
)

__all__ = [
    "ALLOWED_ALGORITHMS",
    "LEEWAY_S",
    "REQUIRED_CLAIMS",
    "InvalidToken",
    "PublicKey",
    "TokenIssuer",
    "TokenVerifier",
    "VerifiedClaims",
    "context_from_claims",
    "key_id",
    "public_jwks",
    "refusal_of",
]

LEEWAY_S: Final = 30
ALLOWED_ALGORITHMS: Final = ("EdDSA", "RS256", "ES256")
REQUIRED_CLAIMS: Final = (
    "iss",
    "aud",
    "sub",
    "iat",
    "exp",
    "tenant_id",
    "workspace_id",
    "purpose_ref",
)
JWT_TYP: Final = "at+jwt"  # RFC 9068 access-token header type
MAX_TOKEN_CHARS: Final = 16_384
_MIN_RSA_BITS: Final = 2048
_ENGRAM_CLAIMS: Final = frozenset(
    {
        "tenant_id",
        "workspace_id",
        "purpose_ref",
        "agent_id",
        "sid",
        "engram_tools",
        "engram_confirm",
        "engram_retention",
        "engram_reconcile",
    }
)
_REGISTERED_CLAIMS: Final = frozenset({"iss", "aud", "sub", "iat", "nbf", "exp", "jti"})
# Claims that can carry an operations-plane grant; a token holding one is not an agent token.
_GRANT_CLAIMS: Final = ("engram_grants", "scope", "scp")
_MAINTENANCE_GRANT: Final = "maintain"
_RETENTION_KEYS: Final = frozenset({"allow_retain", "max_expires_in_s"})

PublicKey: TypeAlias = Ed25519PublicKey | rsa.RSAPublicKey | ec.EllipticCurvePublicKey
KeySource: TypeAlias = Callable[[str], "jwt.PyJWK | None"]
"""``kid`` -> the issuer's signing key with that id, or None when the issuer has none."""


class InvalidToken(Exception):
    """The bearer token is missing, malformed, badly signed, expired or not meant for us.

    ``reason`` is a short constant code (``malformed``, ``algorithm``, ``unknown_key``,
    ``signature``, ``expired``, ``not_yet_valid``, ``audience``, ``issuer``, ``missing_claim``,
    ``token_type``);
    the message is a constant sentence for a person. Neither ever holds the token.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Keys
# --------------------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(
        encoding=serialization.Encoding.Raw, format=serialization.PublicFormat.Raw
    )


def key_id(public_key: Ed25519PublicKey) -> str:
    """The RFC 7638 JWK thumbprint of an Ed25519 public key: a stable ``kid``."""
    members = {"crv": "Ed25519", "kty": "OKP", "x": _b64url(_raw_public(public_key))}
    canonical = json.dumps(members, separators=(",", ":"), sort_keys=True).encode("ascii")
    return _b64url(hashlib.sha256(canonical).digest())


def public_jwks(private_key: Ed25519PrivateKey, kid: str) -> dict[str, Any]:
    """The JWKS publishing the public half of ``private_key`` under ``kid`` (no private part)."""
    return {
        "keys": [
            {
                "kty": "OKP",
                "crv": "Ed25519",
                "x": _b64url(_raw_public(private_key.public_key())),
                "kid": kid,
                "alg": "EdDSA",
                "use": "sig",
            }
        ]
    }


# --------------------------------------------------------------------------------------------
# Minting
# --------------------------------------------------------------------------------------------


def _nonempty(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _tool_names(name: str, values: Sequence[str]) -> list[str]:
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{name} must be a sequence of tool names")
    unknown = sorted(set(values) - set(TOOLS))
    if unknown:
        raise ValueError(
            f"unknown tool name(s) in {name}: {', '.join(unknown)}"
            f" (grant names are {', '.join(TOOLS)})"
        )
    return list(dict.fromkeys(values))


def _optional_claims(
    agent_id: str | None,
    session_id: str | None,
    retention: Mapping[str, Any] | None,
    reconcile: bool | None,
) -> dict[str, Any]:
    """The claims a token carries only when the issuer sets them, checked like the others."""
    claims: dict[str, Any] = {}
    if agent_id is not None:
        claims["agent_id"] = _nonempty("agent_id", agent_id)
    if session_id is not None:
        claims["sid"] = _nonempty("session_id", session_id)
    if retention is not None:
        policy = _retention_claim(retention)
        if policy is None:
            raise ValueError(
                "retention must be {'allow_retain': bool, 'max_expires_in_s': int >= 0}"
            )
        claims["engram_retention"] = {
            "allow_retain": policy.allow_retain,
            "max_expires_in_s": policy.max_expires_in_s,
        }
    if reconcile is not None:
        if not isinstance(reconcile, bool):
            raise ValueError("reconcile must be a boolean")
        claims["engram_reconcile"] = reconcile
    return claims


def _token_id() -> str:
    # Prefixed: a bare URL-safe id begins with "-" one time in 64, which command lines read as a flag.
    return f"tok_{secrets.token_urlsafe(18)}"


class TokenIssuer:
    """Mints EdDSA access tokens for this service (the embedded host's authorization server)."""

    def __init__(
        self, private_key: Ed25519PrivateKey, *, issuer: str, audience: str, kid: str
    ) -> None:
        if not isinstance(private_key, Ed25519PrivateKey):
            raise TypeError("the issuer key must be an Ed25519 private key")
        self._key = private_key
        self.issuer = _nonempty("issuer", issuer)
        self.audience = _nonempty("audience", audience)
        self.kid = _nonempty("kid", kid)

    def public_jwks(self) -> dict[str, Any]:
        """The JWKS a verifier of this issuer's tokens needs."""
        return public_jwks(self._key, self.kid)

    def mint(
        self,
        *,
        principal: str,
        tenant_id: str,
        workspace_id: str,
        purpose_ref: str,
        tools: Sequence[str],
        confirm: Sequence[str] = (),
        expires_in_s: int,
        agent_id: str | None = None,
        session_id: str | None = None,
        retention: Mapping[str, Any] | None = None,
        reconcile: bool | None = None,
        now: int | None = None,
    ) -> str:
        """A signed token carrying the claims of CONTRACT.md §1 (header ``kid``, ``typ``).

        Raises ``ValueError`` for an empty identifier, a tool name that is not one of the six,
        ``confirm`` not a subset of ``tools``, a non-positive lifetime, or a malformed retention
        policy (``{"allow_retain": bool, "max_expires_in_s": int >= 0}``).
        """
        granted = _tool_names("tools", tools)
        confirmed = _tool_names("confirm", confirm)
        outside = sorted(set(confirmed) - set(granted))
        if outside:
            raise ValueError(f"confirm lists tools that are not granted: {', '.join(outside)}")
        if isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int) or expires_in_s < 1:
            raise ValueError("expires_in_s must be a positive number of seconds")
        # `iat` to the millisecond (RFC 7519 allows a non-integer NumericDate): a revocation of
        # the principal is then exact, never refusing a token minted a moment after it.
        issued_ms = time.time_ns() // 1_000_000 if now is None else now * 1000
        if isinstance(now, bool) or not isinstance(issued_ms, int):
            raise ValueError("now must be an integer number of seconds")
        issued = issued_ms // 1000
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": self.audience,
            "sub": _nonempty("principal", principal),
            "iat": issued if now is not None else issued_ms / 1000,
            "nbf": issued,
            "exp": issued + expires_in_s,
            "jti": _token_id(),
            "tenant_id": _nonempty("tenant_id", tenant_id),
            "workspace_id": _nonempty("workspace_id", workspace_id),
            "purpose_ref": _nonempty("purpose_ref", purpose_ref),
            "engram_tools": granted,
            "engram_confirm": confirmed,
        }
        claims.update(_optional_claims(agent_id, session_id, retention, reconcile))
        return jwt.encode(
            claims, self._key, algorithm="EdDSA", headers={"kid": self.kid, "typ": JWT_TYP}
        )


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifiedClaims:
    """The claims of a token that passed ``TokenVerifier.verify``.

    The registered claims are typed and checked. The Engram claims are kept exactly as the token
    carried them (``None`` when absent): their types and values are for ``context_from_claims`` to
    judge, which refuses the context rather than the token. ``other`` holds every remaining
    claim (e.g. ``scope``, ``engram_grants``, ``client_id``), read-only.
    """

    issuer: str
    audience: str
    subject: str
    issued_at: int
    expires_at: int
    not_before: int | None
    token_id: str | None
    key_id: str | None
    algorithm: str
    tenant_id: object
    workspace_id: object
    purpose_ref: object
    agent_id: object = None
    session_id: object = None  # the `sid` claim
    engram_tools: object = None
    engram_confirm: object = None
    engram_retention: object = None
    engram_reconcile: object = None
    other: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    issued_at_ms: int | None = None  # `iat` to the millisecond, as the token carries it


@dataclass(frozen=True, slots=True)
class _VerificationKey:
    algorithm: str
    key: PublicKey | jwt.PyJWK


def _algorithm_for(public_key: object) -> str:
    if isinstance(public_key, Ed25519PublicKey):
        return "EdDSA"
    if isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size < _MIN_RSA_BITS:
            raise ValueError(f"RSA verification keys must have at least {_MIN_RSA_BITS} bits")
        return "RS256"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        if not isinstance(public_key.curve, ec.SECP256R1):
            raise ValueError("EC verification keys must be on P-256 (ES256)")
        return "ES256"
    raise TypeError("the verification key must be an Ed25519, RSA or P-256 public key")


def _jwk_key(entry: Mapping[str, Any]) -> _VerificationKey | None:
    """The verification key of one JWK, or None when it is not a signing key we accept."""
    if "d" in entry or "p" in entry or "k" in entry:
        raise ValueError("the JWKS holds private or symmetric key material")
    if entry.get("use", "sig") != "sig":
        return None
    key_ops = entry.get("key_ops")
    if key_ops is not None and (not isinstance(key_ops, list) or "verify" not in key_ops):
        return None
    alg = entry.get("alg")
    if alg is not None and alg not in ALLOWED_ALGORITHMS:
        return None
    try:
        parsed = jwt.PyJWK(dict(entry), algorithm=alg)
    except jwt.PyJWTError:
        return None
    return _parsed_key(parsed)


def _parsed_key(parsed: jwt.PyJWK) -> _VerificationKey | None:
    """The verification key of a parsed JWK, or None: an algorithm outside the allow-list, one
    that does not match the key (an RSA key claiming ES256), a private or symmetric key."""
    if parsed.algorithm_name not in ALLOWED_ALGORITHMS:
        return None
    try:
        expected = _algorithm_for(parsed.key)
    except (TypeError, ValueError):
        return None
    if expected != parsed.algorithm_name:
        return None
    return _VerificationKey(parsed.algorithm_name, parsed)


class TokenVerifier:
    """Verifies bearer tokens for one resource (``audience``) from one issuer.

    Build it with ``from_public_key`` (one key, any or no ``kid``), ``from_jwks`` (keys chosen by
    the token's ``kid``) or ``from_key_source`` (keys looked up by ``kid`` as tokens arrive).
    Instances are immutable and safe to share between threads (a key source must be too).
    """

    def __init__(
        self,
        keys: Mapping[str | None, _VerificationKey],
        *,
        issuer: str,
        audience: str,
        token_type: str | None = None,
        key_source: KeySource | None = None,
        audience_aliases: Sequence[str] = (),
    ) -> None:
        if not keys and key_source is None:
            raise ValueError("a token verifier needs at least one key")
        self._keys = dict(keys)
        self._key_source = key_source
        self.issuer = _nonempty("issuer", issuer)
        self.audience = _nonempty("audience", audience)
        # Other names of this same resource at the issuer (an Entra ID v2 access token's aud is
        # the API's client id, not its URL); a token still names exactly one of them.
        self.audience_aliases = tuple(_nonempty("audience alias", a) for a in audience_aliases)
        self.token_type = token_type
        self._jwt = jwt.PyJWT(options={"enforce_minimum_key_length": True})

    @classmethod
    def from_public_key(
        cls,
        public_key: PublicKey,
        *,
        issuer: str,
        audience: str,
        token_type: str | None = None,
    ) -> TokenVerifier:
        """A verifier trusting one key: Ed25519 (EdDSA), RSA >= 2048 bits (RS256) or P-256 (ES256).

        ``token_type``: the header ``typ`` every token must carry (e.g. ``at+jwt``), or None."""
        algorithm = _algorithm_for(public_key)
        return cls(
            {None: _VerificationKey(algorithm, public_key)},
            issuer=issuer,
            audience=audience,
            token_type=token_type,
        )

    @classmethod
    def from_jwks(
        cls,
        jwks: Mapping[str, Any],
        *,
        issuer: str,
        audience: str,
        token_type: str | None = None,
        audience_aliases: Sequence[str] = (),
    ) -> TokenVerifier:
        """A verifier trusting the signing keys of a JWKS (a dict the caller fetched or built).

        Keys without a ``kid``, with ``use`` other than ``sig``, or whose algorithm is not one of
        ``ALLOWED_ALGORITHMS`` are ignored. Raises ``ValueError`` when the JWKS is malformed,
        repeats a ``kid``, holds private key material, or has no usable key.
        """
        entries = jwks.get("keys") if isinstance(jwks, Mapping) else None
        if not isinstance(entries, list):
            raise ValueError("a JWKS is an object with a 'keys' list")
        keys: dict[str | None, _VerificationKey] = {}
        for entry in entries:
            if not isinstance(entry, Mapping):
                raise ValueError("every JWKS entry must be an object")
            kid = entry.get("kid")
            if not isinstance(kid, str) or not kid:
                continue
            key = _jwk_key(entry)
            if key is None:
                continue
            if kid in keys:
                raise ValueError(f"the JWKS repeats the kid {kid!r}")
            keys[kid] = key
        if not keys:
            raise ValueError(
                "the JWKS holds no usable signing key (EdDSA, RS256 or ES256, with a kid)"
            )
        return cls(
            keys,
            issuer=issuer,
            audience=audience,
            token_type=token_type,
            audience_aliases=audience_aliases,
        )

    @classmethod
    def from_key_source(
        cls,
        key_source: KeySource,
        *,
        issuer: str,
        audience: str,
        token_type: str | None = None,
        audience_aliases: Sequence[str] = (),
    ) -> TokenVerifier:
        """A verifier asking ``key_source`` for the key of each token's ``kid`` (e.g.
        ``oidc.IssuerKeys``: the issuer's current JWKS, refetched as it rotates). A key the source
        returns is held to the same rules as a JWKS entry (allow-listed algorithm matching the
        key, public keys only); ``unknown_key`` when it has none. The source may raise its own
        exception when it cannot reach the issuer."""
        return cls(
            {},
            issuer=issuer,
            audience=audience,
            token_type=token_type,
            key_source=key_source,
            audience_aliases=audience_aliases,
        )

    @property
    def has_key_source(self) -> bool:
        """Are its keys looked up as tokens arrive (they may change), rather than fixed?"""
        return self._key_source is not None

    def _key_for(self, kid: object) -> _VerificationKey:
        if self._key_source is not None:
            found = self._key_source(kid) if isinstance(kid, str) and kid else None
            key = _parsed_key(found) if found is not None else None
            if key is None:
                raise InvalidToken("unknown_key", "the bearer token was signed by an unknown key")
            return key
        if None in self._keys:
            return self._keys[None]
        if not isinstance(kid, str) or kid not in self._keys:
            raise InvalidToken("unknown_key", "the bearer token was signed by an unknown key")
        return self._keys[kid]

    def verify(self, token: str) -> VerifiedClaims:
        """Check ``token`` and return its claims; raises ``InvalidToken`` (see the module doc)."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise InvalidToken("malformed", "the bearer token is malformed")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("malformed", "the bearer token is malformed") from None
        alg = header.get("alg")
        if alg not in ALLOWED_ALGORITHMS:
            raise InvalidToken("algorithm", "the bearer token's signing algorithm is not accepted")
        if self.token_type is not None and not _is_type(header.get("typ"), self.token_type):
            raise InvalidToken("token_type", "the bearer token is not an access token (typ)")
        kid = header.get("kid")
        key = self._key_for(kid)
        if alg != key.algorithm:
            raise InvalidToken("algorithm", "the bearer token's signing algorithm is not accepted")
        payload = self._decode(token, key)
        return _claims(
            payload,
            key.algorithm,
            kid if isinstance(kid, str) else None,
            self.audience,
            self.audience_aliases,
        )

    def _decode(self, token: str, key: _VerificationKey) -> dict[str, Any]:
        try:
            payload: dict[str, Any] = self._jwt.decode(
                token,
                key.key,
                algorithms=[key.algorithm],
                audience=[self.audience, *self.audience_aliases],
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": list(REQUIRED_CLAIMS)},
            )
        except jwt.MissingRequiredClaimError as error:
            claim = error.claim if error.claim in REQUIRED_CLAIMS else "?"
            raise InvalidToken(
                "missing_claim", f"the bearer token lacks the required claim {claim}"
            ) from None
        except (jwt.PyJWTError, ValueError, TypeError, OverflowError) as error:
            reason, message = next(
                (refusal for kind, *refusal in _JWT_REFUSALS if isinstance(error, kind)),
                ("malformed", "the bearer token is malformed"),
            )
            raise InvalidToken(reason, message) from None
        if not isinstance(payload, dict):
            raise InvalidToken("malformed", "the bearer token is malformed")
        return payload


# PyJWT's refusals as this module's (reason, message); any other failure is a malformed token.
_JWT_REFUSALS: Final = (
    (jwt.ExpiredSignatureError, "expired", "the bearer token has expired"),
    (jwt.ImmatureSignatureError, "not_yet_valid", "the bearer token is not valid yet"),
    (
        jwt.InvalidAudienceError,
        "audience",
        "the bearer token was issued for another service (audience)",
    ),
    (jwt.InvalidIssuerError, "issuer", "the bearer token comes from an unknown issuer"),
    (jwt.InvalidSignatureError, "signature", "the bearer token's signature is not valid"),
    (
        jwt.InvalidAlgorithmError,
        "algorithm",
        "the bearer token's signing algorithm is not accepted",
    ),
)


def _is_type(typ: object, expected: str) -> bool:
    """RFC 7515 §4.1.9: ``typ`` compares case-insensitively, ``application/`` may be omitted."""
    if not isinstance(typ, str):
        return False
    typ = typ.lower()
    return typ.removeprefix("application/") == expected.lower()


def _numeric_date(payload: Mapping[str, Any], name: str) -> int | None:
    value = payload.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidToken("malformed", "the bearer token is malformed")
    return int(value)


def _claims(
    payload: Mapping[str, Any],
    algorithm: str,
    kid: str | None,
    audience: str,
    aliases: Sequence[str] = (),
) -> VerifiedClaims:
    aud = payload["aud"]
    named = aud[0] if isinstance(aud, list) and len(aud) == 1 else aud
    # Exactly this service: a token meant for several audiences could be replayed across them.
    if not isinstance(named, str) or (named != audience and named not in aliases):
        raise InvalidToken("audience", "the bearer token was issued for another service (audience)")
    issued_at = _numeric_date(payload, "iat")
    expires_at = _numeric_date(payload, "exp")
    if issued_at is None or expires_at is None:
        raise InvalidToken("malformed", "the bearer token is malformed")
    token_id = payload.get("jti")
    return VerifiedClaims(
        issuer=payload["iss"],
        audience=audience,
        subject=payload["sub"],
        issued_at=issued_at,
        issued_at_ms=round(payload["iat"] * 1000),
        expires_at=expires_at,
        not_before=_numeric_date(payload, "nbf"),
        token_id=token_id if isinstance(token_id, str) else None,
        key_id=kid,
        algorithm=algorithm,
        tenant_id=payload.get("tenant_id"),
        workspace_id=payload.get("workspace_id"),
        purpose_ref=payload.get("purpose_ref"),
        agent_id=payload.get("agent_id"),
        session_id=payload.get("sid"),
        engram_tools=payload.get("engram_tools"),
        engram_confirm=payload.get("engram_confirm"),
        engram_retention=payload.get("engram_retention"),
        engram_reconcile=payload.get("engram_reconcile"),
        other=MappingProxyType(
            {
                name: value
                for name, value in payload.items()
                if name not in _ENGRAM_CLAIMS and name not in _REGISTERED_CLAIMS
            }
        ),
    )


# --------------------------------------------------------------------------------------------
# Claims → TrustedContext
# --------------------------------------------------------------------------------------------


def refusal_of(error: InvalidToken) -> TrustedContextUnavailable:
    """The -32603 for a token the verifier refused (``InvalidToken``): ``token_expired`` when its
    ``exp`` passed (the host mints a new one), ``invalid_token`` for every other flaw."""
    expired = error.reason == "expired"
    return TrustedContextUnavailable(
        RefusalReason.TOKEN_EXPIRED if expired else RefusalReason.INVALID_TOKEN
    )


def _refuse(note: str, reason: RefusalReason = RefusalReason.INVALID_TOKEN) -> NoReturn:
    error = TrustedContextUnavailable(reason)
    # A note shows in tracebacks and logs; the JSON-RPC message stays the constant one, and
    # its data says only ``reason``.
    error.add_note(f"token refused on the agent path: {note}")
    raise error


def _id_claim(name: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        _refuse(f"claim {name} must be a non-empty string")
    return value


def _optional_id_claim(name: str, value: object) -> str | None:
    return None if value is None else _id_claim(name, value)


def _names(name: str, value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        _refuse(f"claim {name} must be a list of tool names")
    if not set(value) <= set(TOOLS):
        _refuse(f"claim {name} names a tool that is not one of the six")
    return frozenset(value)


def _grants(value: object) -> set[str]:
    if isinstance(value, str):
        return set(value.split())
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return set(value)
    _refuse("a grant claim has the wrong type")


def _retention_claim(value: object) -> RetentionPolicy | None:
    """The retention policy of an ``engram_retention`` value, or None when it is malformed."""
    if not isinstance(value, Mapping) or set(value) != _RETENTION_KEYS:
        return None
    allow, ceiling = value["allow_retain"], value["max_expires_in_s"]
    if not isinstance(allow, bool) or isinstance(ceiling, bool) or not isinstance(ceiling, int):
        return None
    if ceiling < 0:
        return None
    return RetentionPolicy(allow_retain=allow, max_expires_in_s=ceiling)


def _capped_retention(claim: object, ceiling: RetentionPolicy) -> RetentionPolicy:
    """The token's retention policy never looser than the host's ``ceiling``."""
    if claim is None:
        return ceiling
    requested = _retention_claim(claim)
    if requested is None:
        _refuse("claim engram_retention is malformed")
    return RetentionPolicy(
        allow_retain=requested.allow_retain and ceiling.allow_retain,
        max_expires_in_s=min(requested.max_expires_in_s, ceiling.max_expires_in_s),
    )


def context_from_claims(
    claims: VerifiedClaims,
    *,
    audit_id: str,
    host: HostConfig,
    deadline_ms: int | None = None,
    raw_token: str | None = None,
) -> TrustedContext:
    """The engine's trusted context for a call made with a verified token.

    Grants are ``engram_tools`` (absent or empty: memory disabled); ``confirm_required`` is
    ``engram_confirm`` ∩ {capture, request_admission}; retention is the token's policy capped by
    the host's (never looser: ``allow_retain`` only if both allow, the smaller ceiling; the host's
    when the token has none); reconciliation consent only if the token and the host both consent.
    ``raw_token`` becomes the context's host fact, so the admission policy rejects any memory that
    contains it. ``approver``: the claim ``host.approver_claim`` names (who answers the agent's
    confirmations on the cloud approval page), when the token carries one.

    Raises ``TrustedContextUnavailable`` when the token's tenant is not the host's, a claim has
    the wrong type, ``engram_tools`` or ``engram_confirm`` name something other than the six
    tools, or the token carries a maintenance grant (``maintain`` in ``engram_grants``, ``scope``
    or ``scp``).
    """
    for name in _GRANT_CLAIMS:
        value = claims.other.get(name)
        if value is not None and _MAINTENANCE_GRANT in _grants(value):
            _refuse("maintenance grant on the agent path", RefusalReason.MAINTENANCE_TOKEN)
    tenant_id = _id_claim("tenant_id", claims.tenant_id)
    if tenant_id != host.tenant_id:
        _refuse("the token's tenant is not this host's", RefusalReason.TENANT_MISMATCH)
    workspace_id = _id_claim("workspace_id", claims.workspace_id)
    purpose_ref = _id_claim("purpose_ref", claims.purpose_ref)
    principal = _id_claim("sub", claims.subject)
    agent_id = _optional_id_claim("agent_id", claims.agent_id)
    session_id = _optional_id_claim("sid", claims.session_id)
    grants = _names("engram_tools", claims.engram_tools)
    confirm = _names("engram_confirm", claims.engram_confirm) & CONFIRMABLE
    retention = _capped_retention(claims.engram_retention, host.retention_policy())
    reconcile = claims.engram_reconcile
    if reconcile is not None and not isinstance(reconcile, bool):
        _refuse("claim engram_reconcile must be a boolean")

    return TrustedContext.bound(
        Scope(tenant_id, workspace_id),
        principal,
        purpose_ref,
        audit_id=audit_id,
        grants=grants,
        confirm_required=confirm,
        retention=retention,
        reconcile_consent=reconcile is True and host.reconcile_consent,
        agent_id=agent_id,
        session_id=session_id,
        deadline_ms=deadline_ms,
        host_facts=(raw_token,) if raw_token else (),
        credential_id=claims.token_id,
        credential_issued_at_ms=claims.issued_at_ms or claims.issued_at * 1000,
        approver=_optional_id_claim(host.approver_claim, claims.other.get(host.approver_claim)),
    )

"""Agent tokens from real identity-provider shapes: OIDC discovery → ``jwks_uri`` → keys.

One HTTPS server on 127.0.0.1 (a throw-away certificate the key source is told to trust) plays
Okta, Entra ID and Keycloak: each provider's URLs are served under ``/<its host>/<its path>``
(``url_for`` maps ``https://x.okta.com/...`` there), with the discovery document and the JWKS
each provider publishes, and a count of every request. The server can rotate a provider's keys
or fail its JWKS. Time, for the JWKS cache and the refetch cooldown, is a fake clock the test
moves (PyJWT's own ``time`` references and the key source's clock), so no test sleeps.
"""

from __future__ import annotations

import json
import secrets
import ssl
import threading
import time
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from engram_memory.binding.tokens import InvalidToken, TokenVerifier
from engram_memory.cloud.oidc import IssuerKeys, IssuerKeysUnavailable, oidc_verifier
from scripts.cloud_run import self_signed

AUDIENCE: Final = "https://memory.example.com/mcp"
TENANT_ID: Final = "11111111-2222-4333-8444-555555555555"


@dataclass
class Provider:
    """One identity provider: its issuer, where it publishes its keys, and its signing keys."""

    name: str
    issuer: str
    jwks_uri: str
    with_alg: bool  # Entra's JWKS entries carry no "alg" (RS256 is implied by kty RSA)
    keys: dict[str, Any] = field(default_factory=dict)  # kid -> private key
    extra_entries: list[dict[str, Any]] = field(default_factory=list)

    def add_key(self, kid: str | None = None, curve: bool = False) -> str:
        kid = kid or secrets.token_urlsafe(12)
        self.keys[kid] = (
            ec.generate_private_key(ec.SECP256R1())
            if curve
            else rsa.generate_private_key(public_exponent=65537, key_size=2048)
        )
        return kid

    def jwks(self) -> dict[str, Any]:
        entries = []
        for kid, key in self.keys.items():
            algorithm = (
                jwt.algorithms.ECAlgorithm if isinstance(key, ec.EllipticCurvePrivateKey) else None
            )
            public = (
                algorithm.to_jwk(key.public_key(), as_dict=True)
                if algorithm
                else jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
            )
            public.update(kid=kid, use="sig")
            if self.with_alg:
                public["alg"] = "ES256" if algorithm else "RS256"
            entries.append(public)
        return {"keys": entries + self.extra_entries}

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "jwks_uri": self.jwks_uri,
            "authorization_endpoint": self.issuer + "/authorize",
            "id_token_signing_alg_values_supported": ["RS256"],
        }

    def token(self, kid: str, *, key: Any = None, **claims: Any) -> str:
        signing_key = key if key is not None else self.keys[kid]
        algorithm = "ES256" if isinstance(signing_key, ec.EllipticCurvePrivateKey) else "RS256"
        now = int(time.time())
        body = {
            "iss": self.issuer,
            "aud": AUDIENCE,
            "sub": "agent-alice",
            "iat": now,
            "exp": now + 600,
            "tenant_id": "acme",
            "workspace_id": "ws-0001",
            "purpose_ref": "purpose:general",
            **claims,
        }
        return jwt.encode(body, signing_key, algorithm=algorithm, headers={"kid": kid})


def okta() -> Provider:
    return Provider(
        "okta",
        "https://x.okta.com/oauth2/default",
        "https://x.okta.com/oauth2/default/v1/keys",
        with_alg=True,
    )


def entra() -> Provider:
    return Provider(
        "entra",
        f"https://login.microsoftonline.com/{TENANT_ID}/v2.0",
        f"https://login.microsoftonline.com/{TENANT_ID}/discovery/v2.0/keys",
        with_alg=False,
    )


def keycloak() -> Provider:
    provider = Provider(
        "keycloak",
        "https://kc/realms/r",
        "https://kc/realms/r/protocol/openid-connect/certs",
        with_alg=True,
    )
    # Keycloak publishes its encryption key beside the signing ones
    enc_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    enc = jwt.algorithms.RSAAlgorithm.to_jwk(enc_key.public_key(), as_dict=True)
    enc.update(kid="kc-enc", use="enc", alg="RSA-OAEP")
    provider.extra_entries.append(enc)
    provider.keys_for_encryption = {"kc-enc": enc_key}  # type: ignore[attr-defined]
    return provider


# --------------------------------------------------------------------------------------------
# The loopback identity providers
# --------------------------------------------------------------------------------------------


@dataclass
class Idp:
    providers: dict[str, Provider]  # host -> provider
    base: str
    trust: ssl.SSLContext
    fetches: Counter[str] = field(default_factory=Counter)
    failing: set[str] = field(default_factory=set)  # paths answered 503

    def url_for(self, url: str) -> str:
        parts = urlsplit(url)
        return f"{self.base}/{parts.hostname}{parts.path}"

    def answer(self, path: str) -> tuple[int, Any]:
        self.fetches[path] += 1
        if path in self.failing:
            return 503, {"error": "unavailable"}
        host, _, rest = path.lstrip("/").partition("/")
        provider = self.providers.get(host)
        if provider is None:
            return 404, {}
        if f"https://{host}/{rest}" == provider.issuer + "/.well-known/openid-configuration":
            return 200, provider.discovery()
        if f"https://{host}/{rest}" == provider.jwks_uri:
            return 200, provider.jwks()
        return 404, {}

    def jwks_fetches(self, provider: Provider) -> int:
        return self.fetches[urlsplit(self.url_for(provider.jwks_uri)).path]

    def discovery_fetches(self, provider: Provider) -> int:
        path = urlsplit(self.url_for(provider.issuer + "/.well-known/openid-configuration")).path
        return self.fetches[path]


@pytest.fixture
def idp(tmp_path: Path) -> Iterator[Idp]:
    providers: dict[str, Provider] = {}
    state: dict[str, Idp] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            return

        def do_GET(self) -> None:
            status, body = state["idp"].answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    cert, key = self_signed(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    state["idp"] = Idp(
        providers,
        f"https://127.0.0.1:{server.server_address[1]}",
        ssl.create_default_context(cafile=str(cert)),
    )
    try:
        yield state["idp"]
    finally:
        server.shutdown()
        server.server_close()


class FakeTime:
    """``time.monotonic`` for PyJWT's JWKS cache and cooldown, and for the key source."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    fake = FakeTime()
    module = types.SimpleNamespace(monotonic=fake.monotonic)
    for name in ("jwt.jwks_client", "jwt.jwk_set_cache", "jwt.api_jwk"):
        monkeypatch.setattr(f"{name}.time", module)
    return fake


def serve(idp: Idp, provider: Provider) -> Provider:
    idp.providers[urlsplit(provider.issuer).hostname or ""] = provider
    return provider


def keys_of(idp: Idp, provider: Provider, clock: FakeTime, **options: Any) -> IssuerKeys:
    return IssuerKeys(
        provider.issuer,
        ssl_context=idp.trust,
        url_for=idp.url_for,
        clock=clock.monotonic,
        **options,
    )


def verifier_for(idp: Idp, provider: Provider, clock: FakeTime, **options: Any) -> TokenVerifier:
    return oidc_verifier(
        provider.issuer, audience=AUDIENCE, keys=keys_of(idp, provider, clock, **options)
    )


# --------------------------------------------------------------------------------------------
# The three issuer shapes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [okta, entra, keycloak], ids=["okta", "entra", "keycloak"])
def test_tokens_of_each_issuer_shape_verify_with_keys_from_its_discovery_document(
    idp: Idp, clock: FakeTime, shape: Any
) -> None:
    provider = serve(idp, shape())
    kid = provider.add_key()
    verifier = verifier_for(idp, provider, clock)

    for _ in range(5):
        claims = verifier.verify(provider.token(kid))
        assert claims.issuer == provider.issuer and claims.key_id == kid
        assert claims.algorithm == "RS256"
    # one discovery, one JWKS: the rest came from the cache
    assert idp.discovery_fetches(provider) == 1
    assert idp.jwks_fetches(provider) == 1


def test_an_es256_key_of_the_issuer_verifies_too(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, keycloak())
    kid = provider.add_key(curve=True)
    claims = verifier_for(idp, provider, clock).verify(provider.token(kid))
    assert claims.algorithm == "ES256"


def test_another_issuers_token_is_refused_even_with_a_published_key(
    idp: Idp, clock: FakeTime
) -> None:
    provider = serve(idp, okta())
    kid = provider.add_key()
    verifier = verifier_for(idp, provider, clock)
    forged = provider.token(kid, iss="https://y.okta.com/oauth2/default")
    with pytest.raises(InvalidToken) as refused:
        verifier.verify(forged)
    assert refused.value.reason == "issuer"


def test_keycloaks_encryption_key_never_verifies_a_token(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, keycloak())
    provider.add_key()
    verifier = verifier_for(idp, provider, clock)
    enc_key = provider.keys_for_encryption["kc-enc"]  # type: ignore[attr-defined]
    with pytest.raises(InvalidToken) as refused:
        verifier.verify(provider.token("kc-enc", key=enc_key))
    assert refused.value.reason == "unknown_key"


# --------------------------------------------------------------------------------------------
# Cache, rotation, floods, outages
# --------------------------------------------------------------------------------------------


def test_the_jwks_is_refetched_when_its_ttl_passes(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, entra())
    kid = provider.add_key()
    verifier = verifier_for(idp, provider, clock, ttl_s=300)
    verifier.verify(provider.token(kid))
    clock.now += 299
    verifier.verify(provider.token(kid))
    assert idp.jwks_fetches(provider) == 1
    clock.now += 2
    verifier.verify(provider.token(kid))
    assert idp.jwks_fetches(provider) == 2
    assert idp.discovery_fetches(provider) == 1  # the jwks_uri is kept


def test_a_rotated_in_key_is_fetched_once_on_its_first_token(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, okta())
    old = provider.add_key()
    verifier = verifier_for(idp, provider, clock, refetch_cooldown_s=30)
    verifier.verify(provider.token(old))
    clock.now += 31  # past the cooldown that the first fetch started
    new = provider.add_key()  # the issuer rotates in a key between two of our fetches

    for _ in range(3):
        assert verifier.verify(provider.token(new)).key_id == new
    assert idp.jwks_fetches(provider) == 2  # the first token with the new kid refetched, once


def test_a_flood_of_unknown_kids_refetches_at_most_once_per_cooldown(
    idp: Idp, clock: FakeTime
) -> None:
    provider = serve(idp, keycloak())
    provider.add_key()
    verifier = verifier_for(idp, provider, clock, refetch_cooldown_s=30)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def flood() -> None:
        for _ in range(25):
            with pytest.raises(InvalidToken) as refused:
                verifier.verify(provider.token(secrets.token_hex(8), key=stranger))
            assert refused.value.reason == "unknown_key"

    flood()  # within the cooldown of the first fetch: not one request to the issuer
    assert idp.jwks_fetches(provider) == 1
    clock.now += 31
    flood()  # the first unknown kid refetches; the other 24 wait for the next cooldown
    assert idp.jwks_fetches(provider) == 2
    clock.now += 10
    flood()
    assert idp.jwks_fetches(provider) == 2


def test_an_unreachable_issuer_keeps_its_last_keys_and_is_not_hammered(
    idp: Idp, clock: FakeTime
) -> None:
    provider = serve(idp, entra())
    kid = provider.add_key()
    verifier = verifier_for(idp, provider, clock, ttl_s=300, refetch_cooldown_s=30)
    verifier.verify(provider.token(kid))
    idp.failing.add(urlsplit(idp.url_for(provider.jwks_uri)).path)
    clock.now += 301  # the cached JWKS expired; the issuer answers 503

    for _ in range(10):
        assert verifier.verify(provider.token(kid)).key_id == kid  # the last keys still verify
    assert idp.jwks_fetches(provider) == 2  # one failed attempt, then quiet for the cooldown
    clock.now += 31
    verifier.verify(provider.token(kid))
    assert idp.jwks_fetches(provider) == 3  # tried again after it
    idp.failing.clear()
    clock.now += 31
    verifier.verify(provider.token(kid))
    assert idp.jwks_fetches(provider) == 4


# --------------------------------------------------------------------------------------------
# Discovery refusals
# --------------------------------------------------------------------------------------------


def test_a_discovery_document_for_another_issuer_is_refused(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, okta())
    provider.add_key()
    lying = Provider("okta", provider.issuer, provider.jwks_uri, with_alg=True)
    lying.discovery = lambda: {  # type: ignore[method-assign]
        "issuer": "https://evil.example/oauth2/default",
        "jwks_uri": provider.jwks_uri,
    }
    serve(idp, lying)
    with pytest.raises(IssuerKeysUnavailable, match="another issuer"):
        verifier_for(idp, lying, clock)


def test_a_jwks_uri_that_is_not_https_is_refused(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, keycloak())
    provider.jwks_uri = "http://kc/realms/r/protocol/openid-connect/certs"
    with pytest.raises(IssuerKeysUnavailable, match="jwks_uri"):
        verifier_for(idp, provider, clock)


def test_an_unreachable_issuer_at_cold_start_is_a_configuration_failure(
    idp: Idp, clock: FakeTime
) -> None:
    provider = okta()  # not served: 404
    with pytest.raises(IssuerKeysUnavailable):
        verifier_for(idp, provider, clock)


def test_an_issuer_that_is_not_https_is_refused() -> None:
    with pytest.raises(IssuerKeysUnavailable):
        IssuerKeys("http://kc/realms/r")


def test_a_key_source_is_held_to_the_jwks_rules() -> None:
    """What a source returns must be a public key whose algorithm is allowed and matches it."""
    provider = okta()
    kid = provider.add_key()
    private = jwt.PyJWK(jwt.algorithms.RSAAlgorithm.to_jwk(provider.keys[kid], as_dict=True))
    symmetric = jwt.PyJWK(
        {"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0", "alg": "HS256"}
    )
    public = jwt.PyJWK(
        jwt.algorithms.RSAAlgorithm.to_jwk(provider.keys[kid].public_key(), as_dict=True)
    )
    for returned, accepted in ((private, False), (symmetric, False), (None, False), (public, True)):

        def source(_kid: str, key: jwt.PyJWK | None = returned) -> jwt.PyJWK | None:
            return key

        verifier = TokenVerifier.from_key_source(source, issuer=provider.issuer, audience=AUDIENCE)
        if accepted:
            assert verifier.verify(provider.token(kid)).key_id == kid
        else:
            with pytest.raises(InvalidToken) as refused:
                verifier.verify(provider.token(kid))
            assert refused.value.reason == "unknown_key"


# --------------------------------------------------------------------------------------------
# The recipes (docs/identity-providers/): each provider's token shape, as it issues the claims
# --------------------------------------------------------------------------------------------

API_CLIENT_ID: Final = "6e1c3f52-8a4b-4c8e-9d5f-2b7a1c9e4d30"  # the Entra app of the MCP API
COGNITO_CLIENT_ID: Final = "4k2v9q8r1s7t3u6w0x5y2z8a1b"
COGNITO_POOL: Final = "eu-west-1_AbCdEf123"
ENGRAM_CLAIMS: Final = {
    "tenant_id": "acme",
    "workspace_id": "ws-0001",
    "purpose_ref": "purpose:general",
    "engram_tools": ["search", "get", "capture"],
}


def cognito() -> Provider:
    issuer = f"https://cognito-idp.eu-west-1.amazonaws.com/{COGNITO_POOL}"
    return Provider("cognito", issuer, issuer + "/.well-known/jwks.json", with_alg=True)


def okta_custom_server() -> Provider:
    issuer = "https://acme.okta.com/oauth2/aus8k2l1wqEXAMPLE357"
    return Provider("okta", issuer, issuer + "/v1/keys", with_alg=True)


def cognito_id_token(provider: Provider, kid: str) -> str:
    """An ID token of a V2_0 pre-token-generation trigger (docs/identity-providers/cognito.md):
    aud the app client id, the Engram claims added by the trigger, Cognito's own beside them."""
    return provider.token(
        kid,
        aud=COGNITO_CLIENT_ID,
        sub="5f8e2c1a-3b4d-4e6f-8a9b-0c1d2e3f4a5b",
        token_use="id",
        auth_time=int(time.time()),
        event_id="0b5a1c2d-3e4f-4a5b-8c6d-7e8f9a0b1c2d",
        **{"cognito:username": "agent-alice", "origin_jti": "a1b2c3"},
        **ENGRAM_CLAIMS,
    )


def entra_access_token(provider: Provider, kid: str, **claims: Any) -> str:
    """A v2.0 access token for the MCP API's app registration: aud its client id, app roles in
    ``roles``, the Engram claims from a custom claims provider (docs/identity-providers/entra-id.md)."""
    body: dict[str, Any] = {
        "aud": API_CLIENT_ID,
        "sub": "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
        "oid": "00000000-0000-0000-66f3-3332eca7ea81",
        "tid": TENANT_ID,
        "azp": "9a3f1e77-1c2b-4d5e-8f90-a1b2c3d4e5f6",
        "azpacr": "0",
        "ver": "2.0",
        "roles": ["Engram.Agent"],
        "scp": "Memory.ReadWrite",
        **ENGRAM_CLAIMS,
    }
    return provider.token(kid, **{**body, **claims})


def okta_access_token(provider: Provider, kid: str) -> str:
    """An access token of an Okta custom authorization server whose Audience is the resource
    URL, the Engram claims defined on its Claims tab (docs/identity-providers/okta.md)."""
    return provider.token(
        kid,
        ver=1,
        jti="AT.0mP4JzW3j5kJHq0aN8Z2z1y9QwErTy",
        cid="0oa1b2c3d4EXAMPLE697",
        uid="00u1a2b3c4EXAMPLE697",
        scp=["engram.memory"],
        sub="agent-alice@acme.example",
        **ENGRAM_CLAIMS,
    )


def agent_context(claims: Any) -> Any:
    from engram_memory.binding.host_config import HostConfig
    from engram_memory.binding.tokens import context_from_claims

    host = HostConfig(resource=AUDIENCE, issuer="unused", tenant_id="acme")
    return context_from_claims(claims, audit_id="aud_recipe", host=host)


def recipe_verifier(idp: Idp, provider: Provider, clock: FakeTime, *aliases: str) -> TokenVerifier:
    return oidc_verifier(
        provider.issuer,
        audience=AUDIENCE,
        audience_aliases=aliases,
        keys=keys_of(idp, provider, clock),
    )


def test_cognito_id_tokens_with_trigger_claims_bind_a_context(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, cognito())
    kid = provider.add_key()
    provider.add_key()  # a user pool publishes two keys
    verifier = recipe_verifier(idp, provider, clock, COGNITO_CLIENT_ID)
    ctx = agent_context(verifier.verify(cognito_id_token(provider, kid)))
    assert (ctx.tenant_id, ctx.workspace_id, ctx.purpose_ref) == (
        "acme",
        "ws-0001",
        "purpose:general",
    )
    assert ctx.grants == frozenset({"search", "get", "capture"})
    # without the app client id configured, the same token is for another service
    with pytest.raises(InvalidToken) as refused:
        verifier_for(idp, provider, clock).verify(cognito_id_token(provider, kid))
    assert refused.value.reason == "audience"


def test_a_cognito_access_token_without_aud_is_refused(idp: Idp, clock: FakeTime) -> None:
    """Cognito access tokens carry ``client_id``, never ``aud``: the recipe sends the ID token."""
    provider = serve(idp, cognito())
    kid = provider.add_key()
    now = int(time.time())
    access = jwt.encode(
        {
            "iss": provider.issuer,
            "sub": "agent-alice",
            "client_id": COGNITO_CLIENT_ID,
            "token_use": "access",
            "scope": "engram/memory",
            "iat": now,
            "exp": now + 600,
            **ENGRAM_CLAIMS,
        },
        provider.keys[kid],
        algorithm="RS256",
        headers={"kid": kid},
    )
    with pytest.raises(InvalidToken) as refused:
        recipe_verifier(idp, provider, clock, COGNITO_CLIENT_ID).verify(access)
    assert refused.value.reason == "missing_claim"


def test_entra_v2_access_tokens_name_the_client_id_as_aud(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, entra())
    kid = provider.add_key()
    verifier = recipe_verifier(idp, provider, clock, API_CLIENT_ID)
    claims = verifier.verify(entra_access_token(provider, kid))
    assert claims.audience == AUDIENCE  # verified for this resource, under its other name
    assert claims.other["roles"] == ["Engram.Agent"]  # kept, not read as grants
    assert agent_context(claims).grants == frozenset({"search", "get", "capture"})
    # the resource URL keeps working, and the alias does not widen the one-audience rule
    assert verifier.verify(entra_access_token(provider, kid, aud=AUDIENCE)).subject
    for aud in ([API_CLIENT_ID, AUDIENCE], [API_CLIENT_ID, "api://other"], "api://other"):
        with pytest.raises(InvalidToken) as refused:
            verifier.verify(entra_access_token(provider, kid, aud=aud))
        assert refused.value.reason == "audience", aud
    with pytest.raises(InvalidToken) as refused:  # not configured: refused as before
        verifier_for(idp, provider, clock).verify(entra_access_token(provider, kid))
    assert refused.value.reason == "audience"


def test_okta_custom_server_tokens_name_the_resource_as_aud(idp: Idp, clock: FakeTime) -> None:
    provider = serve(idp, okta_custom_server())
    kid = provider.add_key()
    claims = verifier_for(idp, provider, clock).verify(okta_access_token(provider, kid))
    assert claims.other["cid"] == "0oa1b2c3d4EXAMPLE697" and claims.token_id
    ctx = agent_context(claims)
    assert ctx.principal == "agent-alice@acme.example" and ctx.workspace_id == "ws-0001"


@pytest.mark.parametrize(
    ("shape", "token", "aliases"),
    [
        (cognito, cognito_id_token, (COGNITO_CLIENT_ID,)),
        (entra, entra_access_token, (API_CLIENT_ID,)),
        (okta_custom_server, okta_access_token, ()),
    ],
    ids=["cognito", "entra", "okta"],
)
def test_each_recipe_survives_a_key_rotation(
    idp: Idp, clock: FakeTime, shape: Any, token: Any, aliases: tuple[str, ...]
) -> None:
    """The provider rotates: a new kid is published, tokens move to it, the old key retires."""
    provider = serve(idp, shape())
    old = provider.add_key()
    verifier = recipe_verifier(idp, provider, clock, *aliases)
    assert verifier.verify(token(provider, old)).key_id == old
    clock.now += 31  # past the refetch cooldown the first fetch started
    new = provider.add_key()
    assert verifier.verify(token(provider, new)).key_id == new  # fetched once, on its first use
    stale = token(provider, old)
    del provider.keys[old]
    clock.now += 301  # the cached JWKS expires: the retired key is gone with it
    with pytest.raises(InvalidToken) as refused:
        verifier.verify(stale)
    assert refused.value.reason == "unknown_key"

"""Approver sign-in for the cloud approval page: OIDC code + PKCE against a local provider, the
signed session and sign-in cookies (HttpOnly; Secure; SameSite=Strict), and their refusals; the
person checks (``PersonRule``): never an agent's or an application's ID token, a fresh
interactive sign-in (``max_age``, ``auth_time``, ``prompt=login``)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx2
import jwt
import pytest

from engram_memory.binding.tokens import LEEWAY_S
from engram_memory.cloud.approver_signin import (
    SESSION_COOKIE,
    SIGN_IN_MAX_AGE_S,
    SIGNIN_COOKIE,
    KeySource,
    NotAPerson,
    OidcClient,
    PendingSignIn,
    PersonRule,
    SignedCookies,
    SignedIn,
    SignInFailed,
    StaleSignIn,
    cookie_value,
    pkce_pair,
)

from oidc_provider import LocalOidcProvider, serve_provider, sign_in

CLIENT_ID = "engram-approvals"
REDIRECT = "https://approvals.example/approvals/callback"


@pytest.fixture(scope="module")
def provider() -> Iterator[LocalOidcProvider]:
    with serve_provider({CLIENT_ID: REDIRECT}) as running:
        yield running


def fetch(url: str, form: Mapping[str, str] | None) -> Mapping[str, Any]:
    response = (
        httpx2.get(url, timeout=10)
        if form is None
        else httpx2.post(url, data=dict(form), timeout=10)
    )
    body: Mapping[str, Any] = response.json()
    return body


def published_keys(provider: LocalOidcProvider) -> KeySource:
    """The provider's JWKS as a key source (the cloud uses ``cloud.oidc.IssuerKeys``, https only)."""

    def key(kid: str) -> jwt.PyJWK | None:
        keys = jwt.PyJWKSet.from_dict(dict(fetch(provider.issuer + "/jwks", None)))
        return next((k for k in keys.keys if k.key_id == kid), None)

    return key


def client_for(
    provider: LocalOidcProvider, *, issuer: str | None = None, refused: frozenset[str] = frozenset()
) -> OidcClient:
    return OidcClient(
        issuer=issuer or provider.issuer,
        client_id=CLIENT_ID,
        redirect_uri=REDIRECT,
        fetch=fetch,
        keys=published_keys(provider),
        refused_audiences=refused,
    )


def sign_in_as(authorization_url: str, username: str) -> dict[str, str]:
    """What the person does at the provider: the callback's query parameters."""
    location = sign_in(authorization_url, username)
    assert location.startswith(REDIRECT + "?")
    return {k: v[0] for k, v in parse_qs(urlparse(location).query).items()}


def test_pkce_challenge_is_the_s256_of_a_fresh_verifier() -> None:
    import base64
    import hashlib

    verifier, challenge = pkce_pair()
    again, _ = pkce_pair()
    assert 43 <= len(verifier) <= 128 and verifier != again
    digest = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
    assert challenge == digest.decode()


def test_code_with_pkce_signs_the_person_in_as_the_provider_subject(
    provider: LocalOidcProvider,
) -> None:
    client = client_for(provider)
    url, pending = client.start("/approvals/apr_1")
    query = parse_qs(urlparse(url).query)
    assert query["code_challenge_method"] == ["S256"] and query["response_type"] == ["code"]
    assert query["state"] == [pending.state] and query["nonce"] == [pending.nonce]
    returned = sign_in_as(url, "alice")
    signed_in = client.finish(code=returned["code"], state=returned["state"], pending=pending)
    assert signed_in.subject == "alice"


def test_a_code_is_used_once_and_only_with_its_verifier_and_state(
    provider: LocalOidcProvider,
) -> None:
    client = client_for(provider)
    url, pending = client.start("/approvals/apr_1")
    returned = sign_in_as(url, "alice")
    with pytest.raises(SignInFailed):  # another browser's state
        client.finish(code=returned["code"], state="forged", pending=pending)
    wrong_verifier = PendingSignIn(pending.state, pending.nonce, pkce_pair()[0], pending.return_to)
    with pytest.raises(SignInFailed):  # the provider refuses a verifier that is not the one
        client.finish(code=returned["code"], state=returned["state"], pending=wrong_verifier)
    with pytest.raises(SignInFailed):  # and the code is gone after its first exchange
        client.finish(code=returned["code"], state=returned["state"], pending=pending)


def test_an_id_token_for_another_sign_in_or_issuer_is_refused(provider: LocalOidcProvider) -> None:
    client = client_for(provider)
    url, pending = client.start("/approvals/apr_1")
    returned = sign_in_as(url, "alice")
    other_nonce = PendingSignIn(pending.state, "another-nonce", pending.verifier, pending.return_to)
    with pytest.raises(SignInFailed, match="nonce"):
        client.finish(code=returned["code"], state=returned["state"], pending=other_nonce)
    with pytest.raises(SignInFailed, match="another issuer"):
        client_for(provider, issuer=provider.issuer.replace("127.0.0.1", "localhost")).metadata()


def test_an_id_token_also_valid_for_the_mcp_endpoint_is_refused(
    provider: LocalOidcProvider,
) -> None:
    mcp = "https://memory.example.com/mcp"
    client = client_for(provider, refused=frozenset({mcp}))
    provider.extra_audiences = [mcp]
    try:
        url, pending = client.start("/approvals/apr_1")
        returned = sign_in_as(url, "alice")
        with pytest.raises(SignInFailed, match="MCP endpoint"):
            client.finish(code=returned["code"], state=returned["state"], pending=pending)
    finally:
        provider.extra_audiences = []
    url, pending = client.start("/approvals/apr_1")
    returned = sign_in_as(url, "alice")
    signed_in = client.finish(code=returned["code"], state=returned["state"], pending=pending)
    assert signed_in.subject == "alice"


def test_an_id_token_signed_by_an_unpublished_key_is_refused(provider: LocalOidcProvider) -> None:
    client = client_for(provider)
    client._keys = lambda kid: None  # the issuer publishes no such key
    url, pending = client.start("/approvals/apr_1")
    returned = sign_in_as(url, "alice")
    with pytest.raises(SignInFailed, match="does not publish"):
        client.finish(code=returned["code"], state=returned["state"], pending=pending)


def test_cookies_are_httponly_secure_samesite_strict_and_short_lived() -> None:
    now = [1_790_000_000.0]
    cookies = SignedCookies(b"k" * 32, clock=lambda: now[0])
    header = cookies.session_cookie(SignedIn("alice", int(now[0])))
    name, _, rest = header.partition("=")
    value = rest.split(";")[0]
    attributes = {a.strip().split("=")[0] for a in rest.split(";")[1:]}
    assert name == SESSION_COOKIE
    assert {"HttpOnly", "Secure", "SameSite", "Max-Age", "Path"} <= attributes
    assert "SameSite=Strict" in header and "Max-Age=600" in header
    approver = cookies.approver(cookie_value(f"a=b; {SESSION_COOKIE}={value}", SESSION_COOKIE))
    assert approver is not None and approver.subject == "alice"
    now[0] += 601
    assert cookies.approver(value) is None  # expired


def test_a_tampered_or_foreign_cookie_reads_as_signed_out() -> None:
    cookies = SignedCookies(b"k" * 32)
    signed_in = SignedIn("alice", int(time.time()))
    value = cookies.session_cookie(signed_in).split(";")[0].split("=", 1)[1]
    payload, mac = value.split(".")
    import base64
    import json

    body = json.loads(base64.urlsafe_b64decode(payload + "=="))
    body["sub"] = "mallory"
    forged = base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")
    assert cookies.approver(f"{forged}.{mac}") is None
    assert SignedCookies(b"x" * 32).approver(value) is None  # another deployment's key
    pending = cookies.pending_cookie(PendingSignIn("s", "n", "v", "/approvals/apr_1"))
    signin_value = pending.split(";")[0].split("=", 1)[1]
    assert pending.startswith(SIGNIN_COOKIE + "=")
    assert "SameSite=Lax" in pending  # it must come back from the identity provider's site
    assert cookies.approver(signin_value) is None  # a sign-in cookie is not a session
    restored = cookies.pending(signin_value)
    assert restored == PendingSignIn("s", "n", "v", "/approvals/apr_1")


# --------------------------------------------------------------------------------------------
# The approver is a person: never an agent, never an application, a fresh interactive sign-in
# --------------------------------------------------------------------------------------------


@pytest.fixture
def idp(provider: LocalOidcProvider) -> Iterator[LocalOidcProvider]:
    """The module's provider, its users' claims and sessions reset after the test."""
    yield provider
    provider.reset()


def signed_in_as(
    client: OidcClient, username: str, *, force_login: bool = False
) -> SignedIn | Exception:
    """A whole sign-in as ``username``: the verified person, or why it was refused."""
    url, pending = client.start("/approvals/apr_1", force_login=force_login)
    returned = sign_in_as(url, username)
    try:
        return client.finish(code=returned["code"], state=returned["state"], pending=pending)
    except SignInFailed as refused:
        return refused


def test_the_authorization_request_asks_for_a_sign_in_within_max_age(
    provider: LocalOidcProvider,
) -> None:
    client = client_for(provider)
    url, pending = client.start("/approvals/apr_1")
    query = parse_qs(urlparse(url).query)
    assert query["max_age"] == [str(SIGN_IN_MAX_AGE_S)] and "prompt" not in query
    assert not pending.forced
    url, pending = client.start("/approvals/apr_1", force_login=True)
    assert parse_qs(urlparse(url).query)["prompt"] == ["login"] and pending.forced


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"groups": ["staff", "engram-agents"]}, "agents' group"),
        ({"groups": "engram-agents"}, "agents' group"),
        ({"groups": [7]}, "not a list of names"),
        ({"hasgroups": True}, "overage"),  # Entra: too many groups for the token
        ({"_claim_names": {"groups": "src1"}}, "overage"),
        ({"idtyp": "app"}, "application"),  # Entra: an app-only token
        ({"gty": "client-credentials"}, "application"),
        ({"token_use": "access"}, "not an ID token"),  # Cognito
        ({"cid": "alice"}, "client id"),  # Okta: a service app's sub is its client id
        ({"azp": "alice"}, "client id"),
        ({"auth_time": None}, "interactive sign-in"),  # no auth_time at all
        ({"auth_time": "yesterday"}, "interactive sign-in"),
    ],
)
def test_an_agents_or_an_applications_id_token_is_no_persons_sign_in(
    idp: LocalOidcProvider, claims: dict[str, Any], reason: str
) -> None:
    idp.claims_for["alice"] = claims
    refused = signed_in_as(client_for(idp), "alice")
    assert isinstance(refused, NotAPerson) and reason in str(refused)
    assert "alice" not in str(refused)  # a constant reason, never a claim's value


def test_the_groups_claim_and_the_agents_group_are_the_operators(idp: LocalOidcProvider) -> None:
    entra_group = "0b7d7e2c-4a8f-4c1e-9d3b-6f2a1e5c8b90"  # Entra writes group object ids
    client = client_for(idp)
    client.person = PersonRule(groups_claim="cognito:groups", agents_group=entra_group)
    idp.claims_for["alice"] = {"cognito:groups": [entra_group], "groups": ["engram-agents"]}
    assert isinstance(signed_in_as(client, "alice"), NotAPerson)
    idp.claims_for["alice"] = {"cognito:groups": ["people"], "groups": ["engram-agents"]}
    assert isinstance(signed_in_as(client, "alice"), SignedIn)  # another claim is not read


def test_a_stale_sign_in_is_refused_unless_the_provider_asks_again(idp: LocalOidcProvider) -> None:
    client = client_for(idp)
    idp.signed_in_s_ago = 3600  # the browser signed in an hour ago
    fresh = signed_in_as(client, "alice")  # a provider that applies max_age asks again
    assert isinstance(fresh, SignedIn) and time.time() - fresh.auth_time < 5
    idp.honours_max_age = False  # Cognito: max_age is ignored, the old session is reused
    stale = signed_in_as(client, "alice")
    assert isinstance(stale, StaleSignIn) and "max_age" in str(stale)
    forced = signed_in_as(client, "alice", force_login=True)  # prompt=login: a new sign-in
    assert isinstance(forced, SignedIn)
    idp.signed_in_s_ago = SIGN_IN_MAX_AGE_S + LEEWAY_S - 5  # within max_age and the leeway
    assert isinstance(signed_in_as(client, "alice"), SignedIn)
    idp.claims_for["alice"] = {"auth_time": int(time.time()) + 600}
    assert type(signed_in_as(client, "alice")) is SignInFailed  # a sign-in in the future


def test_a_session_signed_before_the_person_checks_reads_as_signed_out() -> None:
    cookies = SignedCookies(b"k" * 32)
    before = cookies._seal("session", {"sub": "alice", "exp": int(time.time()) + 600})
    assert cookies.approver(before) is None  # no auth_time: that browser signs in again
    now = int(time.time())
    value = cookies.session_cookie(SignedIn("alice", now)).split(";")[0].split("=", 1)[1]
    approver = cookies.approver(value)
    assert approver is not None and (approver.subject, approver.auth_time) == ("alice", now)

"""Approver sign-in for the cloud approval page: OIDC code + PKCE against a local provider, the
signed session and sign-in cookies (HttpOnly; Secure; SameSite=Strict), and their refusals."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx2
import jwt
import pytest
from bs4 import BeautifulSoup, Tag

from engram_memory.cloud.approver_signin import (
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    KeySource,
    OidcClient,
    PendingSignIn,
    SignedCookies,
    SignInFailed,
    cookie_value,
    pkce_pair,
)

from oidc_provider import LocalOidcProvider, serve_provider

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
    """What the person does at the provider: open the page, type who they are, press Sign in."""
    page = httpx2.get(authorization_url, timeout=10)
    form = BeautifulSoup(page.text, "html.parser").find("form")
    assert isinstance(form, Tag), page.text
    fields = {str(i["name"]): str(i.get("value", "")) for i in form.find_all("input")}
    fields["username"] = username
    answer = httpx2.post(authorization_url.split("?")[0], data=fields, timeout=10)
    assert answer.status_code == 303
    location = answer.headers["location"]
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
    assert client.finish(code=returned["code"], state=returned["state"], pending=pending) == "alice"


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
    assert client.finish(code=returned["code"], state=returned["state"], pending=pending) == "alice"


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
    header = cookies.session_cookie("alice")
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
    value = cookies.session_cookie("alice").split(";")[0].split("=", 1)[1]
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

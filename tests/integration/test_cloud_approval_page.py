"""The cloud approval function's sign-in, request by request (API Gateway v2 events), against a
real OIDC provider over HTTPS (``tests/oidc_provider.py``) with the product's fetch and key
source (``https_fetch``, ``cloud.oidc.IssuerKeys``). The approvals are a small in-memory store;
the whole flow on moto, in Chromium, is ``tests/e2e/test_cloud_approval_browser.py``."""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from approval_testing import (
    APPROVAL_ENV,
    BASE_URL,
    CLIENT_ID,
    PROOF_KEY,
    RESOURCE,
    PageContext,
    RecordedSfn,
    outcome,
)
from approval_testing import page_event as event

from engram_memory.cloud.approval_page import ApprovalHandler, https_fetch
from engram_memory.cloud.composition import build_approval_page
from engram_memory.cloud.oidc import IssuerKeys
from engram_memory.cloud.parked_approvals import ParkedApproval
from scripts.cloud_run import self_signed

from oidc_provider import LocalOidcProvider, serve_provider, sign_in

APPROVAL_ID = "apr_" + "a" * 32
ALICE = "agent-alice"


@dataclass
class Approvals:
    """The parked approval the page is about (what ``ParkedApprovalBook`` reads)."""

    parked: ParkedApproval

    def get(self, approval_id: str) -> ParkedApproval | None:
        return self.parked if approval_id == self.parked.approval_id else None

    def take(self, approval_id: str, now_ms: int) -> ParkedApproval | None:
        if self.parked.used:
            return None
        taken = self.parked
        self.parked = taken.model_copy(update={"used": True, "task_token": None})
        return taken


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def provider(tls: tuple[Path, Path]) -> Iterator[LocalOidcProvider]:
    with serve_provider({CLIENT_ID: f"{BASE_URL}/approvals/callback"}, tls=tls) as running:
        yield running


@dataclass
class Page:
    handler: ApprovalHandler
    sfn: RecordedSfn
    trust: ssl.SSLContext

    def __call__(self, ev: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.handler(ev, PageContext())
        return answer


@pytest.fixture
def page(provider: LocalOidcProvider, tls: tuple[Path, Path]) -> Page:
    trust = ssl.create_default_context(cafile=str(tls[0]))
    handler = ApprovalHandler(
        build=build_approval_page, env={**APPROVAL_ENV, "ENGRAM_ISSUER": provider.issuer}
    )
    handler.proof_key = PROOF_KEY
    now = int(time.time() * 1000)
    handler.approvals = Approvals(  # type: ignore[assignment]
        ParkedApproval(
            approval_id=APPROVAL_ID,
            task_token="task-token",
            execution_name="forget-x",
            workflow="forget",
            tool="forget",
            target="mem_" + "b" * 52,
            operation_digest="sha256:" + "0" * 64,
            principal=ALICE,
            tenant_id="dev",
            workspace_id="ws-1",
            reason_ref="reason:obsolete",
            issued_at_ms=now,
            used=False,
        )
    )
    sfn = RecordedSfn()
    handler.sfn = sfn
    handler.memories = lambda parked: None
    handler.session_key = b"k" * 32
    handler.fetch = https_fetch(trust)
    handler.keys = IssuerKeys(provider.issuer, ssl_context=trust)
    return Page(handler, sfn, trust)


def sign_in_at(page: Page, location: str, username: str) -> tuple[str, str]:
    """At the provider: its sign-in form, a user name, Sign in; the callback's query."""
    back_to = sign_in(location, username, verify=page.trust)
    back = urlsplit(back_to)
    assert f"{back.scheme}://{back.netloc}{back.path}" == f"{BASE_URL}/approvals/callback"
    return back.query, back_to


def start(page: Page) -> tuple[str, str]:
    """A signed-out GET of the page: the provider's URL and the pending sign-in cookie."""
    redirect = page(event(APPROVAL_ID))
    assert redirect["statusCode"] == 302
    (cookie,) = redirect["cookies"]
    return redirect["headers"]["Location"], cookie


def callback(page: Page, query: str, signin_cookie: str | None) -> dict[str, Any]:
    cookies = [signin_cookie.split(";")[0]] if signin_cookie else None
    return page(event("", path="/approvals/callback", query=query, cookies=cookies))


def test_a_signed_out_visit_goes_to_the_issuer_with_pkce_state_and_nonce(
    page: Page, provider: LocalOidcProvider
) -> None:
    location, cookie = start(page)

    query = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
    assert location.startswith(provider.issuer + "/authorize?")
    assert query["client_id"] == CLIENT_ID and query["response_type"] == "code"
    assert query["redirect_uri"] == f"{BASE_URL}/approvals/callback"
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["state"] and query["nonce"] and query["state"] != query["nonce"]
    assert cookie.startswith("engram_signin=")
    assert "HttpOnly" in cookie and "Secure" in cookie and "SameSite=Lax" in cookie
    assert query["state"] not in cookie and query["nonce"] not in cookie  # signed, not plain


def test_the_callback_sets_a_strict_session_and_the_page_then_asks(page: Page) -> None:
    location, signin = start(page)
    query, _ = sign_in_at(page, location, ALICE)

    back = callback(page, query, signin)

    assert back["statusCode"] == 200
    cleared, session = back["cookies"]
    assert cleared.startswith("engram_signin=;") and "Max-Age=0" in cleared
    assert session.startswith("engram_approver=")
    for attribute in ("HttpOnly", "Secure", "SameSite=Strict", "Max-Age=600", "Path=/approvals"):
        assert attribute in session
    assert f'url=/approvals/{APPROVAL_ID}"' in back["body"]  # on to the page (same site)
    shown = page(event(APPROVAL_ID, cookies=[session.split(";")[0]]))
    assert shown["statusCode"] == 200 and 'name="csrf_token"' in shown["body"]
    assert re.search(r"<button[^>]*>Approve</button>", shown["body"])
    again = callback(page, query, signin)  # the code is single use
    assert again["statusCode"] == 401 and outcome(again) == "sign_in"


def test_an_id_token_also_valid_for_the_mcp_endpoint_signs_nobody_in(
    page: Page, provider: LocalOidcProvider
) -> None:
    location, signin = start(page)
    provider.extra_audiences = [RESOURCE]
    try:
        query, _ = sign_in_at(page, location, ALICE)
        back = callback(page, query, signin)
    finally:
        provider.extra_audiences = []

    assert back["statusCode"] == 401 and outcome(back) == "sign_in"
    assert not [c for c in back.get("cookies", []) if c.startswith("engram_approver=")]


def test_a_callback_without_its_browsers_sign_in_or_with_an_error_is_a_page(page: Page) -> None:
    location, signin = start(page)
    query, _ = sign_in_at(page, location, ALICE)

    assert outcome(callback(page, query, None)) == "sign_in"  # another browser's code
    assert outcome(callback(page, "error=access_denied", signin)) == "sign_in"
    _, other = start(page)  # a second sign-in's cookie: its state is not this code's
    refused = callback(page, query, other)
    assert refused["statusCode"] == 401 and "Open the approval link again" in refused["body"]


def test_another_principal_is_refused_and_the_answer_needs_the_form(page: Page) -> None:
    location, signin = start(page)
    query, _ = sign_in_at(page, location, "agent-mallory")
    mallory = callback(page, query, signin)["cookies"][1].split(";")[0]

    refused = page(event(APPROVAL_ID, cookies=[mallory]))
    posted = page(event(APPROVAL_ID, "POST", cookies=[mallory], form={"decision": "approve"}))

    assert refused["statusCode"] == 403 and outcome(refused) == "forbidden"
    assert posted["statusCode"] == 403 and page.sfn.answers == []


def test_malformed_ids_and_an_unreachable_issuer_are_pages(page: Page) -> None:
    unknown = page(event("not-an-approval"))
    assert unknown["statusCode"] == 404 and outcome(unknown) == "not_found"
    down_issuer = {**APPROVAL_ENV, "ENGRAM_ISSUER": "https://127.0.0.1:9"}  # nothing listens
    handler = ApprovalHandler(build=build_approval_page, env=down_issuer)
    handler.approvals, handler.sfn = page.handler.approvals, page.sfn
    handler.memories, handler.session_key = page.handler.memories, b"k" * 32
    handler.proof_key = PROOF_KEY
    handler.fetch = https_fetch(page.trust)
    down = handler(event(APPROVAL_ID), PageContext())
    assert down["statusCode"] == 503 and outcome(down) == "unavailable"


def test_nothing_of_the_sign_in_is_logged(page: Page, capsys: pytest.CaptureFixture[str]) -> None:
    location, signin = start(page)
    query, _ = sign_in_at(page, location, ALICE)
    back = callback(page, query, signin)
    session = back["cookies"][1].split(";")[0]
    shown = page(event(APPROVAL_ID, cookies=[session]))
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', shown["body"])
    assert token is not None
    posted = page(
        event(
            APPROVAL_ID,
            "POST",
            cookies=[session],
            form={"csrf_token": token.group(1), "decision": "approve"},
        )
    )
    assert outcome(posted) == "approve" and page.sfn.answers == ["success"]

    logged = capsys.readouterr()
    code = parse_qs(query)["code"][0]
    for secret in (code, session.split("=", 1)[1], signin.split(";")[0].split("=", 1)[1]):
        assert secret not in logged.out and secret not in logged.err
    assert token.group(1) not in logged.out


@pytest.fixture
def idp(provider: LocalOidcProvider) -> Iterator[LocalOidcProvider]:
    """The module's provider, its users' claims and sessions reset after the test."""
    yield provider
    provider.reset()


def test_a_stale_sign_in_is_asked_again_once_with_prompt_login(
    page: Page, idp: LocalOidcProvider
) -> None:
    idp.honours_max_age = False  # as Cognito: max_age is ignored, the old session reused
    idp.signed_in_s_ago = 3600
    location, signin = start(page)
    assert parse_qs(urlsplit(location).query)["max_age"] == ["300"]
    query, _ = sign_in_at(page, location, ALICE)

    again = callback(page, query, signin)  # stale: back to the issuer, asking for a sign-in

    assert again["statusCode"] == 302
    (renewed,) = again["cookies"]  # the new pending sign-in replaces the old one
    assert renewed.startswith("engram_signin=") and renewed != signin
    assert parse_qs(urlsplit(again["headers"]["Location"]).query)["prompt"] == ["login"]
    query, _ = sign_in_at(page, again["headers"]["Location"], ALICE)
    back = callback(page, query, renewed)
    assert back["statusCode"] == 200 and back["cookies"][1].startswith("engram_approver=")


def test_a_provider_that_ignores_prompt_login_too_ends_on_a_page_not_a_loop(
    page: Page, idp: LocalOidcProvider
) -> None:
    idp.honours_max_age = idp.honours_prompt = False
    idp.signed_in_s_ago = 3600
    location, signin = start(page)
    query, _ = sign_in_at(page, location, ALICE)
    again = callback(page, query, signin)
    query, _ = sign_in_at(page, again["headers"]["Location"], ALICE)

    stale = callback(page, query, again["cookies"][0])

    assert stale["statusCode"] == 401 and outcome(stale) == "stale_sign_in"
    assert [c for c in stale["cookies"] if c.startswith("engram_approver=")] == []
    assert "Sign out there" in stale["body"]


def test_an_agent_signing_in_gets_no_session(page: Page, idp: LocalOidcProvider) -> None:
    idp.claims_for[ALICE] = {"groups": ["engram-agents"]}
    location, signin = start(page)
    query, _ = sign_in_at(page, location, ALICE)

    refused = callback(page, query, signin)

    assert refused["statusCode"] == 403 and outcome(refused) == "not_a_person"
    assert [c for c in refused["cookies"] if c.startswith("engram_approver=")] == []
    assert page.sfn.answers == []


def test_the_designated_approver_answers_and_the_principal_cannot(page: Page) -> None:
    approvals = page.handler.approvals
    assert isinstance(approvals, Approvals)
    approvals.parked = approvals.parked.model_copy(update={"approver": "person-dana"})
    sessions = {}
    for who in (ALICE, "person-dana"):
        location, signin = start(page)
        query, _ = sign_in_at(page, location, who)
        sessions[who] = callback(page, query, signin)["cookies"][1].split(";")[0]

    refused = page(event(APPROVAL_ID, cookies=[sessions[ALICE]]))
    shown = page(event(APPROVAL_ID, cookies=[sessions["person-dana"]]))

    assert refused["statusCode"] == 403 and outcome(refused) == "forbidden"
    assert shown["statusCode"] == 200 and 'name="csrf_token"' in shown["body"]

"""The cloud approval page in a real browser: sign in at the tenant's issuer, then Approve or
Decline, from a real URL elicitation of the cloud MCP adapter.

The stack is the one ``tests/integration/test_state_machines.py`` builds on moto (DynamoDB, S3,
KMS, Secrets Manager, and Step Functions running the template's ASL); the MCP adapter Lambda and
the approval function are the real handlers, served over HTTPS on 127.0.0.1 by
``scripts.cloud_run.api_gateway`` (requests in, API Gateway HTTP API v2 events out; the cloud gate
serves the built functions with it). The tenant's identity provider is
``tests/oidc_provider.py`` over HTTPS on ``localhost`` (another site than the page, as an Okta or
Entra ID is). The agent is the official ``mcp`` client declaring URL-only elicitation; the person
is headless Chromium (Selenium, Debian's chromium-driver), which types a user name at the
provider's sign-in page and presses the page's buttons.

Screenshots (desktop and 320 px) go to ``ENGRAM_SCREENSHOTS`` when set, else a temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from aws_testing import FakeLambdaContext
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from engram_memory.cloud.approval_page import ApprovalHandler, StoredMemories, https_fetch
from engram_memory.cloud.composition import build_approval_page
from engram_memory.cloud.oidc import IssuerKeys
from scripts.cloud_run import self_signed
from scripts.cloud_run.api_gateway import Route, serve_api

from browser_support import (
    PHONE_WIDTH,
    as_desktop,
    as_phone,
    full_screenshot,
    open_chromium,
    page_width,
    text_of,
)
from e2e_support import (
    CALL_DEADLINE_S,
    FORGET,
    LEGACY,
    WITHDRAW,
    Agent,
    UrlOnlyClient,
    approval_id_of,
    envelope,
    error_code,
    link_of,
    new_key,
    ok_value,
)
from oidc_provider import LocalOidcProvider, serve_provider

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from test_state_machines import RealClock, Stack, stack_factory

__all__ = ["stack_factory"]  # the fixture, re-used

pytestmark = pytest.mark.anyio

CLIENT_ID = "engram-approvals"
DOMAIN = "memory.example.com"  # the HTTP API's custom domain (the adapter's resource host)
RESOURCE = f"https://{DOMAIN}/mcp"
PURPOSE = "purpose:general"  # the adapter's test tokens' purpose
ALICE = "agent-alice"  # the principal of the adapter's test tokens
NOTE = "Decision: the billing export runs at 03:00 UTC from the read replica."


@dataclass
class CloudSite:
    """The page and the adapter behind one HTTPS origin, the provider on another site."""

    base: str
    stack: Stack
    page: ApprovalHandler
    page_clock: RealClock
    provider: LocalOidcProvider
    tls: ssl.SSLContext
    adapter: Any  # test_mcp_adapter_lambda.Adapter (its handler and token issuer)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    # the throw-away CA of 127.0.0.1/localhost is not in Chromium's store; TLS is still used
    yield from open_chromium("--ignore-certificate-errors")


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kept = os.environ.get("ENGRAM_SCREENSHOTS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return tmp_path_factory.mktemp("cloud-approval-screenshots")


@pytest.fixture
def site(
    stack_factory: Callable[..., Stack], certificate: tuple[Path, Path]
) -> Iterator[CloudSite]:
    from test_mcp_adapter_lambda import adapter_over

    cert, key = certificate
    tls = ssl.create_default_context(cafile=str(cert))
    handlers: dict[str, Any] = {}

    def to(name: str, function_name: str) -> Any:
        context = FakeLambdaContext.of(function_name, remaining_ms=29_000)
        return lambda event: handlers[name](event, context)

    adapter, page = to("adapter", "engram-dev-mcp-adapter"), to("page", "engram-dev-approval")
    routes = [
        *(Route(method, "/mcp", adapter) for method in ("POST", "GET", "DELETE")),
        Route("GET", "/approvals/{approvalId}", page),
        Route("POST", "/approvals/{approvalId}", page),
        Route("GET", "/approvals/callback", page),
    ]
    with contextlib.ExitStack() as running:
        base = running.enter_context(serve_api(routes, cert=cert, key=key, domain=DOMAIN))
        provider = running.enter_context(
            serve_provider(
                {CLIENT_ID: f"{base}/approvals/callback"}, tls=(cert, key), host="localhost"
            )
        )
        stack = stack_factory(approval_base=base)
        page_clock = RealClock()
        page = ApprovalHandler(
            build=build_approval_page,
            env={
                "AWS_REGION": "us-east-1",
                "ENGRAM_ISSUER": provider.issuer,
                "ENGRAM_APPROVAL_AUDIENCE": CLIENT_ID,
                "ENGRAM_RESOURCE_URI": RESOURCE,
                "ENGRAM_APPROVAL_BASE_URL": base,
                "ENGRAM_TABLE": "engram-canonical",
                "ENGRAM_BLOB_BUCKET": "engram-blobs",
                "ENGRAM_KEY_TABLE": stack.cloud.env["ENGRAM_KEY_TABLE"],
                "ENGRAM_DATA_KEY_ARN": stack.cloud.env["ENGRAM_DATA_KEY_ARN"],
                "ENGRAM_APPROVAL_SESSION_SECRET_ARN": "unused: the key is set below",
                # the stack's proof key on moto: the run's commit step verifies the page's MAC
                "ENGRAM_APPROVAL_PROOF_KEY_ARN": stack.cloud.env["ENGRAM_APPROVAL_PROOF_KEY_ARN"],
            },
            now_ms=page_clock.now_ms,
        )
        page.approvals = stack.approval.approvals
        page.sfn = stack.sfn
        page.memories = stack.approval.memories
        assert isinstance(page.memories, StoredMemories)
        page.session_key = secrets.token_bytes(32)
        page.fetch = https_fetch(tls)  # the product's fetch and key source, trusting the CA
        page.keys = IssuerKeys(provider.issuer, ssl_context=tls)
        adapter = adapter_over(stack.cloud, stack.tools, clock=stack.clock)
        handlers.update(adapter=adapter.handler, page=page)
        yield CloudSite(base, stack, page, page_clock, provider, tls, adapter)


@contextlib.asynccontextmanager
async def agent_of(site: CloudSite) -> AsyncIterator[Agent]:
    """The official ``mcp`` client (2025-11-25, URL-only elicitation) at the cloud adapter."""

    async def unanswered(
        context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        raise AssertionError("a 2025-11-25 client gets -32042, not an elicitation request")

    token = site.adapter.token()
    with anyio.fail_after(CALL_DEADLINE_S):
        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30, read=CALL_DEADLINE_S),
            verify=site.tls,
        ) as http:
            transport = streamable_http_client(f"{site.base}/mcp", http_client=http)
            async with UrlOnlyClient(
                transport, mode=LEGACY, elicitation_callback=unanswered
            ) as client:
                yield Agent(client, purpose=PURPOSE)


class Person:
    """Someone at a browser: follows the link, signs in at the provider as ``user``, reads the
    page and presses ``decision`` (or nothing)."""

    def __init__(self, browser: webdriver.Chrome, user: str = ALICE) -> None:
        self.browser = browser
        self.user = user
        self.memory_shown: list[list[str]] = []

    def open(self, url: str) -> None:
        """Open ``url`` signed out, and sign in at the provider when it asks."""
        self.browser.execute_cdp_cmd("Network.clearBrowserCookies", {})
        as_desktop(self.browser)
        self.browser.get(url)
        wait = WebDriverWait(self.browser, 20)
        wait.until(expected_conditions.presence_of_element_located((By.ID, "username")))
        issuer = "https://localhost:"
        assert self.browser.current_url.startswith(issuer)  # the issuer's site
        self.browser.find_element(By.ID, "username").send_keys(self.user)
        self.browser.find_element(By.ID, "sign-in").click()
        # Back through the callback to the page (or to its refusal). The sign-in page has a form
        # button of its own, so the page's is looked for only once the browser has left the
        # issuer: a loaded machine otherwise reads the sign-in page as the answer (no cookie yet).
        wait.until(
            lambda driver: (
                not driver.current_url.startswith(issuer)
                and driver.find_elements(By.CSS_SELECTOR, "form button, #error")
            )
        )

    def answer(self, url: str, decision: str) -> str:
        self.open(url)
        self.memory_shown.append(text_of(self.browser, "#memory blockquote p"))
        self.browser.find_element(By.XPATH, f"//button[text()='{decision}']").click()
        outcome = WebDriverWait(self.browser, 20).until(
            expected_conditions.presence_of_element_located((By.ID, "outcome"))
        )
        return str(outcome.get_attribute("data-decision"))

    def error(self) -> str:
        return str(self.browser.find_element(By.ID, "error").get_attribute("data-error"))


def session_cookie(browser: webdriver.Chrome) -> dict[str, Any]:
    (cookie,) = [c for c in browser.get_cookies() if c["name"] == "engram_approver"]
    return cookie


async def test_signing_in_and_approving_lets_the_agents_retry_forget_the_record(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    person = Person(browser)
    async with agent_of(site) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id, new_key("forget"))
        call = partial(agent.client.call_tool, FORGET, arguments)
        link = await link_of(call)
        assert link.startswith(f"{site.base}/approvals/apr_")

        decided = await anyio.to_thread.run_sync(person.answer, link, "Approve")

        assert decided == "approve"
        assert "carried out now" in browser.find_element(By.TAG_NAME, "main").text
        assert person.memory_shown == [[NOTE]]  # the record's text, not only its id
        cookie = session_cookie(browser)
        assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
        assert (await anyio.to_thread.run_sync(site.stack.wait_done, "forget"))[
            "status"
        ] == "SUCCEEDED"
        forgotten = ok_value(await call())
        assert forgotten["receipt"]["to_state"] == "tombstoned"
        assert forgotten["replayed"] is False
        assert error_code(await agent.get(record_id)) == "NOT_FOUND"


async def test_declining_leaves_the_candidate_and_the_retry_is_gate_failed(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    person = Person(browser)
    async with agent_of(site) as agent:
        candidate_id = await agent.captured("A draft: the staging flag ENGRAM_FAST is for tests.")
        arguments = agent.withdraw_arguments(candidate_id, new_key("withdraw"))
        call = partial(agent.client.call_tool, WITHDRAW, arguments)
        link = await link_of(call)

        decided = await anyio.to_thread.run_sync(person.answer, link, "Decline")

        assert decided == "decline"
        assert person.memory_shown == [[]]  # withdraw in the cloud: a digest, no text (below)
        done = await anyio.to_thread.run_sync(site.stack.wait_done, "withdraw")
        assert done["status"] == "SUCCEEDED"  # a person's decision, not a failed run
        assert envelope(await call())["error"]["code"] == "gate_failed"
        admitted = ok_value(await agent.admit(candidate_id))
        assert admitted["outcome"]["status"] == "accepted"


async def test_the_withdraw_page_shows_the_candidates_digest_and_capture_time(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    person = Person(browser)
    async with agent_of(site) as agent:
        candidate_id = await agent.captured("A second draft: the cache TTL is 90 s in staging.")
        link = await link_of(
            lambda: agent.client.call_tool(WITHDRAW, agent.withdraw_arguments(candidate_id))
        )
        await anyio.to_thread.run_sync(person.open, link)
        memory = browser.find_element(By.ID, "memory").text
        assert "Digest" in memory and "Captured" in memory and "sha256:" in memory
        assert "cache TTL" not in browser.page_source
        assert candidate_id in browser.find_element(By.ID, "request").text


async def test_an_expired_request_is_an_error_page_without_buttons(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    person = Person(browser)
    async with agent_of(site) as agent:
        record_id = await agent.remember(NOTE)
        link = await link_of(
            lambda: agent.client.call_tool(FORGET, agent.forget_arguments(record_id))
        )
        site.page_clock.offset_ms = 301_000  # the page's clock: the 300 s have passed

        await anyio.to_thread.run_sync(person.open, link)

        assert person.error() == "expired"
        assert "retry" in browser.find_element(By.ID, "next-step").text
        assert browser.find_elements(By.TAG_NAME, "form") == []
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


async def test_a_post_without_the_csrf_token_or_from_another_site_is_refused(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    person = Person(browser)
    async with agent_of(site) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id, new_key("forget"))
        call = partial(agent.client.call_tool, FORGET, arguments)
        link = await link_of(call)
        await anyio.to_thread.run_sync(person.open, link)  # signed in: a valid session
        cookie = session_cookie(browser)
        token = browser.find_element(By.NAME, "csrf_token").get_attribute("value")
        signed_in = {"Cookie": f"{cookie['name']}={cookie['value']}"}
        async with httpx2.AsyncClient(verify=site.tls) as http:
            no_token = await http.post(
                link, data={"decision": "approve"}, headers={**signed_in, "Origin": site.base}
            )
            cross_site = await http.post(
                link,
                data={"decision": "approve", "csrf_token": str(token)},
                headers={**signed_in, "Origin": "https://attacker.example"},
            )
            no_session = await http.post(
                link, data={"decision": "approve", "csrf_token": str(token)}
            )
        assert no_token.status_code == 403 and 'data-error="csrf"' in no_token.text
        assert cross_site.status_code == 403 and 'data-error="csrf"' in cross_site.text
        assert no_session.status_code == 401 and 'data-error="sign_in"' in no_session.text
        assert await link_of(call) == link  # still the same open request, unanswered
        decided = await anyio.to_thread.run_sync(person.answer, link, "Approve")
        assert decided == "approve"
        await anyio.to_thread.run_sync(site.stack.wait_done, "forget")
        assert ok_value(await call())["receipt"]["to_state"] == "tombstoned"


async def test_another_principal_who_signs_in_is_refused(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    mallory = Person(browser, user="agent-mallory")
    async with agent_of(site) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id, new_key("forget"))
        call = partial(agent.client.call_tool, FORGET, arguments)
        link = await link_of(call)

        await anyio.to_thread.run_sync(mallory.open, link)

        assert mallory.error() == "forbidden"
        next_step = browser.find_element(By.ID, "next-step").text
        assert "Only the person who approves for this agent" in next_step
        assert NOTE not in browser.page_source and browser.find_elements(By.TAG_NAME, "form") == []
        assert await link_of(call) == link  # unanswered
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


async def test_the_agent_signing_in_with_its_own_account_gets_no_session(
    site: CloudSite, browser: webdriver.Chrome
) -> None:
    site.provider.claims_for[ALICE] = {"groups": ["engram-agents"]}  # the agents' group
    agent_user = Person(browser)  # the principal's own account at the provider
    async with agent_of(site) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id, new_key("forget"))
        call = partial(agent.client.call_tool, FORGET, arguments)
        link = await link_of(call)

        await anyio.to_thread.run_sync(agent_user.open, link)

        assert agent_user.error() == "not_a_person"
        assert [c for c in browser.get_cookies() if c["name"] == "engram_approver"] == []
        assert NOTE not in browser.page_source and browser.find_elements(By.TAG_NAME, "form") == []
        assert await link_of(call) == link  # unanswered


async def test_the_signed_in_page_reads_at_phone_width_and_on_a_desktop(
    site: CloudSite, browser: webdriver.Chrome, screenshots: Path
) -> None:
    person = Person(browser)
    async with agent_of(site) as agent:
        record_id = await agent.remember(NOTE)
        link = await link_of(
            lambda: agent.client.call_tool(FORGET, agent.forget_arguments(record_id))
        )
        await anyio.to_thread.run_sync(person.open, link)
        try:
            desktop = full_screenshot(browser, screenshots / "cloud-approval-desktop.png")
            as_phone(browser)
            browser.get(link)  # signed in: the session cookie is sent, no new sign-in
            assert browser.find_elements(By.CSS_SELECTOR, "form button")
            phone = full_screenshot(browser, screenshots / "cloud-approval-phone-320.png")
            assert page_width(browser) <= PHONE_WIDTH  # nothing overflows sideways
            buttons = browser.find_elements(By.CSS_SELECTOR, "form button")
            assert [b.text for b in buttons] == ["Approve", "Decline"]
            assert all(b.is_displayed() and b.size["width"] >= 100 for b in buttons)
            assert record_id in browser.find_element(By.ID, "request").text
            assert approval_id_of(link).startswith("apr_")
        finally:
            as_desktop(browser)
        assert desktop.stat().st_size > 0 and phone.stat().st_size > 0

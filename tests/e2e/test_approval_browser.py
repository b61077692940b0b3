"""The embedded approval page in a real browser, from a real URL elicitation.

The official ``mcp`` client declares URL-only elicitation; ``forget``/``withdraw`` hand it a link
to ``/approvals/{id}?secret=…``; headless Chromium (Selenium, Debian's chromium-driver) opens it,
reads the memory, types the one-time code the operator's terminal shows, presses Approve or
Decline; the client's retry with the same key commits (or gets ``gate_failed``). The link alone
does not answer: without the code the page refuses. Also: an expired request, a POST without the page's CSRF token, and the
page at phone width (320 px) with screenshots (``ENGRAM_SCREENSHOTS=DIR`` keeps them there).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp.client.session import ClientRequestContext
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from engram_memory.embedded.console.app import sign_in_link

from browser_support import (
    PHONE_WIDTH,
    as_desktop,
    as_phone,
    full_screenshot,
    open_chromium,
    page_width,
    screenshots_dir,
    text_of,
)
from e2e_support import (
    FORGET,
    LEGACY,
    MODERN,
    REVISIONS,
    WITHDRAW,
    Agent,
    HttpService,
    age_approval,
    approval_id_of,
    envelope,
    error_code,
    link_of,
    new_agent,
    new_key,
    ok_value,
    terminal_code,
)

pytestmark = pytest.mark.anyio

NOTE = "Decision: release branches are cut on Tuesdays after the freeze review."
DRAFT = "A draft: the staging flag ENGRAM_FAST is only for load tests."


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    yield from open_chromium()


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshots_dir(tmp_path_factory, "approval-screenshots")


class Person:
    """The human behind the client: opens each link in Chromium, types the code their terminal
    shows and presses a button."""

    def __init__(
        self, browser: webdriver.Chrome, service: HttpService, decision: str = "Approve"
    ) -> None:
        self.browser = browser
        self.service = service
        self.decision = decision
        self.links: list[str] = []
        self.memory_shown: list[list[str]] = []

    def answer(self, url: str) -> str:
        """Open the page, read it, type the code, press the button; the outcome's decision."""
        self.links.append(url)
        as_desktop(self.browser)
        self.browser.get(url)
        self.memory_shown.append(text_of(self.browser, "#memory blockquote p"))
        code = terminal_code(self.service, approval_id_of(url))
        self.browser.find_element(By.ID, "code").send_keys(code.lower())  # as typed, any case
        self.browser.find_element(By.XPATH, f"//button[text()='{self.decision}']").click()
        # the click starts a navigation: wait for the answer page, not the one being left
        outcome = WebDriverWait(self.browser, 20).until(
            expected_conditions.presence_of_element_located((By.ID, "outcome"))
        )
        return str(outcome.get_attribute("data-decision"))

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        """The 2026-07-28 client's elicitation callback: a URL elicitation, answered on the page."""
        assert isinstance(params, types.ElicitRequestURLParams), params
        await anyio.to_thread.run_sync(self.answer, params.url)
        return types.ElicitResult(action="accept")  # "I opened the page": the retry follows


async def gated(
    agent: Agent, person: Person, mode: str, tool: str, arguments: dict[str, Any]
) -> types.CallToolResult:
    """Call a gated tool as the client would: on 2025-11-25 the -32042 link is opened by the
    person and the call retried with the same key; 2026-07-28 does both inside the client."""
    call = partial(agent.client.call_tool, tool, arguments)
    if mode == MODERN:
        return await call()
    link = await link_of(call)
    await anyio.to_thread.run_sync(person.answer, link)
    return await call()


# -- the flows ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", REVISIONS)
async def test_approving_on_the_page_lets_the_retry_forget_the_record(
    http_service: HttpService, browser: webdriver.Chrome, mode: str
) -> None:
    person = Person(browser, http_service, "Approve")
    async with new_agent(http_service, mode, person, url_only=True) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id, new_key("forget"))
        forgotten = ok_value(await gated(agent, person, mode, FORGET, arguments))
        assert forgotten["receipt"]["to_state"] == "tombstoned"
        assert forgotten["replayed"] is False
        assert person.memory_shown == [[NOTE]]  # the person saw the memory, not only its id
        assert error_code(await agent.get(record_id)) == "NOT_FOUND"
        again = ok_value(await agent.client.call_tool(FORGET, arguments))
        assert again["replayed"] is True and len(person.links) == 1  # never asked twice


@pytest.mark.parametrize("mode", REVISIONS)
async def test_declining_on_the_page_fails_the_retry_and_keeps_the_candidate(
    http_service: HttpService, browser: webdriver.Chrome, mode: str
) -> None:
    person = Person(browser, http_service, "Decline")
    async with new_agent(http_service, mode, person, url_only=True) as agent:
        candidate_id = await agent.captured(DRAFT)
        arguments = agent.withdraw_arguments(candidate_id, new_key("withdraw"))
        refused = envelope(await gated(agent, person, mode, WITHDRAW, arguments))
        assert refused["error"]["code"] == "gate_failed"
        assert person.memory_shown == [[DRAFT]]  # the candidate's own principal sees its text
        assert ok_value(await agent.admit(candidate_id))["outcome"]["status"] == "accepted"


async def test_an_expired_request_shows_an_error_page_and_the_retry_asks_anew(
    http_service: HttpService, browser: webdriver.Chrome
) -> None:
    person = Person(browser, http_service)
    async with new_agent(http_service, LEGACY, person, url_only=True) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        call = partial(agent.client.call_tool, FORGET, arguments)
        first = await link_of(call)
        age_approval(http_service, approval_id_of(first), 301_000)
        browser.get(first)
        error = browser.find_element(By.ID, "error")
        assert error.get_attribute("data-error") == "expired"
        assert "retry" in browser.find_element(By.ID, "next-step").text
        assert browser.find_elements(By.TAG_NAME, "form") == []
        second = await link_of(call)
        assert approval_id_of(second) != approval_id_of(first)
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


async def test_a_post_without_the_page_csrf_token_is_refused_and_changes_nothing(
    http_service: HttpService, browser: webdriver.Chrome
) -> None:
    person = Person(browser, http_service)
    async with new_agent(http_service, LEGACY, person, url_only=True) as agent:
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        call = partial(agent.client.call_tool, FORGET, arguments)
        link = await link_of(call)
        async with httpx2.AsyncClient() as http:
            forged = await http.post(link, data={"decision": "approve"})
            cross_site = await http.post(
                link,
                data={"decision": "approve", "csrf_token": "0" * 64},
                headers={"Origin": "https://attacker.example"},
            )
            guessed = await http.get(link.split("?")[0] + "?secret=guess")
        assert forged.status_code == 403 and "could not be verified" in forged.text
        assert cross_site.status_code == 403
        assert guessed.status_code == 404 and NOTE not in guessed.text
        assert await link_of(call) == link  # still the same open question, unanswered
        await anyio.to_thread.run_sync(person.answer, link)
        assert ok_value(await call())["receipt"]["to_state"] == "tombstoned"


async def test_the_page_reads_at_phone_width_and_on_a_desktop(
    http_service: HttpService, browser: webdriver.Chrome, screenshots: Path
) -> None:
    person = Person(browser, http_service)
    async with new_agent(http_service, LEGACY, person, url_only=True) as agent:
        record_id = await agent.remember(NOTE)
        link = await link_of(
            lambda: agent.client.call_tool(FORGET, agent.forget_arguments(record_id))
        )
        try:
            as_desktop(browser)
            browser.get(link)
            desktop = full_screenshot(browser, screenshots / "approval-desktop.png")
            as_phone(browser)
            browser.get(link)
            phone = full_screenshot(browser, screenshots / "approval-phone-320.png")
            assert page_width(browser) <= PHONE_WIDTH  # nothing overflows sideways, ids wrap
            buttons = browser.find_elements(By.CSS_SELECTOR, "form button")
            assert [b.text for b in buttons] == ["Approve", "Decline"]
            assert all(b.is_displayed() and b.size["width"] >= 100 for b in buttons)
            assert record_id in browser.find_element(By.ID, "request").text
        finally:
            as_desktop(browser)
        assert desktop.stat().st_size > 0 and phone.stat().st_size > 0


async def test_the_link_alone_shows_the_request_but_only_the_terminal_code_answers_it(
    http_service: HttpService, browser: webdriver.Chrome
) -> None:
    """A person who opens the link without the code sees the request and cannot answer; with a
    wrong code the page says so; with the code their terminal shows, the approval goes through."""
    person = Person(browser, http_service)
    async with new_agent(http_service, LEGACY, person, url_only=True) as agent:
        record_id = await agent.remember(NOTE)
        call = partial(agent.client.call_tool, FORGET, agent.forget_arguments(record_id))
        link = await link_of(call)
        as_desktop(browser)
        browser.get(link)
        assert text_of(browser, "#memory blockquote p") == [NOTE]  # read-only with the link
        code_field = browser.find_element(By.ID, "code")
        assert code_field.get_attribute("required") is not None
        assert "terminal" in browser.find_element(By.CSS_SELECTOR, "label[for=code]").text
        code_field.send_keys("AAAA-AAAA")
        browser.find_element(By.XPATH, "//button[text()='Approve']").click()
        error = WebDriverWait(browser, 20).until(
            expected_conditions.presence_of_element_located((By.ID, "error"))
        )
        assert error.get_attribute("data-error") == "wrong_code"
        assert "terminal" in browser.find_element(By.ID, "next-step").text
        assert await link_of(call) == link  # still open, unanswered

        assert await anyio.to_thread.run_sync(person.answer, link) == "approve"
        assert ok_value(await call())["receipt"]["to_state"] == "tombstoned"


def decision_colours(browser: webdriver.Chrome, css: str) -> dict[str, tuple[str, ...]]:
    """The computed colours (background, text, border) of the first Approve and Decline
    buttons under ``css``, by label."""
    colours: dict[str, tuple[str, ...]] = {}
    for button in browser.find_elements(By.CSS_SELECTOR, css):
        if button.text in ("Approve", "Decline") and button.text not in colours:
            colours[button.text] = tuple(
                button.value_of_css_property(name)
                for name in ("background-color", "color", "border-top-color")
            )
    return colours


async def test_approve_and_decline_wear_the_same_colours_on_the_page_and_in_the_console(
    http_service: HttpService, browser: webdriver.Chrome
) -> None:
    async with new_agent(
        http_service, LEGACY, Person(browser, http_service), url_only=True
    ) as agent:
        asked = agent.forget_arguments(await agent.remember(NOTE))
        link = await link_of(partial(agent.client.call_tool, FORGET, asked))
    as_desktop(browser)
    browser.get(link)  # the question stays open after the agent has gone
    on_page = decision_colours(browser, "form button")
    browser.delete_all_cookies()
    now = int(time.time() * 1000)
    browser.get(sign_in_link(http_service.data_dir, http_service.base_url, "colours", now))
    browser.get(f"{http_service.base_url}/console/approvals")
    in_console = decision_colours(browser, ".question form button")
    assert set(on_page) == {"Approve", "Decline"}, on_page
    assert in_console == on_page
    assert on_page["Approve"] != on_page["Decline"]  # two actions, told apart

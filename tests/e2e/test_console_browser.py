"""The operator console in a real browser, on a real embedded server.

An agent remembers through the official ``mcp`` client; the operator runs the real
``engram-memory console`` command for a one-time link, and headless Chromium (Selenium) signs in
with it, searches, opens the record, reads its history, forgets it through the confirmation and
finds the audit line with the operator's name. Around that path: a reused link, an expired
session, forms without or with a wrong CSRF token, an agent's bearer token, and the forgotten
text looked for in every page the console serves.
"""

from __future__ import annotations

# ruff: noqa: S603 - the subprocess is this environment's own engram-memory
import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait

from engram_memory.contract.types import format_instant
from engram_memory.engine.context import Scope

from browser_support import (
    as_desktop,
    as_width,
    broken_words,
    full_screenshot,
    open_chromium,
    overflowing,
    screenshots_dir,
    text_of,
)
from e2e_support import (
    FORGET,
    LEGACY,
    MODERN,
    Agent,
    HttpService,
    engram_cli,
    http_client,
    ok_value,
    protocol_error,
    serve_http,
)

WORKSPACE = "default"
OPERATOR = "console-operator"


@dataclass
class Seeded:
    service: HttpService
    data_dir: Path
    token: str
    forget_text: str
    forget_id: str
    keep_text: str
    keep_id: str
    pending_text: str
    pending_id: str
    asked_text: str
    asked_id: str
    approval_id: str
    forget_arguments: dict[str, Any]


async def _seed(service: HttpService, token: str, seeded: dict[str, Any]) -> None:
    """Three records (one of them asked to be forgotten: a question waits) and a candidate."""
    async with http_client(service.url, token, MODERN) as client:
        agent = Agent(client)
        seeded["forget_id"] = await agent.remember(seeded["forget_text"])
        seeded["keep_id"] = await agent.remember(seeded["keep_text"])
        seeded["pending_id"] = await agent.captured(seeded["pending_text"])
        seeded["asked_id"] = await agent.remember(seeded["asked_text"])
    async with http_client(service.url, token, LEGACY) as client:  # it cannot ask a human
        arguments = Agent(client).forget_arguments(seeded["asked_id"])
        error = await protocol_error(partial(client.call_tool, FORGET, arguments))
        seeded["approval_id"] = error.data["approval_id"]  # -32603's data names the question
        seeded["forget_arguments"] = arguments


async def _retry_forget(seeded: Seeded) -> dict[str, Any]:
    async with http_client(seeded.service.url, seeded.token, LEGACY) as client:
        return ok_value(await client.call_tool(FORGET, seeded.forget_arguments))


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    data_dir = tmp_path_factory.mktemp("console")
    marker = uuid.uuid4().hex[:10]
    with serve_http(data_dir) as service:
        token = service.tokens.mint(workspace=WORKSPACE)
        texts = {
            "forget_text": f"Decision: the quarterly payroll export {marker} runs on Fridays.",
            "keep_text": "Decision: release branches are cut on Tuesdays after the freeze.",
            "pending_text": "Convention: staging deploys wait for the on-call engineer's nod.",
            "asked_text": "Fact: the old build farm in rack 12 was retired in March.",
        }
        ids: dict[str, Any] = dict(texts)
        anyio.run(_seed, service, token, ids)
        yield Seeded(service=service, data_dir=data_dir, token=token, **ids)


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    yield from open_chromium()


def console_link(seeded: Seeded, operator: str = OPERATOR) -> str:
    """A one-time link from the real ``engram-memory console`` command."""
    port = seeded.service.base_url.rsplit(":", 1)[1]
    done = subprocess.run(
        [
            engram_cli(),
            "console",
            "--data-dir",
            str(seeded.data_dir),
            "--operator",
            operator,
            "--port",
            port,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    link = done.stdout.strip()
    assert re.fullmatch(rf"{re.escape(seeded.service.base_url)}/console/signin/[\w-]{{43}}", link)
    return link


def sign_in(browser: webdriver.Chrome, seeded: Seeded, operator: str = OPERATOR) -> None:
    browser.delete_all_cookies()
    browser.get(console_link(seeded, operator))
    assert operator in browser.find_element(By.ID, "operator").text


def title(browser: webdriver.Chrome) -> str:
    return str(browser.find_element(By.TAG_NAME, "h1").text)


def session_cookie(browser: webdriver.Chrome) -> dict[str, str]:
    cookie = browser.get_cookie("engram_console")
    assert cookie is not None
    return {"engram_console": str(cookie["value"])}


def test_a_link_signs_in_once_to_a_strict_http_only_session_and_a_reused_link_is_refused(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    link = console_link(seeded)
    browser.delete_all_cookies()
    browser.get(link)
    assert OPERATOR in browser.find_element(By.ID, "operator").text
    assert browser.find_element(By.ID, "journal-cursor").text != ""
    assert browser.find_element(By.ID, "pending-count").text == "1"
    cookie = browser.get_cookie("engram_console")
    assert cookie is not None
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/console"

    browser.delete_all_cookies()
    browser.get(link)  # the same link again
    assert title(browser) == "This sign-in link cannot be used"
    assert not browser.find_elements(By.ID, "operator")
    with httpx2.Client(base_url=seeded.service.base_url) as http:
        assert http.get(link.removeprefix(seeded.service.base_url)).status_code == 403


def test_an_expired_session_is_refused_and_asks_for_a_new_link(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    browser.get(seeded.service.base_url + "/console/records")
    assert title(browser) == "Records"
    for session in seeded.service.server.console.sessions.all():
        session.expires_at_ms = 0  # the server's clock is the real one: the session is aged
    browser.get(seeded.service.base_url + "/console/records")
    assert title(browser) == "Sign in to the console"
    assert "console" in browser.find_element(By.ID, "detail").text


def test_a_form_without_or_with_a_wrong_csrf_token_is_refused_and_changes_nothing(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    path = f"/console/records/{seeded.keep_id}"
    form = {"action": "forget", "reason": "x", "confirmed": "yes", "workspace": WORKSPACE}
    with httpx2.Client(base_url=seeded.service.base_url, cookies=session_cookie(browser)) as http:
        for sent in (form, {**form, "csrf_token": "0" * 64}):
            refused = http.post(path, data=sent)
            assert refused.status_code == 403
            assert "Form refused" in refused.text
        shown = http.get(path, params={"workspace": WORKSPACE})
    assert shown.status_code == 200
    assert 'id="state">accepted_current<' in shown.text
    assert seeded.keep_text in shown.text
    # and in the browser: the record page's own forget form, its token altered before sending
    browser.get(f"{seeded.service.base_url}{path}")
    browser.execute_script(
        "for (const f of document.querySelectorAll('input[name=csrf_token]')) f.value = 'f'.repeat(64);"
    )
    browser.find_element(By.ID, "reason-forget").send_keys("a forged form")
    press(browser, "//button[@id='action-forget']")
    assert title(browser) == "Form refused"
    assert stored_state(seeded, seeded.keep_id) == "accepted_current"


def test_an_agents_bearer_token_opens_no_console_page(seeded: Seeded) -> None:
    bearer = {"Authorization": f"Bearer {seeded.token}"}
    with httpx2.Client(base_url=seeded.service.base_url, headers=bearer) as http:
        for path in (
            "/console/",
            "/console/records?q=payroll",
            f"/console/records/{seeded.keep_id}",
        ):
            refused = http.get(path)
            assert refused.status_code == 401, path
            assert "Sign in to the console" in refused.text
            assert seeded.keep_text not in refused.text
            assert refused.headers["cache-control"] == "no-store"


def press(browser: webdriver.Chrome, xpath: str) -> None:
    """Press a button and wait until the page it loads has replaced this one."""
    page = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.XPATH, xpath).click()
    WebDriverWait(browser, 20).until(expected_conditions.staleness_of(page))


def _wait_for(browser: webdriver.Chrome, element_id: str) -> None:
    WebDriverWait(browser, 20).until(
        expected_conditions.presence_of_element_located((By.ID, element_id))
    )


def test_search_history_forget_with_confirmation_leaves_a_tombstone_an_audit_line_and_no_text(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    browser.find_element(By.LINK_TEXT, "Records").click()
    browser.find_element(By.ID, "q").send_keys("quarterly payroll export")
    browser.find_element(By.XPATH, "//button[text()='Search']").click()
    _wait_for(browser, "results")
    assert browser.find_element(By.ID, "receipt")  # the rank receipt is shown
    hit = next(
        r
        for r in browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
        if seeded.forget_id in r.text
    )
    hit.find_element(By.PARTIAL_LINK_TEXT, "quarterly payroll export").click()
    _wait_for(browser, "memory")
    assert seeded.forget_text in browser.find_element(By.ID, "memory").text
    history = text_of(browser, "#history tbody tr")
    assert any("capture" in row for row in history), history

    browser.find_element(By.ID, "reason-forget").send_keys("payroll details do not belong here")
    browser.find_element(By.ID, "action-forget").click()
    _wait_for(browser, "confirm")
    assert "cannot be undone" in browser.find_element(By.ID, "consequence").text
    assert stored_state(seeded, seeded.forget_id) == "accepted_current"  # not yet
    browser.find_element(By.ID, "confirm").click()
    _wait_for(browser, "tombstone")
    assert browser.find_element(By.ID, "state").text == "tombstoned"
    assert not browser.find_elements(By.ID, "memory")
    last = text_of(browser, "#history tbody tr")[-1]
    assert "tombstone" in last  # the journal names the forget by what it leaves
    assert f"operator:{OPERATOR}" in last
    assert "payroll details do not belong here" in last

    browser.find_element(By.LINK_TEXT, "Audit").click()
    browser.find_element(By.ID, "tool").send_keys("admin.forget")
    press(browser, "//button[text()='Filter']")
    rows = text_of(browser, "#audit tbody tr")
    assert any(f"operator:{OPERATOR}" in row and seeded.forget_id in row for row in rows), rows
    assert all("admin.forget" in row for row in rows), rows
    # In this test, not a second one: pytest-xdist may run another test on another worker,
    # whose module fixture never saw this forget.
    assert_no_page_holds_the_forgotten_text(browser, seeded)


def stored_state(seeded: Seeded, record_id: str) -> str | None:
    """The record's state in the server's own store."""
    scope = Scope(seeded.service.server.surface.runtime.host.tenant_id, WORKSPACE)
    row = seeded.service.server.host.store.record_get(scope, record_id)
    return None if row is None else row.state


def assert_no_page_holds_the_forgotten_text(browser: webdriver.Chrome, seeded: Seeded) -> None:
    assert stored_state(seeded, seeded.forget_id) == "tombstoned"
    marker = seeded.forget_text.split()[5]  # the unique word (never typed in a query here)
    paths = [
        "/console/",
        "/console/records",
        "/console/records?state=tombstoned",
        "/console/records?q=quarterly+payroll+export",
        f"/console/records/{seeded.forget_id}",
        "/console/pending",
        "/console/approvals",
        "/console/audit",
        "/console/audit?tool=admin.forget",
    ]
    with httpx2.Client(base_url=seeded.service.base_url, cookies=session_cookie(browser)) as http:
        for path in paths:
            served = http.get(path)
            assert served.status_code == 200, (path, served.text)
            assert served.headers["cache-control"] == "no-store"
            assert marker not in served.text, path
    browser.get(f"{seeded.service.base_url}/console/records/{seeded.forget_id}")
    assert marker not in browser.page_source


def test_a_pending_candidate_is_read_and_accepted_from_the_console(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    browser.find_element(By.LINK_TEXT, "Pending").click()
    (waiting,) = [r for r in text_of(browser, "#pending tbody tr") if seeded.pending_id in r]
    assert "not submitted for admission" in waiting and seeded.pending_text in waiting
    browser.find_element(By.LINK_TEXT, seeded.pending_id).click()
    _wait_for(browser, "memory")
    assert seeded.pending_text in browser.find_element(By.ID, "memory").text
    browser.find_element(By.ID, "reason").send_keys("checked with the on-call rota")
    browser.find_element(By.ID, "accept").click()
    _wait_for(browser, "outcome")
    outcome = browser.find_element(By.ID, "outcome").text
    assert "accepted" in outcome
    browser.find_element(By.LINK_TEXT, "Pending").click()
    assert seeded.pending_id not in browser.page_source


def test_an_approval_is_answered_from_the_console_and_the_agents_retry_commits(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    browser.find_element(By.LINK_TEXT, "Approvals").click()
    question = browser.find_element(By.CSS_SELECTOR, ".question")
    assert seeded.asked_text in question.text  # the text the person decides on
    assert seeded.asked_id in question.text
    question.find_element(By.XPATH, ".//button[text()='Approve']").click()
    _wait_for(browser, "title")
    assert "approved" in title(browser)
    assert "It was carried out" in browser.find_element(By.ID, "outcome").text  # at once
    row = seeded.service.server.approvals.book.get(seeded.approval_id)
    assert row is not None and row.state == "approved" and row.answered_by == "console"
    assert row.committed_at_ms is not None  # forgotten before the agent retried
    forgotten = anyio.run(_retry_forget, seeded)
    assert forgotten["receipt"]["to_state"] == "tombstoned" and forgotten["replayed"] is False
    browser.get(f"{seeded.service.base_url}/console/records/{seeded.asked_id}")
    last = text_of(browser, "#history tbody tr")[-1]  # who asked, why, who approved
    assert "tombstone" in last and "reason:obsolete" in last
    assert f"operator:{OPERATOR} in the console" in last
    browser.get(f"{seeded.service.base_url}/console/audit?tool=admin.approvals_approve")
    rows = text_of(browser, "#audit tbody tr")
    assert any(f"operator:{OPERATOR}" in r and seeded.approval_id in r for r in rows), rows


def test_the_overview_charts_the_days_activity_and_the_audit_filters_by_time(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    chart = browser.find_element(By.ID, "activity")
    assert chart.get_attribute("role") == "img"
    described = browser.find_element(By.ID, "activity-total").get_attribute("textContent") or ""
    assert int(described.split()[0]) > 0  # the seeding's calls, this hour
    browser.find_element(By.LINK_TEXT, "Audit").click()
    today = browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr")[0].text.split()[0][:10]
    for since, until, some in ((today, "", True), ("2999", "", False), ("", "2000-01-01", False)):
        browser.find_element(By.ID, "since").clear()
        browser.find_element(By.ID, "since").send_keys(since)
        browser.find_element(By.ID, "until").clear()
        browser.find_element(By.ID, "until").send_keys(until)
        press(browser, "//button[text()='Filter']")
        rows = text_of(browser, "#audit tbody tr")
        assert (rows != ["No entries."]) is some, (since, until, rows)


def admin(seeded: Seeded, *words: str) -> Any:
    """The real ``engram-memory admin WORDS... --json`` on the server's data dir: its JSON."""
    done = subprocess.run(
        [engram_cli(), "admin", *words, "--data-dir", str(seeded.data_dir), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(done.stdout)


def test_the_record_page_shows_the_records_receipts_as_admin_records_show_gives_them(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    browser.get(f"{seeded.service.base_url}/console/records/{seeded.keep_id}")
    shown = browser.find_element(By.ID, "receipts").text
    record = admin(seeded, "records", "show", seeded.keep_id)
    body = record["record"]
    for value in (
        record["record_digest"],
        body["payload_digest"],
        body["authorization_receipt_digest"],
        body["trust"]["receipt_digest"],
        body["trust"]["class"],
    ):
        assert value in shown, (value, shown)
    assert "Authorization receipt" in shown
    assert "Trust receipt" in shown


def captured_by(seeded: Seeded, record_id: str) -> tuple[str, str]:
    """The principal that captured a record and the capture's UTC date, from the store."""
    scope = Scope(seeded.service.server.surface.runtime.host.tenant_id, WORKSPACE)
    store = seeded.service.server.host.store
    row = store.record_get(scope, record_id)
    assert row is not None
    candidate = store.candidate_get(scope, row.candidate_id)
    assert candidate is not None
    return candidate.principal, format_instant(candidate.created_at_ms)[:10]


def test_the_records_list_filters_by_capturing_principal_and_capture_time(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    principal, day = captured_by(seeded, seeded.keep_id)
    cases = (
        ({"principal": principal}, True),
        ({"principal": "someone-else"}, False),
        ({"since": day, "until": day}, True),
        ({"since": "2999"}, False),
        ({"until": "2000-01-01"}, False),
        ({"principal": principal, "since": day, "state": "accepted_current"}, True),
    )
    with httpx2.Client(base_url=seeded.service.base_url, cookies=session_cookie(browser)) as http:
        for params, listed in cases:
            page = http.get("/console/records", params={"workspace": WORKSPACE, **params})
            assert page.status_code == 200, page.text
            assert (seeded.keep_id in page.text) is listed, params
            assert (principal in page.text) is listed, params  # the "Captured by" column
    browser.get(f"{seeded.service.base_url}/console/records")
    browser.find_element(By.ID, "principal").send_keys(principal)
    press(browser, "//button[text()='Filter']")
    rows = text_of(browser, "#records tbody tr")
    assert any(seeded.keep_id in row and principal in row for row in rows), rows


def test_a_backup_is_taken_listed_and_verified_from_the_console_under_the_operators_name(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    browser.find_element(By.LINK_TEXT, "Backups").click()
    assert title(browser) == "Backups"
    press(browser, "//button[@id='create']")
    result = browser.find_element(By.ID, "result").text
    assert "created" in result
    assert int(browser.find_element(By.ID, "result-records").text) >= 1
    taken = sorted((seeded.data_dir / "backups").glob("*.engram-backup.db"))[-1]
    assert taken.name in result
    row = next(r for r in text_of(browser, "#backups tbody tr") if taken.name in r)
    assert str(taken.stat().st_size) in row
    assert f"/{WORKSPACE}:" in row  # the backup's own journal heads

    verify = f"//tr[contains(., '{taken.name}')]//button[text()='Verify']"
    press(browser, verify)
    result = browser.find_element(By.ID, "result").text
    assert "verified" in result and taken.name in result
    # a file that is no backup fails the same check
    forged = taken.with_name("0000-forged.engram-backup.db")
    forged.write_bytes(b"not a database")
    browser.get(f"{seeded.service.base_url}/console/backups")
    press(browser, "//tr[contains(., '0000-forged')]//button[text()='Verify']")
    assert title(browser) == "Refused: BACKUP_INVALID"
    assert "unreadable database" in browser.find_element(By.ID, "detail").text

    browser.get(f"{seeded.service.base_url}/console/audit?by=changes&principal=operator:{OPERATOR}")
    rows = text_of(browser, "#audit tbody tr")
    assert any("admin.backup " in f"{r} " and taken.name in r for r in rows), rows
    assert any("admin.backup_verify" in r and taken.name in r for r in rows), rows


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return screenshots_dir(tmp_path_factory, "console-screenshots")


def test_the_records_list_shows_each_records_text_kind_source_author_state_and_time(
    browser: webdriver.Chrome, seeded: Seeded
) -> None:
    sign_in(browser, seeded)
    body = admin(seeded, "records", "show", seeded.keep_id)["record"]
    principal, day = captured_by(seeded, seeded.keep_id)
    browser.get(f"{seeded.service.base_url}/console/records")
    row = next(r for r in text_of(browser, "#records tbody tr") if seeded.keep_id in r)
    for shown in (
        seeded.keep_text,  # one line: the whole of it
        body["components"][0]["kind"],
        body["citations"][0]["source_ref"],
        principal,
        "accepted_current",
        day,
    ):
        assert shown in row, (shown, row)
    # the text is the link to the record
    browser.find_element(By.LINK_TEXT, seeded.keep_text).click()
    assert title(browser) == f"Record {seeded.keep_id}"
    # the filters keep the columns
    browser.get(f"{seeded.service.base_url}/console/records?principal={principal}")
    row = next(r for r in text_of(browser, "#records tbody tr") if seeded.keep_id in r)
    assert seeded.keep_text in row


PAGES_LAID_OUT = (
    "/console/",
    "/console/records",
    "/console/records?since=2000",  # filtered: with who captured each record, and when
    "/console/audit",
    "/console/approvals",
    "/console/pending",
    "/console/backups",
)


def header_on_one_line(browser: webdriver.Chrome) -> bool:
    """Whether Sign out sits on the title's line of the header."""
    brand = browser.find_element(By.CSS_SELECTOR, "header strong").rect
    button = browser.find_element(By.XPATH, "//header//button[text()='Sign out']").rect
    middle = button["y"] + button["height"] / 2
    return bool(brand["y"] <= middle <= brand["y"] + brand["height"])


@pytest.mark.parametrize("width", [1280, 800])
def test_the_console_fits_its_window_without_breaking_words(
    browser: webdriver.Chrome, seeded: Seeded, screenshots: Path, width: int
) -> None:
    sign_in(browser, seeded)
    try:
        as_width(browser, width)
        problems = {}
        for path in (*PAGES_LAID_OUT, f"/console/records/{seeded.keep_id}"):
            browser.get(f"{seeded.service.base_url}{path}")
            found = {
                "overflowing": overflowing(browser),
                "broken words": broken_words(browser, "main table td, main dd"),
                "Sign out beside the title": header_on_one_line(browser),
            }
            if found != {"overflowing": [], "broken words": [], "Sign out beside the title": True}:
                problems[path] = found
        assert not problems, (width, problems)
        browser.get(f"{seeded.service.base_url}/console/records")
        full_screenshot(browser, screenshots / f"console-records-{width}.png")
        if width == 1280:  # the content uses the window, not a narrow column in its middle
            table = browser.find_element(By.ID, "records").rect
            assert table["width"] >= 1100, table
    finally:
        as_desktop(browser)


def test_the_overview_says_its_health_in_words_and_charts_with_axes(
    browser: webdriver.Chrome, seeded: Seeded, screenshots: Path
) -> None:
    sign_in(browser, seeded)
    counts = browser.find_element(By.ID, "counts").text
    for leaked in ("True", "False", "None", "(--full"):
        assert leaked not in counts, (leaked, counts)
    assert re.search(r"\b(fresh|stale)\b", browser.find_element(By.ID, "index").text)
    assert browser.find_element(By.ID, "key-store").text.startswith("health ok")
    labels = [
        label.get_attribute("textContent") or ""
        for label in browser.find_elements(By.CSS_SELECTOR, "#activity text")
    ]
    assert "calls" in labels and "hour starting (UTC)" in labels, labels
    assert "0" in labels  # the calls axis starts at zero ...
    assert sum(bool(re.fullmatch(r"\d\d:00", label)) for label in labels) == 6, labels  # hours
    assert len(browser.find_elements(By.CSS_SELECTOR, "#activity line.axis")) >= 2
    full_screenshot(browser, screenshots / "console-overview.png")


def test_the_audit_page_lists_agents_calls_and_operators_under_a_filter(
    browser: webdriver.Chrome, seeded: Seeded, screenshots: Path
) -> None:
    sign_in(browser, seeded)
    browser.get(f"{seeded.service.base_url}/console/records")  # a page view, audited
    browser.find_element(By.LINK_TEXT, "Audit").click()
    tools = [row.split()[3] for row in text_of(browser, "#audit tbody tr")]
    assert {"capture", "request_admission"} <= set(tools), tools
    assert not [tool for tool in tools if tool.startswith("admin.")], tools
    full_screenshot(browser, screenshots / "console-audit.png")

    for by, expected in (("reads", "admin.records_list"), ("changes", None)):
        Select(browser.find_element(By.ID, "by")).select_by_value(by)
        press(browser, "//button[text()='Filter']")
        rows = text_of(browser, "#audit tbody tr")
        tools = [row.split()[3] for row in rows if row != "No entries."]
        assert all(tool.startswith("admin.") for tool in tools), tools
        if expected:
            assert expected in tools, tools
        else:  # actions only: no page view among them
            assert "admin.records_list" not in tools, tools

"""The approval page, parsed as HTML: what it shows, its form, its errors and headers."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from bs4 import BeautifulSoup, Tag

from engram_memory.approval_page import (
    PAGE_HEADERS,
    ApprovalView,
    Decision,
    DeskAnswer,
    Memory,
    PageError,
    PageRequest,
    csrf_token,
    handle_page,
    memory_from_record,
    plain_summary,
    render_answered,
    render_approval,
    render_error,
)

NOW = 1_790_000_000_000
RECORD = {
    "primary_component_id": "c2",
    "components": [
        {
            "component_id": "c1",
            "kind": "context",
            "text": "Deploys ran nightly.",
            "citation_ids": ["s1"],
        },
        {
            "component_id": "c2",
            "kind": "decision",
            "text": "We deploy <b>on Tuesdays</b> & never on Fridays.",
            "citation_ids": ["s1", "s2"],
        },
    ],
    "citations": [
        {
            "citation_id": "s1",
            "source_ref": "adr-12",
            "locator": {"scheme": "path", "value": "docs/adr/12.md"},
        },
        {
            "citation_id": "s2",
            "source_ref": "chat",
            "locator": {"scheme": "url", "value": "https://x/1"},
        },
    ],
}
LONG_ID = "mem_" + "a" * 52


def a_view(**changes: object) -> ApprovalView:
    view = ApprovalView(
        approval_id="apr_" + "0" * 32,
        tool="forget",
        target=LONG_ID,
        principal="alice",
        agent_id="agent-7",
        session_id="sess-42",
        tenant_id="t1",
        workspace_id="w1",
        reason_ref="reason:outdated",
        expires_at_ms=NOW + 245_000,
        memory=memory_from_record(RECORD, digest="sha256:" + "f" * 64),
    )
    return replace(view, **changes)  # type: ignore[arg-type]


def parse(html: str) -> BeautifulSoup:
    return BeautifulSoup(html, "html.parser")


def facts(page: BeautifulSoup) -> dict[str, str]:
    listing = page.find("dl", id="request")
    assert isinstance(listing, Tag)
    names = [dt.get_text() for dt in listing.find_all("dt")]
    values = [dd.get_text() for dd in listing.find_all("dd")]
    return dict(zip(names, values, strict=True))


def test_the_page_says_who_asks_what_for_which_scope_and_how_long_is_left() -> None:
    page = parse(
        render_approval(a_view(), now_ms=NOW, action_url="/approvals/x?s=1", csrf_token="tok")
    )
    assert page.h1 is not None and page.h1.get_text() == "Forget this memory?"
    shown = facts(page)
    time_left = shown.pop("Time left")
    assert shown == {
        "Requested by": "alice",
        "Agent": "agent-7",
        "Session": "sess-42",
        "Reason": "reason:outdated",
        "Scope": "tenant t1, workspace w1",
        "Target": LONG_ID,
    }
    assert time_left.startswith("4 min (until ") and time_left.endswith(" UTC)")
    assert "left" not in time_left  # "Time left: 4 min", not "Time left: … left"


def test_the_page_and_its_outcomes_say_what_happens_in_plain_words_never_a_raw_code() -> None:
    view = a_view()
    pages = [
        render_approval(view, now_ms=NOW, action_url="/a", csrf_token="t"),
        render_approval(
            replace(view, committed_by_run=True), now_ms=NOW, action_url="/a", csrf_token="t"
        ),
        render_answered(view, Decision.APPROVE),
        render_answered(view, Decision.DECLINE),
        *(render_error(error)[1] for error in PageError),
    ]
    for html in pages:
        text = parse(html).get_text(" ")
        assert "gate_failed" not in text and "GATE_FAILED" not in text
    declined = parse(render_answered(view, Decision.DECLINE)).get_text(" ")
    assert "refused" in declined and "Nothing was changed" in declined


def test_the_embedded_page_asks_for_the_terminal_code_and_hands_it_to_the_desk() -> None:
    plain = parse(render_approval(a_view(), now_ms=NOW, action_url="/a", csrf_token="t"))
    assert plain.find("input", attrs={"name": "code"}) is None  # the cloud signs in instead
    page = parse(
        render_approval(a_view(asks_code=True), now_ms=NOW, action_url="/a", csrf_token="t")
    )
    field = page.find("input", attrs={"name": "code"})
    assert isinstance(field, Tag) and field.has_attr("required")
    assert field["autocomplete"] == "one-time-code"
    label = page.find("label", attrs={"for": "code"})
    assert isinstance(label, Tag) and "terminal" in label.get_text()

    desk = FakeDesk(a_view())
    token = desk.csrf_token(desk.shown.approval_id, desk.secret)
    form = {"csrf_token": token, "decision": "approve", "code": "abcd-efgh"}
    handle_page(desk, request(desk, "POST", form=form), now_ms=NOW, allowed_origin=None)
    assert desk.codes == ["abcd-efgh"]


def test_the_page_shows_the_memory_text_primary_first_and_its_citations_escaped() -> None:
    page = parse(render_approval(a_view(), now_ms=NOW, action_url="/a", csrf_token="tok"))
    texts = [q.p.get_text() for q in page.select("#memory blockquote.component") if q.p]
    assert texts == ["We deploy <b>on Tuesdays</b> & never on Fridays.", "Deploys ran nightly."]
    assert page.select("#memory b") == []  # the memory's markup is text, never markup
    citations = [li.get_text(" ", strip=True) for li in page.select("#citations li")]
    assert citations == ["s1 : adr-12 (path: docs/adr/12.md)", "s2 : chat (url: https://x/1)"]


def test_a_withheld_memory_shows_its_digest_and_capture_time_not_text() -> None:
    withheld = Memory(digest="sha256:" + "e" * 64, captured_at_ms=NOW - 60_000)
    page = parse(
        render_approval(a_view(memory=withheld), now_ms=NOW, action_url="/a", csrf_token="t")
    )
    assert page.select("#memory blockquote") == []
    shown = [dd.get_text() for dd in page.select("#memory dd")]
    assert shown[0] == "sha256:" + "e" * 64
    assert shown[1].endswith("UTC")


def test_the_form_posts_back_with_a_csrf_token_and_two_explicit_buttons() -> None:
    page = parse(
        render_approval(a_view(), now_ms=NOW, action_url="/approvals/a?s=x&y=1", csrf_token="tok-1")
    )
    forms = page.find_all("form")
    assert len(forms) == 1
    form = forms[0]
    assert form["method"] == "post" and form["action"] == "/approvals/a?s=x&y=1"
    hidden = form.find("input", attrs={"type": "hidden"})
    assert isinstance(hidden, Tag) and hidden["name"] == "csrf_token" and hidden["value"] == "tok-1"
    buttons = [(b["name"], b["value"], b.get_text()) for b in form.find_all("button")]
    assert buttons == [("decision", "approve", "Approve"), ("decision", "decline", "Decline")]
    assert form.find("input", attrs={"type": "checkbox"}) is None


def test_the_page_has_no_script_a_viewport_and_wrapping_ids() -> None:
    html = render_approval(a_view(), now_ms=NOW, action_url="/a", csrf_token="t")
    page = parse(html)
    assert page.find("script") is None
    assert not any(attr.startswith("on") for tag in page.find_all(True) for attr in tag.attrs)
    viewport = page.find("meta", attrs={"name": "viewport"})
    assert isinstance(viewport, Tag) and "width=device-width" in str(viewport["content"])
    assert page.style is not None and "overflow-wrap:anywhere" in page.style.get_text()


def test_the_csp_allows_only_the_page_own_inline_style_by_hash() -> None:
    import base64
    import hashlib

    page = parse(render_approval(a_view(), now_ms=NOW, action_url="/a", csrf_token="t"))
    assert page.style is not None
    style_hash = base64.b64encode(hashlib.sha256(page.style.get_text().encode()).digest()).decode()
    directives = dict(
        [*d.split(" ", 1), ""][:2] for d in PAGE_HEADERS["Content-Security-Policy"].split("; ")
    )
    assert directives["default-src"] == "'none'"
    assert directives["style-src"] == f"'sha256-{style_hash}'"
    assert directives["frame-ancestors"] == "'none'"
    assert "script-src" not in directives  # default-src 'none' forbids every script
    assert PAGE_HEADERS["Referrer-Policy"] == "no-referrer"
    assert PAGE_HEADERS["Cache-Control"] == "no-store"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (PageError.NOT_FOUND, 404),
        (PageError.EXPIRED, 410),
        (PageError.ANSWERED, 409),
        (PageError.CSRF, 403),
        (PageError.FORBIDDEN, 403),
        (PageError.BAD_REQUEST, 400),
        (PageError.UNAVAILABLE, 503),
        (PageError.WRONG_CODE, 403),
        (PageError.NO_MORE_ATTEMPTS, 429),
        (PageError.SIGN_IN, 401),
        (PageError.NOT_A_PERSON, 403),
        (PageError.STALE_SIGN_IN, 401),
    ],
)
def test_every_error_is_a_page_with_a_next_step(error: PageError, status: int) -> None:
    code, html = render_error(error)
    page = parse(html)
    heading = page.find("h1", id="error")
    next_step = page.find(id="next-step")
    assert code == status
    assert isinstance(heading, Tag) and heading["data-error"] == error.value
    assert isinstance(next_step, Tag) and len(next_step.get_text()) > 20
    assert page.find("meta", attrs={"name": "viewport"}) is not None


def test_the_form_message_carries_the_same_facts_and_memory_as_the_page() -> None:
    view = a_view()
    text = plain_summary(view, NOW)
    for name, value in view.facts(NOW):
        assert f"{name}: {value}" in text.splitlines()
    assert "[decision] We deploy <b>on Tuesdays</b> & never on Fridays. (cites s1, s2)" in text
    assert "- s2: chat (url: https://x/1)" in text


# -- the request core --------------------------------------------------------------------------


@dataclass
class FakeDesk:
    """A desk with one request; the credential is a fixed secret."""

    shown: ApprovalView
    secret: str = "the-secret"
    answers: list[Decision] = field(default_factory=list)
    codes: list[str] = field(default_factory=list)

    def view(self, approval_id: str, credential: str) -> ApprovalView | PageError:
        if approval_id != self.shown.approval_id or credential != self.secret:
            return PageError.NOT_FOUND
        return PageError.ANSWERED if self.answers else self.shown

    def csrf_token(self, approval_id: str, credential: str) -> str:
        return csrf_token(b"k" * 32, approval_id, credential)

    def answer(
        self, approval_id: str, credential: str, decision: Decision, now_ms: int, code: str = ""
    ) -> DeskAnswer | PageError:
        self.codes.append(code)
        if self.answers:
            return PageError.ANSWERED
        self.answers.append(decision)
        return DeskAnswer(self.shown, decision)


def request(desk: FakeDesk, method: str = "GET", **changes: object) -> PageRequest:
    base = PageRequest(
        method=method,
        approval_id=desk.shown.approval_id,
        credential=desk.secret,
        action_url="/approvals/x?s=the-secret",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


ORIGIN = "http://127.0.0.1:8765"


def token_of(html: str) -> str:
    hidden = parse(html).find("input", attrs={"name": "csrf_token"})
    assert isinstance(hidden, Tag)
    return str(hidden["value"])


def test_get_then_post_with_the_page_token_records_the_answer_once() -> None:
    desk = FakeDesk(a_view())
    shown = handle_page(desk, request(desk), now_ms=NOW, allowed_origin=ORIGIN)
    assert shown.status == 200
    form = {"csrf_token": token_of(shown.html), "decision": "approve"}
    answered = handle_page(
        desk, request(desk, "POST", form=form, origin=ORIGIN), now_ms=NOW, allowed_origin=ORIGIN
    )
    outcome = parse(answered.html).find("h1", id="outcome")
    assert answered.status == 200 and isinstance(outcome, Tag)
    assert outcome["data-decision"] == "approve"
    assert desk.answers == [Decision.APPROVE]
    again = handle_page(desk, request(desk, "POST", form=form), now_ms=NOW, allowed_origin=ORIGIN)
    assert again.status == 409 and desk.answers == [Decision.APPROVE]


@pytest.mark.parametrize(
    "form",
    [
        {"decision": "approve"},
        {"decision": "approve", "csrf_token": ""},
        {"decision": "approve", "csrf_token": "0" * 64},
    ],
)
def test_a_post_without_the_page_csrf_token_is_refused(form: dict[str, str]) -> None:
    desk = FakeDesk(a_view())
    refused = handle_page(desk, request(desk, "POST", form=form), now_ms=NOW, allowed_origin=ORIGIN)
    assert refused.status == 403 and desk.answers == []


def test_a_post_from_another_origin_is_refused_even_with_the_token() -> None:
    desk = FakeDesk(a_view())
    form = {
        "csrf_token": desk.csrf_token(desk.shown.approval_id, desk.secret),
        "decision": "approve",
    }
    refused = handle_page(
        desk,
        request(desk, "POST", form=form, origin="https://evil.example"),
        now_ms=NOW,
        allowed_origin=ORIGIN,
    )
    assert refused.status == 403 and desk.answers == []


def test_a_cross_site_fetch_is_refused_and_a_null_origin_needs_the_token_only() -> None:
    desk = FakeDesk(a_view())
    form = {
        "csrf_token": desk.csrf_token(desk.shown.approval_id, desk.secret),
        "decision": "decline",
    }
    cross = request(desk, "POST", form=form, origin="null", fetch_site="cross-site")
    assert handle_page(desk, cross, now_ms=NOW, allowed_origin=ORIGIN).status == 403
    assert desk.answers == []
    same = request(desk, "POST", form=form, origin="null", fetch_site="same-origin")
    assert handle_page(desk, same, now_ms=NOW, allowed_origin=ORIGIN).status == 200
    assert desk.answers == [Decision.DECLINE]


def test_a_post_without_a_decision_changes_nothing() -> None:
    desk = FakeDesk(a_view())
    form = {"csrf_token": desk.csrf_token(desk.shown.approval_id, desk.secret), "decision": "yes"}
    refused = handle_page(desk, request(desk, "POST", form=form), now_ms=NOW, allowed_origin=ORIGIN)
    assert refused.status == 400 and desk.answers == []


def test_an_expired_request_cannot_be_seen_or_answered() -> None:
    desk = FakeDesk(a_view(expires_at_ms=NOW))
    form = {
        "csrf_token": desk.csrf_token(desk.shown.approval_id, desk.secret),
        "decision": "approve",
    }
    assert handle_page(desk, request(desk), now_ms=NOW, allowed_origin=ORIGIN).status == 410
    posted = handle_page(desk, request(desk, "POST", form=form), now_ms=NOW, allowed_origin=ORIGIN)
    assert posted.status == 410 and desk.answers == []


def test_a_wrong_secret_is_not_found_and_shows_nothing_of_the_request() -> None:
    desk = FakeDesk(a_view())
    response = handle_page(
        desk, request(desk, credential="guess"), now_ms=NOW, allowed_origin=ORIGIN
    )
    assert response.status == 404
    assert "alice" not in response.html and "Tuesdays" not in response.html

"""The embedded approval channel (``EmbeddedApprovals``, the ``ApprovalChannel`` port over the
data directory's ``ApprovalBook``) and the page's link desk (``LinkDesk``) that answers the same
questions: ask, answer, expire, list, and the answer a retry takes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import pytest

from engram_memory.adapters.local.approval_book import ApprovalBook
from engram_memory.approval_page import RETRY_WINDOW, Decision, PageError, render_error
from engram_memory.embedded.book_channel import EmbeddedApprovals, LinkDesk, outcome_line
from engram_memory.engine.context import Scope
from engram_memory.engine.gate import (
    APPROVAL_TTL_MS,
    EXECUTION_WINDOW_MS,
    Approval,
    ConfirmationRequest,
    check_approval,
)
from engram_memory.mcp_surface.approval_channel import ApprovalChannel, Declined, Question
from engram_memory.mcp_surface.confirmations import approval_of_state, state_for

from engram_testing import FakeClock, context

T0 = 1_790_000_000_000
BASE_URL = "http://127.0.0.1:8765"


class NoMemoryKernel:
    """A kernel whose store holds no record: the page shows no memory."""

    class store:  # the kernel's attribute
        @staticmethod
        def record_get(scope: Scope, record_id: str) -> None:
            return None

    @staticmethod
    def read(run: Callable[[], Any]) -> Any:
        return run()


def a_request(target: str = "mem_abc") -> ConfirmationRequest:
    ctx = context()
    return ConfirmationRequest(
        tool="forget",
        target=target,
        operation_digest="sha256:" + "1" * 64,
        principal=ctx.principal,
        scope=ctx.scope,
        reason_ref="reason:obsolete",
        summary="",
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def channel(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedApprovals]:
    opened = EmbeddedApprovals(
        lambda: ApprovalBook(tmp_path),
        lambda: cast(Any, NoMemoryKernel()),
        base_url=BASE_URL + "/",
        clock=clock,
    )
    yield opened
    opened.close()


@contextlib.contextmanager
def announcing(
    tmp_path: Path, clock: FakeClock, base_url: str | None
) -> Iterator[tuple[EmbeddedApprovals, list[str]]]:
    """A channel whose terminal lines (the codes it announces) are kept in a list."""
    shown: list[str] = []
    channel = EmbeddedApprovals(
        lambda: ApprovalBook(tmp_path),
        lambda: cast(Any, NoMemoryKernel()),
        base_url=base_url,
        clock=clock,
        notify=shown.append,
    )
    try:
        yield channel, shown
    finally:
        channel.close()


def secret_of(question: Question) -> str:
    assert question.link is not None
    return parse_qs(urlsplit(question.link).query)["secret"][0]


def code_of(channel: EmbeddedApprovals, question: Question) -> str:
    """The code the terminal shows (what the person types on the page)."""
    row = channel.book.get(question.approval_id)
    assert row is not None
    return row.code


def test_a_question_carries_its_link_and_the_pages_summary_for_its_mode(
    channel: EmbeddedApprovals,
) -> None:
    port: ApprovalChannel = channel
    form = port.ask(a_request(), context(), "form")
    url = port.ask(a_request(), context(), "url")

    assert url.approval_id == form.approval_id  # one question per operation
    assert form.link == f"{BASE_URL}/approvals/{form.approval_id}?secret={secret_of(form)}"
    assert form.issued_at_ms == T0 and form.expires_at_ms > T0
    assert "Forget this memory?" in form.message and form.link is not None
    assert form.link in form.message
    assert form.link not in url.message  # the link travels as the URL elicitation's url
    assert f"engram-memory approvals approve {form.approval_id}" in url.message
    assert [row.approval_id for row in port.pending()] == [form.approval_id]
    code = code_of(channel, form)
    assert code not in form.message and code not in url.message  # never to the agent
    assert code not in form.link


def test_the_page_answers_and_the_retry_takes_that_answer_once(
    channel: EmbeddedApprovals, clock: FakeClock
) -> None:
    question = channel.ask(a_request(), context(), "url")
    desk = LinkDesk(channel, csrf_key=b"k" * 32)
    assert channel.given(a_request()) is None
    assert desk.view(question.approval_id, "wrong") is PageError.NOT_FOUND

    clock.advance(5_000)
    answered = desk.answer(
        question.approval_id,
        secret_of(question),
        Decision.APPROVE,
        clock.now,
        code_of(channel, question),
    )
    assert not isinstance(answered, PageError) and answered.decision is Decision.APPROVE
    assert desk.view(question.approval_id, secret_of(question)) is PageError.ANSWERED

    given = channel.given(a_request())
    assert isinstance(given, Approval)
    check_approval(given, a_request(), clock.now)  # the engine takes it as is
    assert channel.pending() == []


def test_a_declined_form_is_reported_once_then_the_operation_asks_anew(
    channel: EmbeddedApprovals,
) -> None:
    question = channel.ask(a_request(), context(), "form")

    declined = channel.answer(question, approve=False)
    assert isinstance(declined, Declined)  # the surface has the engine spend its id
    assert declined.approval.approval_id == question.approval_id
    assert channel.given(a_request()) is None  # the decline was reported by the answer
    assert channel.ask(a_request(), context(), "form").approval_id != question.approval_id


def test_the_first_answer_wins_over_a_later_form(
    channel: EmbeddedApprovals, clock: FakeClock
) -> None:
    question = channel.ask(a_request(), context(), "form")
    desk = LinkDesk(channel, csrf_key=b"k" * 32)
    desk.answer(
        question.approval_id,
        secret_of(question),
        Decision.APPROVE,
        clock.now,
        code_of(channel, question),
    )

    approval = channel.answer(question, approve=False)  # the page answered first
    assert isinstance(approval, Approval) and approval.approval_id == question.approval_id


def test_a_round_trip_answered_in_the_client_closes_its_question(
    channel: EmbeddedApprovals, clock: FakeClock
) -> None:
    question = channel.ask(a_request(), context(), "form")
    state = state_for(a_request(), question.issued_at_ms, question.approval_id)
    round_trip = approval_of_state(state, clock.now)

    assert channel.close_round_trip(round_trip)
    assert channel.pending() == []
    assert channel.given(a_request()) is None  # never marked approved: the state's id is its
    assert channel.book.get(question.approval_id) is None


def test_a_round_trip_whose_question_was_declined_on_the_page_is_not_open(
    channel: EmbeddedApprovals, clock: FakeClock
) -> None:
    question = channel.ask(a_request(), context(), "form")
    state = state_for(a_request(), question.issued_at_ms, question.approval_id)
    desk = LinkDesk(channel, csrf_key=b"k" * 32)
    secret, code = secret_of(question), code_of(channel, question)
    desk.answer(question.approval_id, secret, Decision.DECLINE, clock.now, code)

    assert not channel.close_round_trip(approval_of_state(state, clock.now))  # first answer wins
    again = desk.answer(question.approval_id, secret, Decision.APPROVE, clock.now, code)
    assert again is PageError.NOT_FOUND  # a declined question cannot be answered again


def test_the_link_alone_cannot_answer_without_the_terminal_code(
    tmp_path: Path, clock: FakeClock
) -> None:
    with announcing(tmp_path, clock, BASE_URL) as (channel, shown):
        question = channel.ask(a_request(), context(), "url")
        channel.ask(a_request(), context(), "url")  # the same question: announced once
        code = code_of(channel, question)
        (line,) = shown
        assert f"{code[:4]}-{code[4:]}" in line and question.approval_id in line
        assert f"engram-memory approvals approve {question.approval_id}" in line
        assert f"approval page {question.link}, type the code" in line  # the operator's own
        assert RETRY_WINDOW in line
        assert len(code) == 8 and not set(code) & set("01OIL")

        desk = LinkDesk(channel, csrf_key=b"k" * 32)
        secret = secret_of(question)
        view = desk.view(question.approval_id, secret)
        assert not isinstance(view, PageError) and view.asks_code  # the link shows the question
        for typed in ("", "AAAA-AAAA", "ZZZZZZZZ", code[:7], "x" * 8):
            refused = desk.answer(question.approval_id, secret, Decision.APPROVE, clock.now, typed)
            assert refused is PageError.WRONG_CODE, typed
        # five wrong codes: the page takes no answer, not even with the right code
        locked = desk.answer(question.approval_id, secret, Decision.APPROVE, clock.now, code)
        assert locked is PageError.NO_MORE_ATTEMPTS
        assert channel.given(a_request()) is None
        # the terminal still answers
        assert channel.book.answer(question.approval_id, True, now_ms=clock.now, by="terminal")


def test_the_code_is_typed_in_any_case_with_or_without_its_dash(
    channel: EmbeddedApprovals, clock: FakeClock
) -> None:
    question = channel.ask(a_request(), context(), "url")
    code = code_of(channel, question)
    desk = LinkDesk(channel, csrf_key=b"k" * 32)
    typed = f" {code[:4].lower()}-{code[4:]} "
    answered = desk.answer(
        question.approval_id, secret_of(question), Decision.APPROVE, clock.now, typed
    )
    assert not isinstance(answered, PageError)
    assert isinstance(channel.given(a_request()), Approval)


def test_without_a_page_no_link_is_handed_out_and_the_terminal_is_named(
    tmp_path: Path, clock: FakeClock
) -> None:
    with announcing(tmp_path, clock, None) as (channel, shown):
        assert not channel.has_page
        form = channel.ask(a_request(), context(), "form")
        terminal = channel.ask(a_request(), context(), "terminal")
        assert form.link is None and "http" not in form.message
        command = f"engram-memory approvals approve {form.approval_id}"
        assert command in form.message and command in terminal.message
        assert "cannot ask a human" in terminal.message
        # what a -32603 hands the client: the bare program name, never the path it runs from
        assert form.approve_with == terminal.approve_with == command
        assert shown == []  # no page to type a code in: nothing to announce


def test_a_link_without_its_secret_says_it_is_incomplete_and_nothing_else(
    channel: EmbeddedApprovals,
) -> None:
    question = channel.ask(a_request(), context(), "url")
    desk = LinkDesk(channel, csrf_key=b"k" * 32)
    open_one = desk.view(question.approval_id, "")
    assert open_one is PageError.INCOMPLETE_LINK
    assert desk.view("apr_" + "0" * 32, "") is open_one  # alike for an unknown id
    status, page = render_error(PageError.INCOMPLETE_LINK)
    assert status == 404 and "incomplete" in page and "?secret=" in page
    assert question.approval_id not in page


def test_agent_and_approver_are_told_one_retry_window(tmp_path: Path, clock: FakeClock) -> None:
    assert (
        f"within {EXECUTION_WINDOW_MS // 1000} s of the approval and"
        f" {APPROVAL_TTL_MS // 60_000} minutes of the request"
    ) == RETRY_WINDOW
    with announcing(tmp_path, clock, None) as (channel, _shown):
        terminal = channel.ask(a_request(), context(), "terminal")
    with announcing(tmp_path, clock, BASE_URL) as (paged, _shown):
        url = paged.ask(a_request("mem_def"), context(), "url")
    assert RETRY_WINDOW in terminal.message and RETRY_WINDOW in url.message
    assert "within 5 minutes." not in terminal.message


# -- an approval carried out at once (issue 38, item 5) --------------------------------------------

FORGET_ARGUMENTS = {
    "record_id": "mem_abc",
    "idempotency_key": "forget-1",
    "reason_ref": "reason:obsolete",
}


class RecordingEngine(NoMemoryKernel):
    """An engine that records the calls an approval carries out and answers each with
    ``answers`` in turn (an envelope, or an exception to raise)."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, Any, Any, Approval | None]] = []

    def handle(self, tool: str, arguments: Any, ctx: Any, approval: Approval | None) -> Any:
        self.calls.append((tool, arguments, ctx, approval))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def forgotten(replayed: bool = False) -> dict[str, Any]:
    return {"ok": True, "output": {"value": {"replayed": replayed}}, "audit_id": "aud_x"}


@contextlib.contextmanager
def carrying(
    tmp_path: Path, clock: FakeClock, engine: RecordingEngine
) -> Iterator[EmbeddedApprovals]:
    channel = EmbeddedApprovals(
        lambda: ApprovalBook(tmp_path),
        lambda: cast(Any, engine),
        base_url=BASE_URL,
        clock=clock,
    )
    try:
        yield channel
    finally:
        channel.close()


def test_an_approval_at_the_terminal_runs_the_agents_call_once_as_the_agent(
    tmp_path: Path, clock: FakeClock
) -> None:
    engine = RecordingEngine(forgotten())
    asking = context(agent_id="agent-7", credential_id="tok-1", credential_issued_at_ms=T0 - 5)
    with carrying(tmp_path, clock, engine) as channel:
        question = channel.ask(a_request(), asking, "terminal", FORGET_ARGUMENTS)
        clock.advance(2_000)
        first, row = channel.answer_by_id(question.approval_id, True, by="terminal", approver="o")
        again, _ = channel.answer_by_id(question.approval_id, True, by="console", approver="p")

    assert first and not again  # the first answer wins: one commit
    ((tool, arguments, ctx, approval),) = engine.calls
    assert (tool, arguments) == ("forget", FORGET_ARGUMENTS)
    assert (ctx.principal, ctx.scope, ctx.purpose_ref, ctx.agent_id) == (
        asking.principal,
        asking.scope,
        asking.purpose_ref,
        "agent-7",
    )
    assert (ctx.credential_id, ctx.credential_issued_at_ms) == ("tok-1", T0 - 5)  # revocable
    assert ctx.grants == asking.grants and ctx.audit_id != asking.audit_id
    assert approval is not None and approval.approval_id == question.approval_id
    check_approval(approval, a_request(), clock.now)  # what the engine's gate checks
    assert row is not None and row.committed_at_ms == clock.now and row.commit_failure is None


def test_the_first_report_of_a_carried_out_commit_says_no_replay_then_replays(
    tmp_path: Path, clock: FakeClock
) -> None:
    with carrying(tmp_path, clock, RecordingEngine(forgotten())) as channel:
        asking = context()
        question = channel.ask(a_request(), asking, "terminal", FORGET_ARGUMENTS)
        channel.answer_by_id(question.approval_id, True, by="terminal")
        clock.advance(EXECUTION_WINDOW_MS + 1_000)
        replay = forgotten(replayed=True)
        other_key = {**FORGET_ARGUMENTS, "idempotency_key": "forget-2"}
        assert channel.reported("forget", asking, other_key, replay) == replay
        first = channel.reported("forget", asking, FORGET_ARGUMENTS, replay)
        assert first["output"]["value"]["replayed"] is False
        assert channel.reported("forget", asking, FORGET_ARGUMENTS, replay) == replay


def test_a_commit_that_fails_keeps_the_approval_for_the_retry_in_its_window(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The store could not be reached when the person approved: nothing was written, the
    approver is told, and the agent's retry takes the approval as before (30 s), then asks
    anew."""
    engine = RecordingEngine(RuntimeError("the store is gone"))
    with carrying(tmp_path, clock, engine) as channel:
        question = channel.ask(a_request(), context(), "terminal", FORGET_ARGUMENTS)
        _, row = channel.answer_by_id(question.approval_id, True, by="terminal")
        assert row is not None and row.commit_failure == "STORE_UNAVAILABLE"
        assert row.committed_at_ms is None
        line = outcome_line(row)
        assert "could not be carried out now (the store could not be reached)" in line
        assert RETRY_WINDOW in line
        assert isinstance(channel.given(a_request()), Approval)  # the retry commits with it
        clock.advance(EXECUTION_WINDOW_MS + 1)
        assert channel.given(a_request()) is None  # too late: the call asks anew


def test_a_declined_or_confirmed_capture_is_not_carried_out(
    tmp_path: Path, clock: FakeClock
) -> None:
    engine = RecordingEngine()
    capture = ConfirmationRequest(
        tool="capture",
        target=None,
        operation_digest="sha256:" + "2" * 64,
        principal=context().principal,
        scope=context().scope,
        reason_ref=None,
        summary="",
    )
    secret_text = "Decision: the payroll export password is hunter2-banana."
    with carrying(tmp_path, clock, engine) as channel:
        declined = channel.ask(a_request(), context(), "terminal", FORGET_ARGUMENTS)
        channel.answer_by_id(declined.approval_id, False, by="terminal")
        captured = channel.ask(capture, context(), "terminal", {"content": secret_text})
        _, row = channel.answer_by_id(captured.approval_id, True, by="terminal")
        book = b"".join(path.read_bytes() for path in tmp_path.glob("approvals.sqlite3*"))
    assert engine.calls == []
    assert row is not None and row.call is None and RETRY_WINDOW in outcome_line(row)
    assert b"hunter2" not in book  # a capture's content never rests in the book


def test_a_commit_the_agents_own_retry_made_first_is_not_reported_as_new_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The agent's retry took the approval and committed while the person's answer was being
    carried out: the engine replays that commit to the host, and the agent, who has seen it,
    is told replays from then on."""
    with carrying(tmp_path, clock, RecordingEngine(forgotten(replayed=True))) as channel:
        asking = context()
        question = channel.ask(a_request(), asking, "terminal", FORGET_ARGUMENTS)
        _, row = channel.answer_by_id(question.approval_id, True, by="terminal")
        assert row is not None and row.committed_at_ms is not None
        replay = forgotten(replayed=True)
        assert channel.reported("forget", asking, FORGET_ARGUMENTS, replay) == replay

"""The embedded approval book (SQLite in the data directory), and the mode each client gets."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import mcp.types as types
import pytest

from engram_memory.adapters.local.approval_book import FILE_NAME, ApprovalBook
from engram_memory.embedded.cli import main
from engram_memory.engine.context import Scope
from engram_memory.engine.gate import (
    APPROVAL_TTL_MS,
    EXECUTION_WINDOW_MS,
    ConfirmationRequest,
    check_approval,
)
from engram_memory.mcp_surface.approval_channel import confirmation_mode

from engram_testing import forget_request

T0 = 1_790_000_000_000


def a_request(target: str = "mem_abc", digest: str = "sha256:" + "1" * 64) -> ConfirmationRequest:
    return forget_request(target, scope=Scope("local", "w1"), digest=digest)


@pytest.fixture
def book(tmp_path: Path) -> Iterator[ApprovalBook]:
    opened = ApprovalBook(tmp_path)
    yield opened
    opened.close()


def test_the_book_is_owner_only(book: ApprovalBook, tmp_path: Path) -> None:
    assert stat.S_IMODE((tmp_path / FILE_NAME).stat().st_mode) == 0o600


def test_asking_twice_for_one_operation_reuses_the_open_question(book: ApprovalBook) -> None:
    first = book.open(a_request(), agent_id="a", session_id="s", now_ms=T0)
    again = book.open(a_request(), agent_id="a", session_id="s", now_ms=T0 + 10_000)
    other = book.open(a_request(target="mem_other"), agent_id="a", session_id="s", now_ms=T0)
    assert again == first and first.secret == again.secret
    assert other.approval_id != first.approval_id and other.secret != first.secret
    assert len(first.secret) >= 40  # 32 random bytes, URL-safe
    assert [row.approval_id for row in book.pending(T0 + 10_000)] == [
        first.approval_id,
        other.approval_id,
    ]


def test_the_first_answer_wins_and_binds_the_engine_approval(book: ApprovalBook) -> None:
    row = book.open(a_request(), agent_id=None, session_id=None, now_ms=T0)
    approved = book.answer(row.approval_id, True, now_ms=T0 + 5_000, by="page")
    assert approved is not None and approved.state == "approved"
    assert book.answer(row.approval_id, False, now_ms=T0 + 6_000, by="terminal") is None
    found = book.for_operation(a_request(), T0 + 7_000)
    assert found is not None and found.state == "approved" and found.answered_by == "page"
    approval = found.approval()
    check_approval(approval, a_request(), T0 + 7_000)  # the engine accepts it as is
    assert approval.issued_at_ms == T0 and approval.approved_at_ms == T0 + 5_000


def test_an_approval_is_usable_for_30_s_after_it_is_given_and_300_s_after_the_asking(
    book: ApprovalBook,
) -> None:
    row = book.open(a_request(), agent_id=None, session_id=None, now_ms=T0)
    late = T0 + APPROVAL_TTL_MS - 10_000
    answered = book.answer(row.approval_id, True, now_ms=late, by="page")
    assert answered is not None
    assert answered.usable_at(late + 9_000)
    assert answered.usable_at(T0 + APPROVAL_TTL_MS)  # the gate's own bound: 300 s inclusive
    assert not answered.usable_at(T0 + APPROVAL_TTL_MS + 1)  # past 300 s from the asking
    early = book.open(a_request(target="mem_2"), agent_id=None, session_id=None, now_ms=T0)
    given = book.answer(early.approval_id, True, now_ms=T0 + 1_000, by="page")
    assert given is not None and given.usable_at(T0 + 1_000 + EXECUTION_WINDOW_MS)
    assert not given.usable_at(T0 + 1_001 + EXECUTION_WINDOW_MS)  # 30 s from the approval


def test_an_expired_question_cannot_be_answered_and_is_no_longer_listed(
    book: ApprovalBook,
) -> None:
    row = book.open(a_request(), agent_id=None, session_id=None, now_ms=T0)
    expired = T0 + APPROVAL_TTL_MS + 1
    assert book.answer(row.approval_id, True, now_ms=expired, by="page") is None
    assert book.pending(expired) == []
    assert book.for_operation(a_request(), expired) is None
    fresh = book.open(a_request(), agent_id=None, session_id=None, now_ms=expired)
    assert fresh.approval_id != row.approval_id


def test_a_decline_is_closed_once_reported(book: ApprovalBook) -> None:
    row = book.open(a_request(), agent_id=None, session_id=None, now_ms=T0)
    book.answer(row.approval_id, False, now_ms=T0 + 1_000, by="terminal")
    declined = book.for_operation(a_request(), T0 + 2_000)
    assert declined is not None and declined.state == "declined"
    book.close_declined(row.approval_id)
    assert book.for_operation(a_request(), T0 + 2_000) is None


def test_the_terminal_lists_and_answers_what_waits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    assert main(["init", "--data-dir", str(tmp_path)]) == 0
    now = int(time.time() * 1000)
    opened = ApprovalBook(tmp_path)
    waiting = opened.open(a_request(), agent_id="agent-7", session_id="s-1", now_ms=now)
    declined = opened.open(a_request(target="mem_2"), agent_id=None, session_id=None, now_ms=now)
    opened.close()
    assert main(["approvals", "list", "--data-dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert waiting.approval_id in listed and "permanently forget" in listed
    assert "Agent: agent-7" in listed and "Reason: reason:obsolete" in listed
    assert waiting.secret not in listed  # the link's secret is never printed
    assert f"Code for the approval page: {waiting.code[:4]}-{waiting.code[4:]}" in listed
    assert main(["approvals", "approve", "--data-dir", str(tmp_path), waiting.approval_id]) == 0
    assert main(["approvals", "decline", "--data-dir", str(tmp_path), declined.approval_id]) == 0
    capsys.readouterr()
    assert main(["approvals", "approve", "--data-dir", str(tmp_path), waiting.approval_id]) == 1
    assert "was already answered: approved at 20" in capsys.readouterr().err
    assert main(["approvals", "list", "--data-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().startswith("no approval is waiting")
    reopened = ApprovalBook(tmp_path)
    row = reopened.get(waiting.approval_id)
    reopened.close()
    assert row is not None and (row.state, row.answered_by) == ("approved", "terminal")


FORM = types.FormElicitationCapability()
URL = types.UrlElicitationCapability()


@pytest.mark.parametrize(
    ("elicitation", "mode"),
    [
        (None, None),
        (types.ElicitationCapability(), "form"),  # the bare {} of 2025-06-18: form
        (types.ElicitationCapability(form=FORM), "form"),
        (types.ElicitationCapability(url=URL), "url"),
        (types.ElicitationCapability(form=FORM, url=URL), "form"),
    ],
)
def test_each_client_gets_the_mode_it_declared(
    elicitation: types.ElicitationCapability | None, mode: str | None
) -> None:
    assert confirmation_mode(types.ClientCapabilities(elicitation=elicitation)) == mode
    assert confirmation_mode(None) is None

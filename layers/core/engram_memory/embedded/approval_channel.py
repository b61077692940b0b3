"""Human approvals on the embedded host: the ``ApprovalChannel`` over the data directory's
``ApprovalBook``, and the approval page's link desk at ``/approvals/{id}`` (CONTRACT.md §8).

- Every question is a row in the ``ApprovalBook``, bound to the operation. The link handed to
  the client carries the row's single-use secret (``LinkDesk``: the page's credential); the
  page, the form answer and ``engram-memory approvals approve|decline`` all answer the same row,
  the first answer wins.
- A call for an operation whose row is answered takes that answer: the client's retry with the
  same key commits with an approval given after it stopped waiting (within 300 s of the asking
  and 30 s of the approval), or gets ``gate_failed`` after a decline, and never asks twice.
  The surface (``mcp_surface.approval_channel``) asks ``given`` first, then asks the human.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from engram_memory import approval_page as shared  # the page both hosts serve
from engram_memory.adapters.local.approvals import ApprovalBook, OpenApproval
from engram_memory.binding.host_config import host_matches
from engram_memory.engine.context import TrustedContext, new_audit_id
from engram_memory.engine.gate import Approval, ConfirmationRequest
from engram_memory.engine.ports import Clock
from engram_memory.mcp_surface.approval_channel import Declined, Mode, Question

if TYPE_CHECKING:
    from engram_memory.engine.kernel import Kernel

APPROVALS_PATH: Final = "/approvals"
SECRET_PARAM: Final = "secret"  # noqa: S105 - the query parameter's name


class EmbeddedApprovals:
    """The embedded server's ``ApprovalChannel``: the book, the links, what the human reads."""

    def __init__(
        self,
        book: Callable[[], ApprovalBook],
        kernel: Callable[[], Kernel],
        *,
        base_url: str,
        clock: Clock,
    ) -> None:
        self._open_book = book
        self._book: ApprovalBook | None = None
        self._book_lock = threading.Lock()
        self._kernel = kernel
        self._base_url = base_url.rstrip("/")
        self.clock = clock

    @property
    def book(self) -> ApprovalBook:
        """The data directory's approval book, opened on first use (not at start-up)."""
        with self._book_lock:
            if self._book is None:
                self._book = self._open_book()
            return self._book

    def close(self) -> None:
        with self._book_lock:
            if self._book is not None:
                self._book.close()

    def link(self, row: OpenApproval) -> str:
        return f"{self._base_url}{APPROVALS_PATH}/{row.approval_id}?{SECRET_PARAM}={row.secret}"

    def view_of(self, row: OpenApproval) -> shared.ApprovalView:
        """The row as the approver sees it, with the memory it acts on (when it can be shown)."""
        # the engine's modules load with the engine, on first use, not when a server starts
        from engram_memory.engine.usecases.approval_subject import approval_subject

        ctx = TrustedContext(
            tenant_id=row.tenant_id,
            workspace_id=row.workspace_id,
            principal=row.principal,
            purpose_ref="",
            audit_id=new_audit_id(),
            agent_id=row.agent_id,
            session_id=row.session_id,
        )
        subject = approval_subject(self._kernel(), ctx, row.tool, row.target, self.clock.now_ms())
        if subject is None:
            return shared.ApprovalView.of(row, None)
        memory = shared.memory_from_record(
            subject.record, digest=subject.digest, captured_at_ms=subject.captured_at_ms
        )
        return shared.ApprovalView.of(row, memory)

    def message(self, row: OpenApproval, *, mode: Mode) -> str:
        """The elicitation's text: the page's summary, and where else it can be answered."""
        summary = shared.plain_summary(self.view_of(row), self.clock.now_ms())
        if mode == "url":
            return (
                f"{summary}\n\nOpen the approval page to answer (or, on this machine, run"
                f" `engram-memory approvals approve {row.approval_id}`); then retry the same call."
            )
        return (
            f"{summary}\n\nYou can also answer on the approval page ({self.link(row)}) or with"
            f" `engram-memory approvals approve {row.approval_id}`."
        )

    # -- the port (mcp_surface.approval_channel.ApprovalChannel) -------------------------------

    def given(self, request: ConfirmationRequest) -> Approval | Declined | None:
        """The human's answer to this operation, if given already (on the page, at the terminal,
        or in a form whose request the client stopped waiting for): an approval still usable, or
        ``Declined`` (reported once: the next call asks anew, under a new id), or None."""
        now = self.clock.now_ms()
        row = self.book.for_operation(request, now)
        if row is None:
            return None
        if row.state == "declined":
            self.book.close_declined(row.approval_id)
            return Declined(row)
        return row.approval() if row.usable_at(now) else None

    def ask(self, request: ConfirmationRequest, ctx: TrustedContext, mode: Mode) -> Question:
        row = self.book.open(
            request,
            agent_id=ctx.agent_id,
            session_id=ctx.session_id,
            now_ms=self.clock.now_ms(),
        )
        return Question(
            approval_id=row.approval_id,
            issued_at_ms=row.issued_at_ms,
            expires_at_ms=row.expires_at_ms,
            message=self.message(row, mode=mode),
            link=self.link(row),
        )

    def answer(self, question: Question, approve: bool) -> Approval | Declined | None:
        """The client's form answered ``question``: the approval, ``Declined``, or None when
        the question is gone. The first answer wins (the page or the terminal may have answered
        while the form was open)."""
        approval_id = question.approval_id
        recorded = self.book.answer(approval_id, approve, now_ms=self.clock.now_ms(), by="client")
        final = recorded or self.book.get(approval_id)
        if final is None:
            return None
        if final.state != "approved":
            self.book.close_declined(approval_id)
            return Declined(final)
        return final.approval()

    def close_round_trip(self, approval: Approval) -> bool:
        """The client answered the form of a round trip (its state carries the question's id):
        the row is closed (it leaves the terminal's list and its link stops working); False when
        the human declined it first on the page or at the terminal. A row already gone was
        closed by an earlier answer, whose id the engine has consumed or spent."""
        row = self.book.get(approval.approval_id)
        if row is None:
            return True
        if row.state == "declined":
            self.book.close_declined(row.approval_id)
            return False
        self.book.forget_question(row.approval_id)
        return True

    def pending(self) -> list[OpenApproval]:
        return self.book.pending(self.clock.now_ms())


class LinkDesk(shared.QuestionDesk[OpenApproval]):
    """The approval page's desk on the embedded host: the credential is the secret in the link
    (``EmbeddedApprovals.link``), which alone lets a visitor see or answer."""

    def __init__(self, approvals: EmbeddedApprovals, *, csrf_key: bytes) -> None:
        super().__init__(csrf_key)
        self._approvals = approvals
        self.clock = approvals.clock

    def question(self, approval_id: str, credential: str) -> OpenApproval | shared.PageError:
        book = self._approvals.book
        row = book.get(approval_id) if approval_id.startswith("apr_") else None
        if row is None or not hmac.compare_digest(row.secret.encode(), credential.encode()):
            return shared.PageError.NOT_FOUND  # a wrong secret learns nothing, not even existence
        if row.state != "pending":
            return shared.PageError.ANSWERED
        return row

    def shown(self, question: OpenApproval) -> shared.ApprovalView:
        return self._approvals.view_of(question)

    def answer(
        self, approval_id: str, credential: str, decision: shared.Decision, now_ms: int
    ) -> shared.DeskAnswer | shared.PageError:
        row = self.question(approval_id, credential)
        if isinstance(row, shared.PageError):
            return row
        answered = self._approvals.book.answer(
            approval_id, decision is shared.Decision.APPROVE, now_ms=now_ms, by="page"
        )
        if answered is None:
            return (
                shared.PageError.ANSWERED
                if row.expires_at_ms > now_ms
                else shared.PageError.EXPIRED
            )
        return shared.DeskAnswer(self._approvals.view_of(answered), decision)


def approval_routes(desk: LinkDesk, allowed_hosts: list[str]) -> list[Route]:
    """``GET``/``POST /approvals/{id}?secret=…`` on the embedded server's loopback address."""

    async def page(request: Request) -> Response:
        if not host_matches(request.headers.get("host", ""), allowed_hosts):
            return _html(shared.error_page(shared.PageError.NOT_FOUND, 421))
        form = shared.read_form(await request.body()) if request.method == "POST" else {}
        if form is None:
            return _html(shared.error_page(shared.PageError.BAD_REQUEST, 413))
        page_request = shared.PageRequest.of(
            request.method,
            request.path_params["approval_id"],
            request.query_params.get(SECRET_PARAM, ""),
            str(request.url.path) + "?" + str(request.url.query),
            headers=request.headers,
            form=form,
        )
        own_origin = f"{request.url.scheme}://{request.headers.get('host', '')}"
        response = await anyio.to_thread.run_sync(
            lambda: shared.handle_page(
                desk, page_request, now_ms=desk.clock.now_ms(), allowed_origin=own_origin
            )
        )
        return _html(response)

    return [Route(APPROVALS_PATH + "/{approval_id}", endpoint=page, methods=["GET", "POST"])]


def _html(page: shared.PageResponse) -> Response:
    return HTMLResponse(page.html, page.status, headers=dict(page.headers))


__all__ = ["APPROVALS_PATH", "EmbeddedApprovals", "LinkDesk", "approval_routes"]

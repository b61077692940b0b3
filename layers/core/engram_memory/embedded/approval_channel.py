"""Human approvals on the embedded host: the approval page at ``/approvals/{id}``, the mode each
client gets, and approvals that outlive the request that asked for them (CONTRACT.md §8).

- Mode: form when the client declared form elicitation, URL when it declared URL only,
  ``-32603`` when it declared neither (``confirmation_mode``).
- Every question is a row in the data directory's ``ApprovalBook``, bound to the operation. The
  link handed to the client carries the row's single-use secret; the page, the form answer and
  ``engram-memory approvals approve|decline`` all answer the same row, the first answer wins.
- A call for an operation whose row is answered takes that answer: the client's retry with the
  same key commits with an approval given after it stopped waiting (within 300 s of the asking
  and 30 s of the approval), or gets ``gate_failed`` after a decline, and never asks twice.
  The server (``EngramMcp._confirm_embedded``) asks ``given`` first, then asks the human.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import parse_qsl

import anyio.to_thread
import mcp.types as types
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from engram_memory.adapters.local.approvals import ApprovalBook, Bound, OpenApproval
from engram_memory.approval_page import (
    PAGE_HEADERS,
    ApprovalView,
    Decision,
    DeskAnswer,
    PageError,
    PageRequest,
    csrf_token,
    handle_page,
    memory_from_record,
    plain_summary,
    render_error,
)
from engram_memory.binding.host_config import host_matches
from engram_memory.engine.context import TrustedContext, new_audit_id
from engram_memory.engine.gate import Approval, ConfirmationRequest
from engram_memory.engine.ports import Clock
from engram_memory.mcp_surface.confirmations import APPROVAL_SCHEMA, approved

if TYPE_CHECKING:
    from engram_memory.engine.kernel import Kernel

APPROVALS_PATH: Final = "/approvals"
SECRET_PARAM: Final = "secret"  # noqa: S105 - the query parameter's name
MAX_FORM_BYTES: Final = 4096
Mode = Literal["url", "form"]


def confirmation_mode(capabilities: types.ClientCapabilities | None) -> Mode | None:
    """How to ask this client's human: ``form`` when it declared form elicitation (or the bare
    ``{}``, which means form), ``url`` when it declared URL only, None when it declared neither.

    Form first on the embedded host: the human answers inside the client, and the form carries
    the page's whole summary; the page's link (and the terminal) answer the same question when
    the client stops waiting."""
    elicitation = capabilities.elicitation if capabilities is not None else None
    if elicitation is None:
        return None
    if elicitation.form is not None or elicitation.url is None:
        return "form"
    return "url"


class EmbeddedApprovals:
    """The approval desk of one embedded server: the book, the page, the links."""

    def __init__(
        self,
        book: Callable[[], ApprovalBook],
        kernel: Callable[[], Kernel],
        *,
        base_url: str,
        csrf_key: bytes,
        clock: Clock,
    ) -> None:
        self._open_book = book
        self._book: ApprovalBook | None = None
        self._book_lock = threading.Lock()
        self._kernel = kernel
        self._base_url = base_url.rstrip("/")
        self._csrf_key = csrf_key
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

    def view_of(self, row: OpenApproval) -> ApprovalView:
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
        memory = (
            memory_from_record(
                subject.record, digest=subject.digest, captured_at_ms=subject.captured_at_ms
            )
            if subject is not None
            else None
        )
        return ApprovalView(
            approval_id=row.approval_id,
            tool=row.tool,
            target=row.target,
            principal=row.principal,
            agent_id=row.agent_id,
            session_id=row.session_id,
            tenant_id=row.tenant_id,
            workspace_id=row.workspace_id,
            reason_ref=row.reason_ref,
            expires_at_ms=row.expires_at_ms,
            memory=memory,
        )

    def ask(self, request: ConfirmationRequest, ctx: TrustedContext) -> OpenApproval:
        return self.book.open(
            request,
            agent_id=ctx.agent_id,
            session_id=ctx.session_id,
            now_ms=self.clock.now_ms(),
        )

    def message(self, row: OpenApproval, *, mode: Mode) -> str:
        """The elicitation's text: the page's summary, and where else it can be answered."""
        summary = plain_summary(self.view_of(row), self.clock.now_ms())
        if mode == "url":
            return (
                f"{summary}\n\nOpen the approval page to answer (or, on this machine, run"
                f" `engram-memory approvals approve {row.approval_id}`); then retry the same call."
            )
        return (
            f"{summary}\n\nYou can also answer on the approval page ({self.link(row)}) or with"
            f" `engram-memory approvals approve {row.approval_id}`."
        )

    def given(self, request: ConfirmationRequest) -> Approval | Literal["declined"] | None:
        """The human's answer to this operation, if given already (on the page, at the terminal,
        or in a form whose request the client stopped waiting for): an approval still usable, or
        ``"declined"`` (reported once: the next call asks anew), or None."""
        now = self.clock.now_ms()
        row = self.book.for_operation(request, now)
        if row is None:
            return None
        if row.state == "declined":
            self.book.close_declined(row.approval_id)
            return "declined"
        return row.approval() if row.usable_at(now) else None

    def record(self, row: OpenApproval, approve: bool) -> Approval | None:
        """The client's form answered ``row``: the approval, or None after a decline. The first
        answer wins (the page or the terminal may have answered while the form was open)."""
        recorded = self.book.answer(
            row.approval_id, approve, now_ms=self.clock.now_ms(), by="client"
        )
        final = recorded or self.book.get(row.approval_id)
        if final is None or final.state != "approved":
            self.book.close_declined(row.approval_id)
            return None
        return final.approval()

    def settle(self, request: Bound) -> None:
        """The client answered the form of a round trip: its row is closed (it leaves the
        terminal's list and its link stops working). Never marked approved: the round trip's
        approval has its own single-use id, and a second id would approve a second call."""
        row = self.book.for_operation(request, self.clock.now_ms())
        if row is not None and row.state == "pending":
            self.book.forget_question(row.approval_id)

    # -- the page's desk (approval_page.ApprovalDesk) ------------------------------------------

    def _row(self, approval_id: str, credential: str) -> OpenApproval | PageError:
        row = self.book.get(approval_id) if approval_id.startswith("apr_") else None
        if row is None or not hmac.compare_digest(row.secret.encode(), credential.encode()):
            return PageError.NOT_FOUND  # a wrong secret learns nothing, not even existence
        if row.state != "pending":
            return PageError.ANSWERED
        return row

    def view(self, approval_id: str, credential: str) -> ApprovalView | PageError:
        row = self._row(approval_id, credential)
        return row if isinstance(row, PageError) else self.view_of(row)

    def csrf_token(self, approval_id: str, credential: str) -> str:
        return csrf_token(self._csrf_key, approval_id, credential)

    def answer(
        self, approval_id: str, credential: str, decision: Decision, now_ms: int
    ) -> DeskAnswer | PageError:
        row = self._row(approval_id, credential)
        if isinstance(row, PageError):
            return row
        answered = self.book.answer(
            approval_id, decision is Decision.APPROVE, now_ms=now_ms, by="page"
        )
        if answered is None:
            return PageError.ANSWERED if row.expires_at_ms > now_ms else PageError.EXPIRED
        return DeskAnswer(self.view_of(answered), decision)


async def elicit_form(session: Any, request_id: Any, message: str) -> types.ElicitResult:
    """2025-11-25: the form on the request's own stream (the answer comes back on it)."""
    result: types.ElicitResult = await session.elicit_form(
        message, APPROVAL_SCHEMA, related_request_id=request_id
    )
    return result


def approval_routes(approvals: EmbeddedApprovals, allowed_hosts: list[str]) -> list[Route]:
    """``GET``/``POST /approvals/{id}?secret=…`` on the embedded server's loopback address."""

    async def page(request: Request) -> Response:
        if not host_matches(request.headers.get("host", ""), allowed_hosts):
            _, html = render_error(PageError.NOT_FOUND)
            return HTMLResponse(html, 421, headers=dict(PAGE_HEADERS))
        form: dict[str, str] = {}
        if request.method == "POST":
            body = await request.body()
            if len(body) > MAX_FORM_BYTES:
                _, html = render_error(PageError.BAD_REQUEST)
                return HTMLResponse(html, 413, headers=dict(PAGE_HEADERS))
            form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        secret = request.query_params.get(SECRET_PARAM, "")
        page_request = PageRequest(
            method=request.method,
            approval_id=request.path_params["approval_id"],
            credential=secret,
            action_url=str(request.url.path) + "?" + str(request.url.query),
            form=form,
            origin=request.headers.get("origin"),
            fetch_site=request.headers.get("sec-fetch-site"),
        )
        own_origin = f"{request.url.scheme}://{request.headers.get('host', '')}"
        response = await anyio.to_thread.run_sync(
            lambda: handle_page(
                approvals,
                page_request,
                now_ms=approvals.clock.now_ms(),
                allowed_origin=own_origin,
            )
        )
        return HTMLResponse(response.html, response.status, headers=dict(response.headers))

    return [Route(APPROVALS_PATH + "/{approval_id}", endpoint=page, methods=["GET", "POST"])]


__all__ = [
    "APPROVALS_PATH",
    "EmbeddedApprovals",
    "approval_routes",
    "approved",
    "confirmation_mode",
    "elicit_form",
]

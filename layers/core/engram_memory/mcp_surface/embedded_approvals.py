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
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import parse_qsl

import anyio.from_thread
import anyio.to_thread
import mcp.types as types
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ..adapters.local.approvals import ApprovalBook, OpenApproval
from ..approval_page import (
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
from ..engine.context import TrustedContext, new_audit_id
from ..engine.ports import (
    Approval,
    Clock,
    ConfirmationChannelUnavailable,
    ConfirmationDeclined,
    ConfirmationRequest,
    ConfirmationWorkflow,
)
from ..engine.usecases.approval_subject import approval_subject
from ..host.config import host_matches
from .confirmations import APPROVAL_SCHEMA, UrlConfirmationRequired, approved

if TYPE_CHECKING:
    from ..engine.kernel import Kernel

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
        book: ApprovalBook,
        kernel: Callable[[], Kernel],
        *,
        base_url: str,
        csrf_key: bytes,
        clock: Clock,
    ) -> None:
        self.book = book
        self._kernel = kernel
        self._base_url = base_url.rstrip("/")
        self._csrf_key = csrf_key
        self.clock = clock

    def link(self, row: OpenApproval) -> str:
        return f"{self._base_url}{APPROVALS_PATH}/{row.approval_id}?{SECRET_PARAM}={row.secret}"

    def view_of(self, row: OpenApproval) -> ApprovalView:
        """The row as the approver sees it, with the memory it acts on (when it can be shown)."""
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

    def answered(self, request: ConfirmationRequest) -> Approval | None:
        """The human's answer to this operation, if given: an approval still usable, or
        ``ConfirmationDeclined`` after a decline (reported once; the next call asks anew)."""
        now = self.clock.now_ms()
        row = self.book.for_operation(request, now)
        if row is None:
            return None
        if row.state == "declined":
            self.book.close_declined(row.approval_id)
            raise ConfirmationDeclined("declined on the approval page or the terminal")
        return row.approval() if row.usable_at(now) else None

    def settle(self, request: ConfirmationRequest) -> None:
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


class EmbeddedConfirmations:
    """The confirmation workflow of one embedded call (either revision).

    An answer already given for the operation wins; then URL mode raises the link for the
    client to open (``UrlConfirmationRequired``), and form mode asks through ``form`` (the
    2026-07-28 round trip) or, when ``form`` is None, on the 2025-11-25 request's stream.
    """

    def __init__(
        self,
        approvals: EmbeddedApprovals,
        ctx: TrustedContext,
        *,
        capabilities: types.ClientCapabilities | None,
        form: ConfirmationWorkflow | None = None,
        session: Any = None,
        request_id: Any = None,
    ) -> None:
        self._approvals = approvals
        self._ctx = ctx
        self._capabilities = capabilities
        self._form = form
        self._session = session
        self._request_id = request_id

    def opens_urls(self) -> bool:
        return confirmation_mode(self._capabilities) == "url"

    def request_approval(self, request: ConfirmationRequest) -> Approval:
        mode = confirmation_mode(self._capabilities)
        if mode is None:
            raise ConfirmationChannelUnavailable("client declared no elicitation capability")
        approval = self._approvals.answered(request)
        if approval is not None:
            return approval
        if mode == "url":
            row = self._approvals.ask(request, self._ctx)
            raise UrlConfirmationRequired(
                request,
                self._approvals.link(row),
                row.approval_id,
                message=self._approvals.message(row, mode="url"),
            )
        if self._form is not None:  # 2026-07-28: the answer came back with the retry
            # ConfirmationPending (the first call) passes through: its row stays open.
            try:
                approval = self._form.request_approval(request)
            except ConfirmationDeclined:
                self._approvals.settle(request)
                raise
            self._approvals.settle(request)
            return approval
        return self._ask_on_stream(request)

    def _ask_on_stream(self, request: ConfirmationRequest) -> Approval:
        if self._session is None or not self._session.can_send_request:
            raise ConfirmationChannelUnavailable("no way to ask the human on this connection")
        approvals = self._approvals
        row = approvals.ask(request, self._ctx)
        # If the client stops waiting, the row stays open: the page or the terminal can still
        # answer it, and the retry takes that answer.
        result: types.ElicitResult = anyio.from_thread.run(
            functools.partial(self._elicit, approvals.message(row, mode="form"))
        )
        recorded = approvals.book.answer(
            row.approval_id, approved(result), now_ms=approvals.clock.now_ms(), by="client"
        )
        final = recorded or approvals.book.get(row.approval_id)  # another channel was first
        if final is None or final.state != "approved":
            approvals.book.close_declined(row.approval_id)
            raise ConfirmationDeclined("declined or cancelled")
        return final.approval()

    async def _elicit(self, message: str) -> types.ElicitResult:
        result: types.ElicitResult = await self._session.elicit_form(
            message, APPROVAL_SCHEMA, related_request_id=self._request_id
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
    "EmbeddedConfirmations",
    "approval_routes",
    "confirmation_mode",
]

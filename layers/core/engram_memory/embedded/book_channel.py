"""Human approvals on the embedded host: the ``ApprovalChannel`` over the data directory's
``ApprovalBook``, and the approval page's link desk at ``/approvals/{id}`` (CONTRACT.md §8).

- Every question is a row in the ``ApprovalBook``, bound to the operation. The link handed to
  the client carries the row's secret (``LinkDesk``: the page's credential), which shows the
  question; answering on the page also takes the row's one-time code, which only the operator's
  terminal shows (this server's stderr when it asks, ``engram-memory approvals list``), so a
  client that can fetch its own link still cannot approve. The page, the form answer and
  ``engram-memory approvals approve|decline`` all answer the same row, the first answer wins.
- A server without the page (stdio) hands out no link: its messages name the terminal command.
- A withdraw or forget is carried out as soon as a person approves it on the page, at the
  terminal or in the console (``carry_out``: the call the row holds, run as the agent's through
  the engine, whose gate checks the approval as any other, single use), so the agent's retry
  with the same key finds the commit in the ledger whenever it comes; the first report of it
  says ``replayed: false`` (``reported``), as the cloud's run does. If it could not be carried
  out (the memory moved, the token was revoked, the store was unavailable) the approver is told
  in one line (``outcome_line``) and the retry takes the approval as below.
- A call for an operation whose row is answered takes that answer: the client's retry with the
  same key commits with an approval given after it stopped waiting (within 300 s of the asking
  and 30 s of the approval), or gets ``gate_failed`` after a decline, and never asks twice.
  The surface (``mcp_surface.approval_channel``) asks ``given`` first, then asks the human.
"""

from __future__ import annotations

import hmac
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from engram_memory import approval_page as shared  # the page both hosts serve
from engram_memory.adapters.lazy import Lazy
from engram_memory.adapters.local.approval_book import (
    Answerer,
    ApprovalBook,
    HeldCall,
    OpenApproval,
    shown_code,
)
from engram_memory.binding.host_config import host_matches
from engram_memory.contract.errors import ProtocolRefusal
from engram_memory.engine.context import ALWAYS_CONFIRMED, Scope, TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationRequest
from engram_memory.engine.ports import Clock
from engram_memory.mcp_surface.approval_channel import Declined, Mode, Question
from engram_memory.operator_plane.commands import PROGRAM, command_name

if TYPE_CHECKING:
    from engram_memory.engine.service import Engine

log = logging.getLogger(__name__)

APPROVALS_PATH: Final = "/approvals"
SECRET_PARAM: Final = "secret"  # noqa: S105 - the query parameter's name
# Why an approval could not be carried out, as the approver reads it (by the commit's error
# code; any other code is named as it is).
_NOT_CARRIED_OUT: Final = {
    "AUTHORIZATION_REVOKED": "the agent's token was revoked",
    "NOT_FOUND": "the memory is no longer there",
    "ALREADY_TERMINAL": "it had already been done",
    "ILLEGAL_TRANSITION": "the memory has moved on",
    "STORE_UNAVAILABLE": "the store could not be reached",
}


class EmbeddedApprovals:
    """The embedded server's ``ApprovalChannel``: the book, the links, what the human reads."""

    def __init__(
        self,
        book: Callable[[], ApprovalBook],
        kernel: Callable[[], Engine],
        *,
        base_url: str | None,
        clock: Clock,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        """``base_url``: the approval page's origin, None for a server without it (stdio);
        ``notify``: where a new question's code is shown (default: this process's stderr, the
        operator's terminal; only when there is a page to type it in)."""
        self._book = Lazy(book)
        self._kernel = kernel
        self._base_url = base_url.rstrip("/") if base_url is not None else None
        self._notify = notify or _to_stderr
        self._announced: set[str] = set()
        self.clock = clock

    @property
    def has_page(self) -> bool:
        return self._base_url is not None

    @property
    def book(self) -> ApprovalBook:
        """The data directory's approval book, opened on first use (not at start-up)."""
        return self._book.get()

    def close(self) -> None:
        self._book.close()

    def link(self, row: OpenApproval) -> str | None:
        if self._base_url is None:
            return None
        return f"{self._base_url}{APPROVALS_PATH}/{row.approval_id}?{SECRET_PARAM}={row.secret}"

    def _announce(self, row: OpenApproval) -> None:
        """Show a new question's code on the operator's terminal, once (never to the agent)."""
        if not self.has_page or row.approval_id in self._announced:
            return
        self._announced.add(row.approval_id)
        action = shared.action_of(row.tool)[1]
        self._notify(
            f"engram-memory: an agent asks to {action} ({row.approval_id}). To answer on the"
            f" approval page {self.link(row)}, type the code {shown_code(row.code)}; or run"
            f" `{command_name()} approvals approve {row.approval_id}` (or decline): "
            + after_approval(row)
            + "."
        )

    def view_of(self, row: OpenApproval) -> shared.ApprovalView:
        """The row as the approver sees it, with the memory it acts on (when it can be shown)."""
        # the engine's modules load with the engine, on first use, not when a server starts
        from engram_memory.engine.usecases.approval_subject import approval_subject

        ctx = TrustedContext.bound(
            Scope(row.tenant_id, row.workspace_id),
            row.principal,
            "",
            agent_id=row.agent_id,
            session_id=row.session_id,
        )
        subject = approval_subject(self._kernel(), ctx, row.tool, row.target, self.clock.now_ms())
        memory = (
            None
            if subject is None
            else shared.memory_from_record(
                subject.record, digest=subject.digest, captured_at_ms=subject.captured_at_ms
            )
        )
        return shared.ApprovalView.of(
            row, memory, asks_code=self.has_page, committed_by_run=row.call is not None
        )

    def message(self, row: OpenApproval, *, mode: Mode) -> str:
        """What the human reads, for the mode asked in: the page's summary and where else it
        can be answered; for a client that cannot ask (``terminal``), only the terminal's
        command (its -32603 carries the command in ``data``: ``approve_with``)."""
        program = command_name()
        command = f"`{program} approvals approve {row.approval_id}`"
        after = after_approval(row)
        if mode == "terminal":
            return (
                f"this client cannot ask a human to confirm. A person on the host runs {command}"
                f" (or `decline`; `{program} approvals list` shows the request): {after}."
            )
        summary = shared.plain_summary(self.view_of(row), self.clock.now_ms())
        if mode == "url":
            return (
                f"{summary}\n\nOpen the approval page and type the code shown on the host's"
                f" terminal to answer (or, on the host, run {command}): {after}."
            )
        link = self.link(row)
        page = (
            f" or on the approval page ({link}) with the code shown on the host's terminal"
            if link
            else ""
        )
        return f"{summary}\n\nA person on the host can also answer with {command}{page}."

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

    def ask(
        self, request: ConfirmationRequest, ctx: TrustedContext, mode: Mode, arguments: Any = None
    ) -> Question:
        row = self.book.open(
            request,
            agent_id=ctx.agent_id,
            session_id=ctx.session_id,
            now_ms=self.clock.now_ms(),
            call=HeldCall.of(request.tool, arguments, ctx),
        )
        self._announce(row)
        return Question(
            approval_id=row.approval_id,
            issued_at_ms=row.issued_at_ms,
            expires_at_ms=row.expires_at_ms,
            message=self.message(row, mode=mode),
            link=self.link(row),
            approve_with=approve_command(row.approval_id),
        )

    def answer(self, question: Question, approve: bool) -> Approval | Declined | None:
        """The client's form answered ``question``: the approval, ``Declined``, or None when
        the question is gone. The first answer wins (the page or the terminal may have answered
        while the form was open)."""
        approval_id = question.approval_id
        _, final = self.answer_by_id(approval_id, approve, by="client")
        if final is None:
            return None
        if final.state != "approved":
            self.book.close_declined(approval_id)
            return Declined(final)
        return final.approval()

    def answer_by_id(
        self, approval_id: str, approve: bool, *, by: Answerer, approver: str | None = None
    ) -> tuple[bool, OpenApproval | None]:
        """A human answered the question ``approval_id`` (``by``: the terminal, the console,
        the client's form; ``approver``: who, when known): whether this answer was the first,
        and the question as it stands after it (None: no such question). An approval from the
        terminal or the console is carried out at once (``carry_out``); the client's form is
        answered for the call that waits on it, which commits itself."""
        now_ms = self.clock.now_ms()
        recorded = self.book.answer(approval_id, approve, now_ms=now_ms, by=by, approver=approver)
        if recorded is None:
            return False, self.book.get(approval_id)
        return True, recorded if by == "client" else self.carry_out(recorded)

    def carry_out(self, row: OpenApproval) -> OpenApproval:
        """A person has just approved ``row``: commit the call it holds now, as the agent's
        (same principal, scope, tool, arguments and key; the engine's gate checks the approval,
        whose id the commit consumes), and record how it went on the row, which is returned.
        A row holding no call (a capture, a request_admission), or answered otherwise, is
        returned as it is: the agent's retry takes its answer."""
        held = row.held_call()
        if row.state != "approved" or held is None:
            return row
        failure, replayed = self._commit(row, held)
        self.book.settle(row.approval_id, self.clock.now_ms(), failure, reported=replayed)
        return self.book.get(row.approval_id) or row

    def _commit(self, row: OpenApproval, held: HeldCall) -> tuple[str | None, bool]:
        """Run ``row``'s held call with its approval: the error code of a failure (None: it
        landed), and whether the engine replayed a commit the agent's own retry made first."""
        try:
            answer = self._kernel().handle(
                row.tool, held.arguments, held.context(row), row.approval()
            )
        except ProtocolRefusal:
            return "PROTOCOL_CONTEXT_UNAVAILABLE", False
        except Exception:  # the engine could not be opened or reached: the retry still can
            log.exception("an approved %s could not be carried out", row.tool)
            return "STORE_UNAVAILABLE", False
        if not isinstance(answer, dict):  # ConfirmationNeeded: the approval was not taken
            return "GATE_FAILED", False
        if not answer.get("ok"):
            return str(answer["error"]["code"]), False
        return None, answer["output"]["value"].get("replayed") is True

    def reported(
        self, tool: str, ctx: TrustedContext, arguments: Any, envelope: dict[str, Any]
    ) -> dict[str, Any]:
        """The agent's call answered ``envelope``: the first report of a commit an approval
        carried out says ``replayed: false`` (the agent sees its result for the first time), as
        the cloud's run reports it; every later one is a replay."""
        value = envelope.get("output", {}).get("value", {}) if envelope.get("ok") else {}
        if tool not in ALWAYS_CONFIRMED or value.get("replayed") is not True:
            return envelope
        key = arguments.get("idempotency_key") if isinstance(arguments, dict) else None
        if not isinstance(key, str) or not self.book.first_report(
            ctx, tool, key, self.clock.now_ms()
        ):
            return envelope
        return {**envelope, "output": {**envelope["output"], "value": {**value, "replayed": False}}}

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
        if not credential:  # said for every id alike: it tells nothing about this one
            return shared.PageError.INCOMPLETE_LINK
        row = book.get(approval_id) if approval_id.startswith("apr_") else None
        if row is None or not hmac.compare_digest(row.secret.encode(), credential.encode()):
            return shared.PageError.NOT_FOUND  # a wrong secret learns nothing, not even existence
        if row.state != "pending":
            return shared.PageError.ANSWERED
        return row

    def shown(self, question: OpenApproval) -> shared.ApprovalView:
        return self._approvals.view_of(question)

    def answer(
        self,
        approval_id: str,
        credential: str,
        decision: shared.Decision,
        now_ms: int,
        code: str = "",
    ) -> shared.DeskAnswer | shared.PageError:
        row = self.question(approval_id, credential)
        if isinstance(row, shared.PageError):
            return row
        answered = self._approvals.book.answer_with_code(
            approval_id, decision is shared.Decision.APPROVE, code, now_ms=now_ms
        )
        if answered == "wrong_code":
            return shared.PageError.WRONG_CODE
        if answered == "no_more_attempts":
            return shared.PageError.NO_MORE_ATTEMPTS
        if answered is None:
            return (
                shared.PageError.ANSWERED
                if row.expires_at_ms > now_ms
                else shared.PageError.EXPIRED
            )
        done = self._approvals.carry_out(answered)
        outcome = outcome_line(done) if done.call is not None else None
        return shared.DeskAnswer(self._approvals.view_of(done), decision, outcome)


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


def after_approval(row: OpenApproval) -> str:
    """What follows an approval of ``row``, as the agent and the approver are told it: carried
    out at once (a withdraw, a forget), or taken by the agent's retry in its window."""
    if row.call is not None:
        return shared.CARRIED_OUT
    return f"the agent's retry of the same call goes through if it comes {shared.RETRY_WINDOW}"


def outcome_line(row: OpenApproval) -> str:
    """What an approval of ``row`` did, in one line for the approver (the terminal, the
    console, the page): carried out, or why not and what the agent's retry does then."""
    if row.committed_at_ms is not None:
        return (
            "It was carried out: the agent's retry of the same call returns its result,"
            " whenever it comes."
        )
    if row.commit_failure is None:
        after = after_approval(row)
        return after[0].upper() + after[1:] + "."
    cause = _NOT_CARRIED_OUT.get(row.commit_failure, row.commit_failure)
    return (
        f"It could not be carried out now ({cause}); nothing was changed. The agent's retry"
        f" of the same call takes the approval if it comes {shared.RETRY_WINDOW}; later, it"
        " asks again."
    )


def approve_command(approval_id: str) -> str:
    """The terminal command that approves ``approval_id``, as a -32603's ``data`` names it: the
    bare program name, never the path this server was started by."""
    return f"{PROGRAM} approvals approve {approval_id}"


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _html(page: shared.PageResponse) -> Response:
    return HTMLResponse(page.html, page.status, headers=dict(page.headers))


__all__ = [
    "APPROVALS_PATH",
    "EmbeddedApprovals",
    "LinkDesk",
    "after_approval",
    "approval_routes",
    "approve_command",
    "outcome_line",
]

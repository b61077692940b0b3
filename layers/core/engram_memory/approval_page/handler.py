"""The approval page's request core: GET shows the request, POST takes the answer.

It knows no storage and no sign-in: a composition puts its own ``ApprovalDesk`` behind it (the
embedded server: a single-use secret in the link; the cloud: the signed-in principal). The core
checks what both share: the request still open and not expired, the CSRF token on the form, the
Origin of a POST, an explicit Approve or Decline. Both hosts' desks are ``QuestionDesk``s (the
CSRF tokens are issued here); ``read_form``, ``error_page`` and ``redirect`` are the rest of the
HTTP exchange they share.
"""

from __future__ import annotations

import hashlib
import hmac
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar
from urllib.parse import parse_qsl

from engram_memory.approval_page.render import (
    CODE_FIELD,
    CSRF_FIELD,
    DECISION_FIELD,
    PAGE_HEADERS,
    render_answered,
    render_approval,
    render_error,
)
from engram_memory.approval_page.view import ApprovalView, Decision, PageError

MAX_FORM_BYTES: Final = 4096
Q = TypeVar("Q")


class ApprovalDesk(Protocol):
    """A composition's storage and sign-in behind the page. ``credential`` is what proves the
    visitor may answer (the link's secret embedded, the session's principal in the cloud)."""

    def view(self, approval_id: str, credential: str) -> ApprovalView | PageError:
        """The open request, or why it cannot be shown (unknown, answered, forbidden...)."""
        ...

    def csrf_token(self, approval_id: str, credential: str) -> str: ...

    def answer(
        self, approval_id: str, credential: str, decision: Decision, now_ms: int, code: str = ""
    ) -> DeskAnswer | PageError:
        """Record the answer once (the first answer wins); ``code``: what the person typed in
        the page's code field (a desk whose view ``asks_code`` checks it)."""
        ...


@dataclass(frozen=True, slots=True)
class DeskAnswer:
    view: ApprovalView
    decision: Decision
    outcome: str | None = None  # the host's one line on what the approval did, when it says


class QuestionDesk(ABC, Generic[Q]):
    """An ``ApprovalDesk`` over a host's stored questions: the host finds the question a
    credential may see (``question``), shows it (``shown``) and answers it (``answer``); the
    desk issues the CSRF tokens, bound to the approval and the credential under the host's key
    (``purpose`` sets two desks' tokens apart)."""

    def __init__(self, csrf_key: bytes, *purpose: str) -> None:
        self._csrf_key = csrf_key
        self._purpose = purpose

    @abstractmethod
    def question(self, approval_id: str, credential: str) -> Q | PageError:
        """The open question, or why this credential may not see it."""

    @abstractmethod
    def shown(self, question: Q) -> ApprovalView | PageError:
        """The question as the page shows it."""

    @abstractmethod
    def answer(
        self, approval_id: str, credential: str, decision: Decision, now_ms: int, code: str = ""
    ) -> DeskAnswer | PageError:
        """Record the answer once (the first answer wins); ``code`` as ``ApprovalDesk``'s."""

    def view(self, approval_id: str, credential: str) -> ApprovalView | PageError:
        found = self.question(approval_id, credential)
        return found if isinstance(found, PageError) else self.shown(found)

    def csrf_token(self, approval_id: str, credential: str) -> str:
        return csrf_token(self._csrf_key, *self._purpose, approval_id, credential)


@dataclass(frozen=True, slots=True)
class PageRequest:
    method: str
    approval_id: str
    credential: str
    action_url: str  # where the form posts back (this very page)
    form: Mapping[str, str] = field(default_factory=dict)
    origin: str | None = None  # the POST's Origin header, when the browser sent one
    fetch_site: str | None = None  # its Sec-Fetch-Site header, when the browser sent one

    @classmethod
    def of(
        cls,
        method: str,
        approval_id: str,
        credential: str,
        action_url: str,
        *,
        headers: Mapping[str, str],
        form: Mapping[str, str],
    ) -> PageRequest:
        """A host's HTTP request to the page (``headers`` by lower-case name)."""
        return cls(
            method=method,
            approval_id=approval_id,
            credential=credential,
            action_url=action_url,
            form=form,
            origin=headers.get("origin"),
            fetch_site=headers.get("sec-fetch-site"),
        )


@dataclass(frozen=True, slots=True)
class PageResponse:
    status: int
    html: str
    headers: Mapping[str, str] = field(default_factory=lambda: dict(PAGE_HEADERS))


def csrf_token(key: bytes, *parts: str) -> str:
    """A CSRF token bound to ``parts`` (approval id and credential) under a server key."""
    return hmac.new(key, "\x1f".join(parts).encode(), hashlib.sha256).hexdigest()


def read_form(body: bytes, *, limit: int = MAX_FORM_BYTES) -> dict[str, str] | None:
    """The page's form from a urlencoded body (blank values kept); None when it is larger than
    ``limit`` bytes."""
    if len(body) > limit:
        return None
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def error_page(error: PageError, status: int | None = None) -> PageResponse:
    """An error as a page: its own status, or ``status`` (a host's refusal before the page)."""
    own_status, html = render_error(error)
    return PageResponse(status or own_status, html)


def redirect(location: str) -> PageResponse:
    """A 302 elsewhere (the sign-in), never cached: it carries a one-time state."""
    return PageResponse(302, "", {"Location": location, "Cache-Control": "no-store"})


def same_origin(origin: str | None, fetch_site: str | None, allowed_origin: str | None) -> bool:
    """A form POST with no sign of another site: ``Sec-Fetch-Site`` same-origin (or none: typed,
    bookmarked) and an ``Origin`` that is this page's. A page sent with ``Referrer-Policy:
    no-referrer`` posts ``Origin: null``, which says nothing either way; the CSRF token still
    has to match."""
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    return origin in (None, "null", allowed_origin)


def handle_page(
    desk: ApprovalDesk, request: PageRequest, *, now_ms: int, allowed_origin: str | None
) -> PageResponse:
    """Answer one request to ``/approvals/{id}`` (``allowed_origin``: this page's own origin)."""
    if request.method not in ("GET", "POST"):
        return error_page(PageError.BAD_REQUEST)
    shown = desk.view(request.approval_id, request.credential)
    if isinstance(shown, PageError):
        return error_page(shown)
    if shown.expires_at_ms <= now_ms:
        return error_page(PageError.EXPIRED)
    expected = desk.csrf_token(request.approval_id, request.credential)
    if request.method == "GET":
        html = render_approval(
            shown, now_ms=now_ms, action_url=request.action_url, csrf_token=expected
        )
        return PageResponse(200, html)
    if not same_origin(request.origin, request.fetch_site, allowed_origin):
        return error_page(PageError.CSRF)
    sent = request.form.get(CSRF_FIELD, "")
    if not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        return error_page(PageError.CSRF)
    try:
        decision = Decision(request.form.get(DECISION_FIELD, ""))
    except ValueError:
        return error_page(PageError.BAD_REQUEST)
    code = request.form.get(CODE_FIELD, "")
    answered = desk.answer(request.approval_id, request.credential, decision, now_ms, code)
    if isinstance(answered, PageError):
        return error_page(answered)
    return PageResponse(200, render_answered(answered.view, answered.decision, answered.outcome))

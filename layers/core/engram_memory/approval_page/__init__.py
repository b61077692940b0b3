"""The approval page a person opens to answer a confirmation (CONTRACT.md §8), one module for
both hosts: ``view`` is what is shown (``ApprovalView.of`` a host's question), ``render`` turns it
into HTML (no JavaScript, strict CSP, readable at 320 px), ``handler`` is the request core: the
desk a host's storage and sign-in stand behind (``QuestionDesk``, with its CSRF tokens), the
form read from the body, GET shows, POST answers (CSRF token, same origin, an explicit choice),
the pages' headers, errors and redirects.

What stays with a host: the embedded server's ``embedded.book_channel`` (the link's
single-use secret, the ``ApprovalBook``, a starlette route); the cloud's ``cloud.approval_page``
(OIDC sign-in and the session cookie, DynamoDB and Step Functions, API Gateway events)."""

from __future__ import annotations

from engram_memory.approval_page.handler import (
    MAX_FORM_BYTES,
    ApprovalDesk,
    DeskAnswer,
    PageRequest,
    PageResponse,
    QuestionDesk,
    csrf_token,
    error_page,
    handle_page,
    read_form,
    redirect,
    same_origin,
)
from engram_memory.approval_page.render import (
    DECISION_STYLE,
    PAGE_HEADERS,
    render_answered,
    render_approval,
    render_error,
    render_signed_in,
)
from engram_memory.approval_page.view import (
    CARRIED_OUT,
    RETRY_WINDOW,
    ApprovalView,
    Asked,
    Citation,
    Component,
    Decision,
    Memory,
    PageError,
    action_of,
    memory_from_record,
    plain_summary,
)

__all__ = [
    "CARRIED_OUT",
    "DECISION_STYLE",
    "MAX_FORM_BYTES",
    "PAGE_HEADERS",
    "RETRY_WINDOW",
    "ApprovalDesk",
    "ApprovalView",
    "Asked",
    "Citation",
    "Component",
    "Decision",
    "DeskAnswer",
    "Memory",
    "PageError",
    "PageRequest",
    "PageResponse",
    "QuestionDesk",
    "action_of",
    "csrf_token",
    "error_page",
    "handle_page",
    "memory_from_record",
    "plain_summary",
    "read_form",
    "redirect",
    "render_answered",
    "render_approval",
    "render_error",
    "render_signed_in",
    "same_origin",
]

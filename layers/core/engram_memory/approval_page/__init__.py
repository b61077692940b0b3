"""The approval page a person opens to answer a confirmation (CONTRACT.md §8), for both
compositions: ``view`` is what is shown, ``render`` turns it into HTML (no JavaScript, strict CSP,
readable at 320 px), ``handler`` is the small request core (GET shows, POST answers) that the
embedded server and the cloud approval function put their own storage and sign-in behind."""

from __future__ import annotations

from engram_memory.approval_page.handler import (
    MAX_FORM_BYTES,
    ApprovalDesk,
    DeskAnswer,
    PageRequest,
    PageResponse,
    csrf_token,
    error_page,
    handle_page,
    read_form,
    redirect,
)
from engram_memory.approval_page.render import (
    PAGE_HEADERS,
    render_answered,
    render_approval,
    render_error,
    render_signed_in,
)
from engram_memory.approval_page.view import (
    ApprovalView,
    Asked,
    Citation,
    Component,
    Decision,
    Memory,
    PageError,
    memory_from_record,
    plain_summary,
)

__all__ = [
    "MAX_FORM_BYTES",
    "PAGE_HEADERS",
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
]

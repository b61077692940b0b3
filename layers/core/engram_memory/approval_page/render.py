"""The approval page as HTML: no JavaScript, one inline style allowed by its hash (strict CSP),
readable at 320 px (viewport meta, long ids wrap), errors as pages that say what to do next."""

from __future__ import annotations

import base64
import hashlib
from html import escape
from typing import Final

from engram_memory.approval_page.view import (
    CARRIED_OUT,
    RETRY_WINDOW,
    ApprovalView,
    Decision,
    Memory,
    PageError,
    iso_time,
)

# Approve and decline look the same here and in the embedded console, which serves these rules
# after its own stylesheet: approve is the filled, primary action; decline the outlined one.
DECISION_STYLE: Final = (
    "button[value=approve],button.approve{background:#14532d;color:#fff;border-color:#14532d}"
    "button[value=decline],button.decline{background:#fff;color:#7f1d1d;border-color:#7f1d1d}"
)
STYLE: Final = (
    "*{box-sizing:border-box}"
    "body{margin:0;font:16px/1.5 system-ui,sans-serif;color:#1b1b1b;background:#f6f6f4}"
    "main{max-width:42rem;margin:0 auto;padding:1rem}"
    "h1{font-size:1.4rem;margin:.5rem 0}h2{font-size:1.1rem;margin:1.25rem 0 .5rem}"
    "code,dd,blockquote,li{overflow-wrap:anywhere;word-break:break-word}"
    "dl{display:grid;grid-template-columns:minmax(6rem,auto) 1fr;gap:.25rem .75rem;margin:0}"
    "dt{font-weight:600}dd{margin:0}"
    "blockquote{margin:.5rem 0;padding:.5rem .75rem;background:#fff;border-left:4px solid #555}"
    ".kind{font-size:.8rem;text-transform:uppercase;color:#555}"
    ".choice{display:flex;flex-wrap:wrap;gap:.75rem;margin:1.5rem 0}"
    "button{flex:1 1 8rem;min-height:3rem;font:inherit;font-weight:600;border-radius:.4rem;"
    "border:2px solid #1b1b1b;cursor:pointer}"
    + DECISION_STYLE
    + ".note{color:#444;font-size:.9rem}"
    "label{display:block;font-weight:600;margin-top:1rem}"
    "input{font:inherit;font-size:1.25rem;letter-spacing:.15em;padding:.4rem .6rem;"
    "width:12rem;max-width:100%;border:2px solid #1b1b1b;border-radius:.4rem}"
    "@media (max-width:30rem){dl{grid-template-columns:1fr}dd{margin-bottom:.5rem}}"
)
_STYLE_HASH: Final = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
CSP: Final = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
# The page's URL carries the approval secret (embedded): no Referer, no cache, no framing.
PAGE_HEADERS: Final = {
    "Content-Type": "text/html; charset=utf-8",
    "Content-Security-Policy": CSP,
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
CSRF_FIELD: Final = "csrf_token"
DECISION_FIELD: Final = "decision"
CODE_FIELD: Final = "code"


def _document(title: str, body: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Engram Memory</title><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )


def _facts(view: ApprovalView, now_ms: int) -> str:
    rows = "".join(
        f"<dt>{escape(name)}</dt><dd>{escape(value)}</dd>" for name, value in view.facts(now_ms)
    )
    return f'<dl id="request">{rows}</dl>'


def _memory(memory: Memory | None) -> str:
    if memory is None:
        return ""
    if memory.withheld:
        captured = (
            f"<dt>Captured</dt><dd>{escape(iso_time(memory.captured_at_ms))}</dd>"
            if memory.captured_at_ms is not None
            else ""
        )
        return (
            '<section id="memory"><h2>The memory</h2>'
            "<p>Its text is not shown here; it is identified by its digest.</p>"
            f"<dl><dt>Digest</dt><dd><code>{escape(memory.digest)}</code></dd>{captured}</dl>"
            "</section>"
        )
    components = "".join(
        f'<blockquote class="component"><div class="kind">{escape(c.kind)}</div>'
        f"<p>{escape(c.text)}</p>"
        f'<div class="note">Cites {escape(", ".join(c.citation_ids))}</div></blockquote>'
        for c in memory.components
    )
    citations = "".join(
        f'<li class="citation"><code>{escape(c.citation_id)}</code>: {escape(c.source_ref)}'
        f" <span class=note>({escape(c.locator)})</span></li>"
        for c in memory.citations
    )
    return (
        f'<section id="memory"><h2>The memory</h2>{components}'
        f'<h2>Citations</h2><ul id="citations">{citations}</ul></section>'
    )


def render_approval(view: ApprovalView, *, now_ms: int, action_url: str, csrf_token: str) -> str:
    """The page that asks: what, who, the memory, and Approve / Decline (one POST form)."""
    body = (
        f"<h1>{escape(view.title)}</h1>"
        f"<p>An agent asks to {escape(view.action)}. Nothing changes unless you approve.</p>"
        f"{_memory(view.memory)}<h2>The request</h2>{_facts(view, now_ms)}"
        f'<form method="post" action="{escape(action_url)}">'
        f'<input type="hidden" name="{CSRF_FIELD}" value="{escape(csrf_token)}">'
        f"{_code_field(view)}"
        f'<div class="choice"><button type="submit" name="{DECISION_FIELD}" '
        f'value="{Decision.APPROVE.value}">Approve</button>'
        f'<button type="submit" name="{DECISION_FIELD}" '
        f'value="{Decision.DECLINE.value}">Decline</button></div></form>'
        f'<p class="note">{escape(_after_answer(view))}</p>'
    )
    return _document(view.title, body)


def _code_field(view: ApprovalView) -> str:
    """The embedded host's one-time code: what the link alone does not carry."""
    if not view.asks_code:
        return ""
    return (
        f'<label for="{CODE_FIELD}">Code from the host\'s terminal</label>'
        f'<input id="{CODE_FIELD}" name="{CODE_FIELD}" required autocomplete="one-time-code"'
        ' autocapitalize="characters" spellcheck="false" maxlength="16"'
        ' placeholder="ABCD-EFGH">'
        '<p class="note">It is printed where Engram Memory runs, and by <code>engram-memory'
        " approvals list</code>, never to the agent: with the link alone nobody can answer.</p>"
    )


def _after_answer(view: ApprovalView) -> str:
    if view.committed_by_run:
        return (
            f"After you answer, go back to your agent: {CARRIED_OUT}; after a decline it is"
            " refused. Answer within 5 minutes of the request."
        )
    return (
        "After you answer, go back to your agent: it retries the same call, which then goes"
        f" through (approve) or is refused (decline). The retry must come {RETRY_WINDOW}."
    )


def render_answered(view: ApprovalView, decision: Decision, outcome: str | None = None) -> str:
    """The page after an answer; ``outcome``: the host's one line on what the approval did (the
    embedded host carried it out, or says why it could not)."""
    if decision is Decision.APPROVE:
        heading = "Approved"
        text = (
            f"You approved: {view.action}. {outcome}"
            if outcome is not None
            else f"You approved: {view.action}. It is carried out now; your agent's retry of the"
            " same call returns its result."
            if view.committed_by_run
            else f"You approved: {view.action}. Go back to your agent now: its retry of the"
            f" same call goes through if it comes {RETRY_WINDOW}."
        )
    else:
        heading = "Declined"
        text = (
            "Nothing was changed. The agent's call is refused; to try again it has to ask you"
            " for a new approval."
        )
    body = (
        f'<h1 id="outcome" data-decision="{decision.value}">{heading}</h1>'
        f"<p>{escape(text)}</p>"
        f'<p class="note">Reference {escape(view.approval_id)}. You can close this page.</p>'
    )
    return _document(heading, body)


def render_signed_in(return_to: str) -> str:
    """The sign-in callback's page: on to the approval. A page (not a redirect) so that the
    next navigation starts on this site and carries the ``SameSite=Strict`` session cookie."""
    body = (
        '<h1 id="signed-in">Signed in</h1>'
        f'<p><a id="continue" href="{escape(return_to)}">Continue to the approval</a></p>'
    )
    refresh = f'<meta http-equiv="refresh" content="0;url={escape(return_to)}">'
    return _document("Signed in", body).replace("</head>", refresh + "</head>", 1)


ERRORS: Final[dict[PageError, tuple[int, str, str]]] = {
    PageError.NOT_FOUND: (
        404,
        "Approval not found",
        "This approval link is not known here. Open the whole link your agent's host showed you;"
        " if the agent still needs an approval, have it retry its call to get a new link.",
    ),
    PageError.INCOMPLETE_LINK: (
        404,
        "This approval link is incomplete",
        "The link lacks its secret: the part after ?secret= that the agent's host gave with it."
        " Open the whole link; or, on the host, run engram-memory approvals list to see the"
        " requests waiting and answer them there.",
    ),
    PageError.EXPIRED: (
        410,
        "This request has expired",
        "Approvals live 5 minutes and nothing was changed. Have the agent retry its call with the"
        " same idempotency key: it gets a new link.",
    ),
    PageError.ANSWERED: (
        409,
        "Already answered",
        "This approval was already answered (each link works once). Go back to your agent; if"
        " it needs another approval, it gets a new link.",
    ),
    PageError.CSRF: (
        403,
        "The form could not be verified",
        "The answer did not come from this approval page. Open the approval link again and"
        " choose Approve or Decline there.",
    ),
    PageError.FORBIDDEN: (
        403,
        "You cannot answer this request",
        "Only the person who approves for this agent can answer it. Sign in as that person, or"
        " ask them to open the link.",
    ),
    PageError.BAD_REQUEST: (
        400,
        "No answer was chosen",
        "Open the approval link again and press Approve or Decline.",
    ),
    PageError.UNAVAILABLE: (
        503,
        "The memory service is unavailable",
        "Nothing was changed. Reload this page in a moment.",
    ),
    PageError.WRONG_CODE: (
        403,
        "That code is not right",
        "Nothing was changed. Go back, type the code printed on the terminal where Engram Memory"
        " runs (or shown by `engram-memory approvals list`), and answer again. After 5 wrong"
        " codes this page stops taking answers to the request.",
    ),
    PageError.NO_MORE_ATTEMPTS: (
        429,
        "This page no longer takes answers to the request",
        "Too many wrong codes were typed, and nothing was changed. On the machine where Engram"
        " Memory runs, answer with `engram-memory approvals approve` or `decline` and the"
        " request's reference (see `engram-memory approvals list`).",
    ),
    PageError.SIGN_IN: (
        401,
        "You are not signed in",
        "Your sign-in expired or did not complete, and nothing was changed. Open the approval"
        " link again: it takes you to your organization's sign-in page and back to the request.",
    ),
    PageError.NOT_A_PERSON: (
        403,
        "This sign-in cannot approve",
        "Approvals are given by a person signing in with their own account, never with an"
        " agent's or an application's, and nothing was changed. Ask the person who approves for"
        " this agent to open the link and sign in.",
    ),
    PageError.STALE_SIGN_IN: (
        401,
        "Sign in again",
        "Approvals need a sign-in from the last 5 minutes, and your organization's sign-in page"
        " reused an earlier one; nothing was changed. Sign out there, then open the approval"
        " link again and sign in.",
    ),
}


def render_error(error: PageError) -> tuple[int, str]:
    """An error as a page: its HTTP status and HTML, with the next step."""
    status, heading, next_step = ERRORS[error]
    body = (
        f'<h1 id="error" data-error="{error.value}">{escape(heading)}</h1>'
        f'<p id="next-step">{escape(next_step)}</p>'
    )
    return status, _document(heading, body)

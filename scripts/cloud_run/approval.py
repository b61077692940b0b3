"""The approval page in a browser, as API Gateway events to the built approval function: open
the link (302 to the issuer), sign in there as the principal, come back to the callback (session
cookie), read the page's CSRF token, press Approve."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from .harness import Harness
from .identity import AUTHORIZE_PATH
from .mcp import CLASSIC
from .settings import AUDIENCE, PRINCIPAL, sample
from .smoke import outcome


def page(h: Harness, event: dict[str, Any]) -> dict[str, Any]:
    """One request to the built approval function; its Lambda answer."""
    h.tally.page_requests += 1
    answer: dict[str, Any] = h.worker("ApprovalFunction").invoke(event)
    h.lambdas.payloads.append(json.dumps(event).encode())
    h.lambdas.payloads.append(json.dumps(answer).encode())
    return answer


def page_event(name: str, approval_id: str) -> dict[str, Any]:
    """``events/<name>`` addressed to the approval ``approval_id``."""
    event: dict[str, Any] = sample(name)
    event["pathParameters"]["approvalId"] = approval_id
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/approvals/{approval_id}"
    return event


def sign_in(h: Harness, opened: dict[str, Any]) -> str | None:
    """Open the link signed out, sign in at the issuer, come back: the session cookie (None when
    a step failed, reported)."""
    check = h.report.check
    redirect = page(h, opened).get("result", {})
    location = str((redirect.get("headers") or {}).get("Location", ""))
    signin = [c.split(";")[0] for c in redirect.get("cookies") or []]
    if not check(
        redirect.get("statusCode") == 302
        and location.startswith(h.issuer.url + AUTHORIZE_PATH + "?")
        and "code_challenge_method=S256" in location
        and len(signin) == 1,
        f"flow: the approval link sends a signed-out person to the issuer "
        f"({redirect.get('statusCode')}, PKCE S256)",
    ):
        return None
    code, state = h.issuer.sign_in(location, PRINCIPAL)
    callback = sample("approval_callback.json")
    callback["rawQueryString"] = urlencode({"code": code, "state": state})
    callback["cookies"] = signin
    back = page(h, callback).get("result", {})
    session = [c for c in back.get("cookies") or [] if c.startswith("engram_approver=")]
    if not check(
        back.get("statusCode") == 200
        and len(session) == 1
        and all(a in session[0] for a in ("HttpOnly", "Secure", "SameSite=Strict")),
        "flow: the sign-in callback verifies the ID token and sets the session cookie "
        f"({back.get('statusCode')}, HttpOnly; Secure; SameSite=Strict)",
    ):
        return None
    return str(session[0]).split(";")[0]


def approve_on_the_page(h: Harness, approval_id: str, decision: str = "approve") -> dict[str, Any]:
    """What a browser does (see the module docstring), the person choosing ``decision``
    (approve or decline). Each step is checked; the POST's answer is returned ({} when a step
    before it failed)."""
    opened = page_event("approval_get.json", approval_id)
    cookie = sign_in(h, opened)
    if cookie is None:
        return {}
    opened["cookies"] = [cookie]
    shown = page(h, opened).get("result", {})
    body = str(shown.get("body", ""))
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', body)
    if not h.report.check(
        shown.get("statusCode") == 200 and found is not None and 'id="memory"' in body,
        f"flow: the signed-in principal sees the page with the memory ({shown.get('statusCode')})",
    ):
        return {}
    assert found is not None
    posted = page_event("approval_post.json", approval_id)
    posted["cookies"] = [cookie]
    posted["headers"]["origin"] = AUDIENCE.rsplit("/", 1)[0]
    refused = page(h, {**posted, "body": "decision=approve"}).get("result", {})
    h.report.check(
        refused.get("statusCode") == 403,
        f"flow: a POST without the page's CSRF token is refused ({refused.get('statusCode')})",
    )
    posted["body"] = urlencode({"csrf_token": found.group(1), "decision": decision})
    return page(h, posted)


def page_link(h: Harness, asked: Any, tool: str = "forget") -> str | None:
    """The approval id of a -32042 answer's page link (None when the answer has none,
    reported)."""
    error = asked.get("error", {})
    elicitations = (error.get("data") or {}).get("elicitations") or []
    url = str(elicitations[0].get("url", "")) if elicitations else ""
    if not h.report.check(
        error.get("code") == -32042 and "/approvals/" in url,
        f"flow: {tool} ({CLASSIC}) answers -32042 with the approval URL ({url[:60]})",
    ):
        print(f"       {json.dumps(asked)[:400]}")
        return None
    return url.rsplit("/", 1)[1]


def approve_the_link(h: Harness, asked: Any, tool: str = "forget") -> bool:
    """The -32042 answer names the approval page; the person approves there."""
    approval_id = page_link(h, asked, tool)
    if approval_id is None:
        return False
    answered = approve_on_the_page(h, approval_id)
    h.report.check(
        answered.get("result", {}).get("statusCode") == 200
        and 'data-decision="approve"' in str(answered.get("result", {}).get("body")),
        f"flow: the built approval page takes the signed-in person's answer -> {outcome(answered)}",
    )
    return True

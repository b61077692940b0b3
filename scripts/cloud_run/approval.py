"""The approval page in a browser: open the link (302 to the issuer), sign in there as the
approver the agent's token names (``APPROVER``), come back to the callback (session cookie), read
the page's CSRF token, press Approve. The agent's own identity at the issuer is refused
(``agent_is_refused``): a member of the agents' group gets no session, and the agent signed in
as a person-shaped user is not the approver.

Each request is an API Gateway event for the built approval function: sent to its worker as is
(``page``: the flow), or as the HTTPS request a browser sends to the HTTP API's stand-in, which
makes the event again (``through_the_api``: the operator's smoke, whose link names the API's
custom domain)."""

from __future__ import annotations

import base64
import http.client
import json
import re
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

from .harness import Harness
from .identity import AUTHORIZE_PATH
from .mcp import CLASSIC
from .settings import APPROVER, AUDIENCE, PRINCIPAL, sample
from .smoke import outcome

# One request of the browser: the approval function's event in, its Lambda answer out.
Send = Callable[[Harness, dict[str, Any]], dict[str, Any]]


def page(h: Harness, event: dict[str, Any]) -> dict[str, Any]:
    """One request to the built approval function; its Lambda answer."""
    h.tally.page_requests += 1
    answer: dict[str, Any] = h.worker("ApprovalFunction").invoke(event)
    h.lambdas.payloads.append(json.dumps(event).encode())
    h.lambdas.payloads.append(json.dumps(answer).encode())
    return answer


def through_the_api(h: Harness, event: dict[str, Any]) -> dict[str, Any]:
    """The request ``event`` describes, sent over HTTPS to the HTTP API's stand-in as a browser
    sends it (the link's host, ``Cookie``, ``Origin``; redirects not followed), its response as
    the Lambda answer it came from (``statusCode``, ``headers``, ``cookies``, ``body``)."""
    method = event["requestContext"]["http"]["method"]
    target = event["rawPath"] + (
        f"?{event['rawQueryString']}" if event.get("rawQueryString") else ""
    )
    headers = {
        k: v for k, v in (event.get("headers") or {}).items() if k not in ("content-length", "host")
    }
    headers["host"] = AUDIENCE.split("/")[2]  # the link's host, which DNS sends to the API
    if event.get("cookies"):
        headers["cookie"] = "; ".join(event["cookies"])
    body = str(event.get("body") or "").encode()
    if event.get("isBase64Encoded"):
        body = base64.b64decode(body)
    base = urlsplit(h.api_url)
    tls = ssl.create_default_context(cafile=str(h.cert))
    connection = http.client.HTTPSConnection(
        base.hostname or "", base.port, context=tls, timeout=30
    )
    try:
        connection.request(method, target, body=body or None, headers=headers)
        response = connection.getresponse()
        data = response.read().decode("utf-8", "replace")
        pairs = response.getheaders()
    finally:
        connection.close()
    return {
        "result": {
            "statusCode": response.status,
            "headers": {name: value for name, value in pairs if name.lower() != "set-cookie"},
            "cookies": [value for name, value in pairs if name.lower() == "set-cookie"],
            "body": data,
        }
    }


def page_event(name: str, approval_id: str) -> dict[str, Any]:
    """``events/<name>`` addressed to the approval ``approval_id``."""
    event: dict[str, Any] = sample(name)
    event["pathParameters"]["approvalId"] = approval_id
    event["rawPath"] = event["requestContext"]["http"]["path"] = f"/approvals/{approval_id}"
    return event


def signed_in_at_the_issuer(
    h: Harness,
    opened: dict[str, Any],
    send: Send,
    who: str,
    subject: str = APPROVER,
    groups: tuple[str, ...] | None = None,
) -> dict[str, Any] | None:
    """Open the link signed out and sign in at the issuer as ``subject`` (its ID token listing
    ``groups``): the callback's answer (None when the link did not send the browser there)."""
    redirect = send(h, opened).get("result", {})
    location = str((redirect.get("headers") or {}).get("Location", ""))
    signin = [c.split(";")[0] for c in redirect.get("cookies") or []]
    if not h.report.check(
        redirect.get("statusCode") == 302
        and location.startswith(h.issuer.url + AUTHORIZE_PATH + "?")
        and "code_challenge_method=S256" in location
        and "max_age=300" in location
        and len(signin) == 1,
        f"{who}: the approval link sends a signed-out person to the issuer "
        f"({redirect.get('statusCode')}, PKCE S256, max_age 300 s)",
    ):
        return None
    code, state = h.issuer.sign_in(location, subject, groups=groups)
    callback = sample("approval_callback.json")
    callback["rawQueryString"] = urlencode({"code": code, "state": state})
    callback["cookies"] = signin
    back: dict[str, Any] = send(h, callback).get("result", {})
    return back


def sign_in(h: Harness, opened: dict[str, Any], send: Send = page, who: str = "flow") -> str | None:
    """Open the link signed out, sign in at the issuer as the agent's approver, come back: the
    session cookie (None when a step failed, reported as ``who``'s)."""
    check = h.report.check
    back = signed_in_at_the_issuer(h, opened, send, who)
    if back is None:
        return None
    session = [c for c in back.get("cookies") or [] if c.startswith("engram_approver=")]
    if not check(
        back.get("statusCode") == 200
        and len(session) == 1
        and all(a in session[0] for a in ("HttpOnly", "Secure", "SameSite=Strict")),
        f"{who}: the sign-in callback verifies the ID token and sets the session cookie "
        f"({back.get('statusCode')}, HttpOnly; Secure; SameSite=Strict)",
    ):
        return None
    return str(session[0]).split(";")[0]


def approve_on_the_page(
    h: Harness,
    approval_id: str,
    decision: str = "approve",
    send: Send | None = None,
    who: str = "flow",
) -> dict[str, Any]:
    """What a browser does (see the module docstring), the person choosing ``decision``
    (approve or decline), each request sent with ``send`` (``page``: to the built function).
    Each step is checked as ``who``'s; the POST's answer is returned ({} when a step before it
    failed)."""
    send = send or page
    opened = page_event("approval_get.json", approval_id)
    cookie = sign_in(h, opened, send, who)
    if cookie is None:
        return {}
    opened["cookies"] = [cookie]
    shown = send(h, opened).get("result", {})
    body = str(shown.get("body", ""))
    found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', body)
    if not h.report.check(
        shown.get("statusCode") == 200 and found is not None and 'id="memory"' in body,
        f"{who}: the signed-in approver sees the page with the memory ({shown.get('statusCode')})",
    ):
        return {}
    assert found is not None
    posted = page_event("approval_post.json", approval_id)
    posted["cookies"] = [cookie]
    posted["headers"]["origin"] = AUDIENCE.rsplit("/", 1)[0]
    refused = send(h, {**posted, "body": "decision=approve"}).get("result", {})
    h.report.check(
        refused.get("statusCode") == 403,
        f"{who}: a POST without the page's CSRF token is refused ({refused.get('statusCode')})",
    )
    posted["body"] = urlencode({"csrf_token": found.group(1), "decision": decision})
    return send(h, posted)


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


def agent_is_refused(h: Harness, approval_id: str) -> None:
    """The agent's own identity at the issuer never answers: signed in as a member of the
    agents' group it gets no session; signed in as a user outside the group (an operator who
    forgot the group) it is not the approver its token names, and the page shows nothing."""
    opened = page_event("approval_get.json", approval_id)
    back = signed_in_at_the_issuer(h, opened, page, "flow", PRINCIPAL) or {}
    sessions = [c for c in back.get("cookies") or [] if c.startswith("engram_approver=")]
    h.report.check(
        back.get("statusCode") == 403 and not sessions and outcome_of(back) == "not_a_person",
        f"flow: the agent's own sign-in (a member of the agents' group) gets no session "
        f"({back.get('statusCode')} {outcome_of(back)})",
    )
    back = signed_in_at_the_issuer(h, opened, page, "flow", PRINCIPAL, ("staff",)) or {}
    sessions = [c for c in back.get("cookies") or [] if c.startswith("engram_approver=")]
    shown: dict[str, Any] = {}
    if sessions:
        shown = page(h, {**opened, "cookies": [sessions[0].split(";")[0]]}).get("result", {})
    h.report.check(
        shown.get("statusCode") == 403 and outcome_of(shown) == "forbidden",
        f"flow: the agent signed in outside the group is not the approver its token names "
        f"({shown.get('statusCode')} {outcome_of(shown)})",
    )


def outcome_of(page_answer: dict[str, Any]) -> str | None:
    """The page's ``data-decision`` (answered) or ``data-error`` (refused)."""
    found = re.search(r'data-(?:decision|error)="([a-z_]+)"', str(page_answer.get("body", "")))
    return found.group(1) if found else None


def approve_the_link(
    h: Harness, asked: Any, tool: str = "forget", *, agent_tries_first: bool = False
) -> bool:
    """The -32042 answer names the approval page; the person approves there (after the agent's
    own sign-in was refused, with ``agent_tries_first``)."""
    approval_id = page_link(h, asked, tool)
    if approval_id is None:
        return False
    if agent_tries_first:
        agent_is_refused(h, approval_id)
    answered = approve_on_the_page(h, approval_id)
    h.report.check(
        answered.get("result", {}).get("statusCode") == 200
        and 'data-decision="approve"' in str(answered.get("result", {}).get("body")),
        f"flow: the built approval page takes the signed-in person's answer -> {outcome(answered)}",
    )
    return True

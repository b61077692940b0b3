"""The cloud approval page (the approval function behind the HTTP API): a person signs in at the
tenant's identity provider and answers a URL-mode confirmation with a button.

Routes (all public on the HTTP API: the function itself checks who is signed in):

- ``GET /approvals/{approvalId}`` without a session: a 302 to the issuer's authorization
  endpoint (OIDC discovery; authorization code with PKCE S256, ``state``, ``nonce`` and
  ``max_age``; the client id is the approval audience), the pending sign-in kept in a signed
  cookie. With a session: the shared page (``engram_memory.approval_page``) with Approve /
  Decline and a CSRF token bound to the approval and the session.
- ``GET /approvals/callback``: the code exchanged at the token endpoint, the ID token checked
  (issuer, audience, nonce, signature against the issuer's JWKS via ``cloud.oidc.IssuerKeys``;
  an ID token whose ``aud`` also names the MCP resource is an agent's and is refused), then as a
  person's (``approver_signin.PersonRule``: never a member of the agents' group, never an
  application, an interactive sign-in whose ``auth_time`` is within ``max_age``; a stale one is
  asked again once, with ``prompt=login``), a session cookie set (``HttpOnly; Secure;
  SameSite=Strict``, 10 minutes, HMAC-signed under the key in
  ``ENGRAM_APPROVAL_SESSION_SECRET_ARN``), then a page that goes on to the approval.
- ``POST /approvals/{approvalId}``: the form (session cookie + CSRF token + same-origin + an
  explicit decision) answers the parked Step Functions task token, once: an approval with a
  proof under the approval proof key (``cloud.proofs``; only this function may make one), which
  the run's commit step verifies.

Who may see or answer a request (``CloudDesk.question``): the approver the agent's verified
token named (the parked ``approver``: ``ENGRAM_APPROVER_CLAIM``, e.g. ``engram_approver``, copied
from the agent's context when the run parked its token), signed in as that ``sub``; when the
token named none, the principal itself (the parked ``principal``) — a person, since every
session passed the person checks above. An agent therefore never approves its own request.

The former bearer-JWT ``POST`` (``{"approve": true}`` with an approval-audience access token) is
gone: any program holding such a token could answer without a person ever seeing the memory,
and the route's authorizer could not also admit the browser's form. Errors are pages with a next
step. Nothing here logs a cookie, a code, a token or the memory's text.

What the page shows: forget, the record's text and citations (read from the canonical table, or
its S3 blob when large); withdraw, the pending candidate's digest and capture time only (this
function holds no KMS permission on the data key: see docs/deploying-aws.md, "Approving in the
cloud").
"""

from __future__ import annotations

import base64
import json
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

from engram_memory.adapters.aws.calls import error_code
from engram_memory.approval_page import (
    ApprovalView,
    Decision,
    DeskAnswer,
    Memory,
    PageError,
    PageRequest,
    PageResponse,
    QuestionDesk,
    error_page,
    handle_page,
    memory_from_record,
    read_form,
    redirect,
    render_signed_in,
)
from engram_memory.cloud.approver_signin import (
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    Fetch,
    KeySource,
    NotAPerson,
    OidcClient,
    SignedCookies,
    SignInFailed,
    StaleSignIn,
    cookie_value,
)
from engram_memory.cloud.observability import get_logger, instrumented
from engram_memory.cloud.oidc import IssuerKeysUnavailable
from engram_memory.cloud.parked_approvals import (
    APPROVAL_ID_PATTERN,
    ENDED_WAIT_ERRORS,
    ParkedApproval,
    ParkedApprovalBook,
)
from engram_memory.cloud.proofs import MacKey, prove_on_page
from engram_memory.cloud.settings import (
    ApprovalSettings,
)
from engram_memory.engine.context import Scope
from engram_memory.engine.kernel import checked_record
from engram_memory.engine.ports import RecordKeys, StoreUnavailable, VaultUnavailable

APPROVALS_PATH: Final = "/approvals"
CALLBACK_PATH: Final = "/approvals/callback"
FETCH_TIMEOUT_S: Final = 5.0
MAX_DOCUMENT_BYTES: Final = 1_000_000
_APPROVAL_ID: Final = re.compile(APPROVAL_ID_PATTERN)


def https_fetch(context: ssl.SSLContext | None = None) -> Fetch:
    """GET a JSON document or POST a form to the identity provider, over verified HTTPS (the
    system's trust store; ``SSL_CERT_FILE`` as OpenSSL reads it). An error answer's JSON body
    is returned (the caller finds no ID token in it); an unreachable provider raises
    ``IssuerKeysUnavailable``."""
    tls = context or ssl.create_default_context()
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=tls))

    def fetch(url: str, form: Mapping[str, str] | None) -> Mapping[str, Any]:
        if urlsplit(url).scheme != "https":
            raise IssuerKeysUnavailable("the identity provider's endpoints must be https URLs")
        data = None if form is None else urlencode(dict(form)).encode()
        request = urllib.request.Request(  # noqa: S310 - https only, checked above
            url, data=data, headers={"Accept": "application/json"}
        )
        try:
            with opener.open(request, timeout=FETCH_TIMEOUT_S) as answer:
                raw = answer.read(MAX_DOCUMENT_BYTES)
        except urllib.error.HTTPError as refused:
            raw = refused.read(MAX_DOCUMENT_BYTES)
        except OSError as exc:
            raise IssuerKeysUnavailable("the identity provider is unreachable") from exc
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = None
        return loaded if isinstance(loaded, dict) else {}

    return fetch


def _view(parked: ParkedApproval, memory: Memory | None) -> ApprovalView:
    return ApprovalView.of(parked, memory, committed_by_run=True)  # the run commits it


class StoredMemories:
    """The memory a parked approval is about, from the canonical table (see the module doc).

    A forget's record body is sealed under its record key (``RecordKeys``): the page opens it
    as search and get do, with the record key class only, never a candidate's key.
    """

    def __init__(self, store: Any, record_keys: RecordKeys) -> None:
        self._store = store  # a DynamoStore
        self._record_keys = record_keys

    def __call__(self, parked: ParkedApproval) -> Memory | None:
        if parked.target is None:
            return None
        scope = Scope(parked.tenant_id, parked.workspace_id)
        if parked.tool == "forget":
            row = self._store.record_get(scope, parked.target)
            if row is None or row.body is None:
                return None
            try:
                opened = self._record_keys.open_many(scope, {row.record_id: row.body})
            except VaultUnavailable:
                raise StoreUnavailable("the record key store is unavailable") from None
            if row.record_id not in opened:
                return None  # its key is destroyed: the record is forgotten
            record = checked_record(row.record_id, opened[row.record_id], row.record_digest)
            return memory_from_record(record, digest=row.record_digest)
        if parked.tool == "withdraw":
            found = self._store.candidate_digest(scope, parked.target)
            if found is None or found[0] != parked.principal:
                return None
            return Memory(digest=found[1], components=(), citations=(), captured_at_ms=found[2])
        return None


class CloudDesk(QuestionDesk[ParkedApproval]):
    """The page's desk in the cloud: the credential is the session cookie's value."""

    def __init__(
        self,
        approvals: ParkedApprovalBook,
        sfn: Any,
        cookies: SignedCookies,
        csrf_key: bytes,
        memories: Callable[[ParkedApproval], Memory | None],
        proof_key: MacKey,
    ) -> None:
        super().__init__(csrf_key, "approval-form")
        self._approvals = approvals
        self._sfn = sfn
        self._cookies = cookies
        self._memories = memories
        self._proof_key = proof_key  # only this function may GenerateMac with it

    def question(self, approval_id: str, credential: str) -> ParkedApproval | PageError:
        approver = self._cookies.approver(credential)
        if approver is None:
            return PageError.SIGN_IN
        try:
            parked = self._approvals.get(approval_id)
        except StoreUnavailable:
            return PageError.UNAVAILABLE
        if parked is None:
            return PageError.NOT_FOUND
        if approver.subject != (parked.approver or parked.principal):
            return PageError.FORBIDDEN  # before anything else is said about the request
        if parked.used:
            return PageError.ANSWERED
        return parked

    def shown(self, question: ParkedApproval) -> ApprovalView | PageError:
        try:
            memory = self._memories(question)
        except StoreUnavailable:
            return PageError.UNAVAILABLE
        return _view(question, memory)

    def answer(
        self, approval_id: str, credential: str, decision: Decision, now_ms: int, code: str = ""
    ) -> DeskAnswer | PageError:
        # ``code`` is the embedded page's: here the signed-in person's session is the presence
        approver = self._cookies.approver(credential)
        if approver is None:
            return PageError.SIGN_IN
        try:
            taken = self._approvals.take(approval_id, now_ms)
        except StoreUnavailable:
            return PageError.UNAVAILABLE
        if taken is None or taken.task_token is None:
            return PageError.ANSWERED
        from botocore.exceptions import ClientError

        try:
            if decision is Decision.APPROVE:
                # the proof the run's commit verifies: only this function can make it
                proof = prove_on_page(self._proof_key, taken.approved(now_ms), approver.subject)
                self._sfn.send_task_success(
                    taskToken=taken.task_token, output=proof.model_dump_json()
                )
            else:
                self._sfn.send_task_failure(
                    taskToken=taken.task_token,
                    error="ApprovalDeclined",
                    cause="The human declined the operation.",
                )
        except ClientError as exc:
            if error_code(exc) in ENDED_WAIT_ERRORS:
                return PageError.EXPIRED  # the run stopped waiting (its 300 s ran out)
            raise
        except StoreUnavailable:  # the proof key unreachable: the token is spent, unanswered
            return PageError.UNAVAILABLE
        return DeskAnswer(_view(taken, None), decision)


@dataclass(frozen=True, slots=True)
class _Request:
    """The parts of an API Gateway HTTP API (payload 2.0) event the page reads."""

    method: str
    path: str
    approval_id: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    cookie_header: str
    body: bytes

    @classmethod
    def of(cls, event: Mapping[str, Any]) -> _Request:
        http = (event.get("requestContext") or {}).get("http") or {}
        headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
        # payload 2.0 moves the Cookie header into ``cookies``
        cookies = "; ".join(str(c) for c in event.get("cookies") or []) or headers.get("cookie", "")
        text = str(event.get("body") or "")
        body = base64.b64decode(text) if event.get("isBase64Encoded") else text.encode()
        return cls(
            method=str(http.get("method", "GET")).upper(),
            path=str(event.get("rawPath") or http.get("path") or ""),
            approval_id=str((event.get("pathParameters") or {}).get("approvalId", "")),
            query=dict(parse_qsl(str(event.get("rawQueryString") or ""))),
            headers=headers,
            cookie_header=cookies,
            body=body,
        )

    def form(self) -> dict[str, str]:
        """The posted form; none unless urlencoded and at most ``MAX_FORM_BYTES``."""
        if "application/x-www-form-urlencoded" not in self.headers.get("content-type", ""):
            return {}
        return read_form(self.body) or {}


def _response(page: PageResponse, cookies: list[str] | None = None) -> dict[str, Any]:
    """The page as the HTTP API's response (payload 2.0), with the cookies to set."""
    response: dict[str, Any] = {
        "statusCode": page.status,
        "headers": dict(page.headers),
        "body": page.html,
    }
    if cookies:
        response["cookies"] = cookies
    return response


def _error(error: PageError, cookies: list[str] | None = None) -> dict[str, Any]:
    return _response(error_page(error), cookies)


@dataclass
class ApprovalPageParts:
    """What the approval function is wired from (``composition.build_approval_page``)."""

    approvals: ParkedApprovalBook
    desk: CloudDesk
    cookies: SignedCookies
    signin: OidcClient
    origin: str


class ApprovalHandler:
    """The approval function: its cold-start singletons and the three routes.

    Tests set ``approvals``, ``sfn``, ``memories``, ``session_key``, ``fetch``/``keys`` and
    ``now_ms`` before the first invocation; ``build`` (the composition root's
    ``build_approval_page``, handed in by ``entry_points.approval_handler``) wires the rest from
    the environment.
    """

    def __init__(
        self,
        *,
        build: Callable[[ApprovalHandler, ApprovalSettings], ApprovalPageParts],
        env: Mapping[str, str] = os.environ,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._build_parts = build
        self.approvals: ParkedApprovalBook | None = None
        self.sfn: Any = None
        self.memories: Callable[[ParkedApproval], Memory | None] | None = None
        self.session_key: bytes | None = None
        self.fetch: Fetch | None = None
        self.keys: KeySource | None = None
        self.proof_key: MacKey | None = None
        self.now_ms = now_ms
        self._env = env
        self._parts: ApprovalPageParts | None = None
        self._lock = threading.Lock()
        self._entry = instrumented(self._handle)

    def _ready(self) -> ApprovalPageParts:
        with self._lock:
            if self._parts is None:
                self._parts = self._build_parts(self, ApprovalSettings.from_env(self._env))
            return self._parts

    def signed_cookies(self) -> SignedCookies:
        """The cookies this function signs and reads (what a sign-in sets, for tests)."""
        return self._ready().cookies

    def __call__(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._entry(event, context)
        return answer

    def _handle(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        parts = self._ready()
        request = _Request.of(event)
        if request.path == CALLBACK_PATH:
            return self._callback(parts, request)
        if not _APPROVAL_ID.match(request.approval_id):
            return _error(PageError.NOT_FOUND)
        session = cookie_value(request.cookie_header, SESSION_COOKIE) or ""
        if parts.cookies.approver(session) is None:
            return self._sign_in(parts, request)
        page_request = PageRequest.of(
            request.method,
            request.approval_id,
            session,
            f"{APPROVALS_PATH}/{request.approval_id}",
            headers=request.headers,
            form=request.form(),
        )
        page = handle_page(
            parts.desk, page_request, now_ms=self.now_ms(), allowed_origin=parts.origin
        )
        return _response(page)

    def _sign_in(self, parts: ApprovalPageParts, request: _Request) -> dict[str, Any]:
        """No session: a GET goes to the identity provider and comes back here; a POST (its
        session expired while the page was open) is told to open the link again."""
        if request.method != "GET":
            return _error(PageError.SIGN_IN)
        return _to_issuer(parts, f"{APPROVALS_PATH}/{request.approval_id}")

    def _callback(self, parts: ApprovalPageParts, request: _Request) -> dict[str, Any]:
        cleared = [SignedCookies.cleared(SIGNIN_COOKIE)]
        pending = parts.cookies.pending(cookie_value(request.cookie_header, SIGNIN_COOKIE))
        if request.method != "GET" or pending is None or "error" in request.query:
            return _error(PageError.SIGN_IN, cleared)
        return_to = pending.return_to
        if not return_to.startswith(APPROVALS_PATH + "/") or not _APPROVAL_ID.match(
            return_to.removeprefix(APPROVALS_PATH + "/")
        ):
            return _error(PageError.NOT_FOUND, cleared)
        try:
            signed_in = parts.signin.finish(
                code=request.query.get("code", ""),
                state=request.query.get("state", ""),
                pending=pending,
            )
        except StaleSignIn:
            if pending.forced:  # asked with prompt=login already: the provider ignores it too
                _refused("the provider reused an earlier sign-in after prompt=login")
                return _error(PageError.STALE_SIGN_IN, cleared)
            return _to_issuer(parts, return_to, force_login=True)  # its cookie replaces this one
        except NotAPerson as refused:
            _refused(str(refused))
            return _error(PageError.NOT_A_PERSON, cleared)
        except SignInFailed:
            return _error(PageError.SIGN_IN, cleared)
        except IssuerKeysUnavailable:
            return _error(PageError.UNAVAILABLE, cleared)
        session = parts.cookies.session_cookie(signed_in)
        return _response(PageResponse(200, render_signed_in(return_to)), [*cleared, session])


def _to_issuer(
    parts: ApprovalPageParts, return_to: str, *, force_login: bool = False
) -> dict[str, Any]:
    """A 302 to the identity provider's sign-in (``prompt=login`` with ``force_login``), with
    the pending sign-in's cookie."""
    try:
        url, pending = parts.signin.start(return_to, force_login=force_login)
    except (SignInFailed, IssuerKeysUnavailable):
        return _error(PageError.UNAVAILABLE)
    return _response(redirect(url), [parts.cookies.pending_cookie(pending)])


def _refused(reason: str) -> None:
    """A sign-in the page refused, for the operator: the constant reason, never a claim value."""
    get_logger().warning("approval sign-in refused", extra={"reason": reason})


__all__ = [
    "CALLBACK_PATH",
    "ApprovalHandler",
    "ApprovalPageParts",
    "CloudDesk",
    "StoredMemories",
    "https_fetch",
]

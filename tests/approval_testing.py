"""The cloud approval page (``functions/approval``) in tests without a browser.

``approval_page`` builds the handler over the given approval store and Step Functions client
with a known session key; ``answer`` is a person who is signed in as ``sub`` (a session cookie
signed with that key, as the sign-in callback sets it): they open the page, read its CSRF token
and press Approve or Decline. The sign-in itself is exercised against a real OIDC provider in
``tests/e2e/test_cloud_approval_browser.py`` and ``tests/integration/test_cloud_approval_page.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlencode

from aws_testing import BUCKET, KEY_TABLE, REGION, TABLE

from engram_memory.cloud.approval_page import ApprovalHandler, StoredMemories
from engram_memory.cloud.approver_signin import SignedIn
from engram_memory.cloud.composition import build_approval_page
from engram_memory.cloud.proofs import FixedMacKey, MacKey

BASE_URL: Final = "https://memory.example.com"
CLIENT_ID: Final = "engram-approvals"
RESOURCE: Final = "https://memory.example.com/mcp"
SESSION_KEY: Final = b"approval-session-key-for-tests-0123456789"
APPROVAL_ENV: Final = {
    "AWS_REGION": REGION,
    "ENGRAM_ISSUER": "https://issuer.example.com",
    "ENGRAM_APPROVAL_AUDIENCE": CLIENT_ID,
    "ENGRAM_RESOURCE_URI": RESOURCE,
    "ENGRAM_APPROVAL_BASE_URL": BASE_URL,
    "ENGRAM_TABLE": TABLE,
    "ENGRAM_BLOB_BUCKET": BUCKET,
    "ENGRAM_KEY_TABLE": KEY_TABLE,
    "ENGRAM_DATA_KEY_ARN": "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-000000000000",
    "ENGRAM_APPROVAL_SESSION_SECRET_ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:x",
    "ENGRAM_APPROVAL_PROOF_KEY_ARN": "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-0000000000aa",
}
# The approval proof key (a KMS HMAC key in the stack): only the page makes proofs with it.
PROOF_KEY: Final = FixedMacKey(b"approval-proof-key-for-tests-0123456789")
CSRF_RE: Final = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


@dataclass
class PageContext:
    """A Lambda context for the approval function."""

    function_name: str = "engram-dev-approval"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:engram-dev-approval"
    aws_request_id: str = "0b1c2d3e-4f50-4a61-8b72-93a4b5c6d7e8"

    def get_remaining_time_in_millis(self) -> int:
        return 29_000


@dataclass
class RecordedSfn:
    """Step Functions as the page answers it: each answer recorded (success, or the error)."""

    answers: list[str] = field(default_factory=list)

    def send_task_success(self, **kwargs: Any) -> None:
        self.answers.append("success")

    def send_task_failure(self, **kwargs: Any) -> None:
        self.answers.append(kwargs["error"])


def _unreachable(url: str, form: Mapping[str, str] | None) -> Mapping[str, Any]:
    raise AssertionError("this test signs in with a session cookie, not at the provider")


def approval_page(
    approvals: Any,
    sfn: Any,
    *,
    clients: Mapping[str, Any] | None = None,
    now_ms: Callable[[], int] | None = None,
    env: Mapping[str, str] = APPROVAL_ENV,
    data_key_arn: str | None = None,
    proof_key: MacKey = PROOF_KEY,
) -> ApprovalHandler:
    """The approval function's handler over moto (``clients``: dynamodb, s3 and kms, and the
    stack's ``data_key_arn``, for the memory shown; without them the page shows none)."""
    from engram_memory.adapters.aws.dynamo_store import DynamoStore
    from engram_memory.adapters.aws.kms_record_keys import KmsRecordKeys

    handler = ApprovalHandler(
        build=build_approval_page, env=env, **({"now_ms": now_ms} if now_ms else {})
    )
    handler.approvals = approvals
    handler.sfn = sfn
    handler.session_key = SESSION_KEY
    handler.proof_key = proof_key
    handler.fetch = _unreachable
    handler.keys = lambda kid: None
    handler.memories = (
        StoredMemories(
            DynamoStore(
                table_name=TABLE, bucket=BUCKET, dynamodb=clients["dynamodb"], s3=clients["s3"]
            ),
            KmsRecordKeys(
                kms_key_id=data_key_arn,
                key_table=KEY_TABLE,
                kms_client=clients["kms"],
                dynamodb_client=clients["dynamodb"],
            ),
        )
        if clients is not None and data_key_arn is not None
        else (lambda parked: None)
    )
    return handler


def page_event(
    approval_id: str,
    method: str = "GET",
    *,
    cookies: list[str] | None = None,
    form: Mapping[str, str] | None = None,
    origin: str | None = BASE_URL,
    path: str | None = None,
    query: str = "",
) -> dict[str, Any]:
    """An API Gateway HTTP API (payload 2.0) event for the approval routes."""
    route = path or f"/approvals/{approval_id}"
    headers: dict[str, str] = {"host": BASE_URL.removeprefix("https://")}
    if form is not None:
        headers["content-type"] = "application/x-www-form-urlencoded"
    if origin is not None and method == "POST":
        headers["origin"] = origin
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": f"{method} {route if path else '/approvals/{approvalId}'}",
        "rawPath": route,
        "rawQueryString": query,
        "headers": headers,
        "requestContext": {"http": {"method": method, "path": route}},
        "isBase64Encoded": False,
        "body": urlencode(dict(form)) if form is not None else "",
    }
    if path is None:
        event["pathParameters"] = {"approvalId": approval_id}
    if cookies:
        event["cookies"] = cookies
    return event


def session_of(handler: ApprovalHandler, sub: str) -> str:
    """The ``name=value`` of the session cookie a person's sign-in as ``sub`` sets (just now)."""
    signed_in = SignedIn(sub, auth_time=handler.now_ms() // 1000)
    return handler.signed_cookies().session_cookie(signed_in).split(";", 1)[0]


def csrf_of(page: Mapping[str, Any]) -> str:
    found = CSRF_RE.search(str(page.get("body", "")))
    assert found is not None, page.get("body")
    return found.group(1)


def answer(
    handler: ApprovalHandler, approval_id: str, decision: str, *, sub: str
) -> dict[str, Any]:
    """``sub``, signed in, opens the page and presses ``decision`` (approve | decline); the
    POST's answer (or the page's refusal, when it did not show the buttons)."""
    cookies = [session_of(handler, sub)]
    page: dict[str, Any] = handler(page_event(approval_id, cookies=cookies), PageContext())
    if page["statusCode"] != 200:
        return page
    form = {"csrf_token": csrf_of(page), "decision": decision}
    posted: dict[str, Any] = handler(
        page_event(approval_id, "POST", cookies=cookies, form=form), PageContext()
    )
    return posted


def outcome(response: Mapping[str, Any]) -> str | None:
    """The page's ``data-decision`` (answered) or ``data-error`` (refused)."""
    found = re.search(r'data-(?:decision|error)="([a-z_]+)"', str(response.get("body", "")))
    return found.group(1) if found else None

"""URL-mode confirmations: ``GET /approvals/{approvalId}`` shows the operation (no content);
``POST /approvals/{approvalId}`` with ``{"approve": true|false}`` (JSON or form) from the
signed-in human answers the parked Step Functions task token, once.

404 for an unknown id, 410 for one already answered or past its 300 s, 403 when the signed-in
human is not the principal the operation belongs to.
"""

from __future__ import annotations

import base64
import html
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from ..observability import instrumented
from .approvals import (
    ENDED_WAIT_ERRORS,
    ApprovalStore,
    ParkedApproval,
)
from .settings import ApprovalSettings, client_config


def _response(status: int, body: str, content_type: str = "application/json") -> dict[str, Any]:
    return {
        "statusCode": status,
        "headers": {
            "content-type": content_type,
            "cache-control": "no-store",
            "x-frame-options": "DENY",
            "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'",
        },
        "body": body,
    }


def _json(status: int, value: Mapping[str, Any]) -> dict[str, Any]:
    return _response(status, json.dumps(value))


def _page(parked: ParkedApproval) -> str:
    rows = [
        ("Operation", parked.tool),
        ("Target", parked.target or "-"),
        ("Reason", parked.reason_ref or "-"),
        ("Scope", f"{parked.tenant_id} / {parked.workspace_id}"),
        ("Requested by", parked.principal),
    ]
    cells = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{html.escape(value)}</td></tr>"
        for name, value in rows
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Approve operation</title></head>"
        f"<body><h1>Confirm {html.escape(parked.tool)}</h1><table>{cells}</table>"
        "<p>Answer within 5 minutes of the request.</p></body></html>"
    )


def _answer(event: Mapping[str, Any]) -> bool | None:
    body = event.get("body") or ""
    if event.get("isBase64Encoded"):
        body = base64.b64decode(body).decode("utf-8")
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    if "application/x-www-form-urlencoded" in headers.get("content-type", ""):
        values = parse_qs(body).get("approve", [])
        return {"true": True, "false": False}.get(values[0].lower()) if values else None
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    answer = decoded.get("approve") if isinstance(decoded, dict) else None
    return answer if isinstance(answer, bool) else None


def _agent_token(claims: Mapping[str, Any], resource: str) -> bool:
    """Does the token's ``aud`` include the MCP resource URI (an agent's token)?

    API Gateway passes a list claim as one string, ``"[a b]"``; a single audience as ``"a"``.
    """
    raw = claims.get("aud", "")
    audiences = raw if isinstance(raw, list) else str(raw).strip("[]").split()
    return bool(resource) and resource in [str(a) for a in audiences]


class ApprovalHandler:
    """The cold-start singletons (``approvals``, ``sfn``) and the two routes."""

    def __init__(
        self,
        *,
        env: Mapping[str, str] = os.environ,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.settings: ApprovalSettings | None = None
        self.approvals: ApprovalStore | None = None
        self.sfn: Any = None
        self.now_ms = now_ms
        self._env = env
        self._lock = threading.Lock()
        self._entry = instrumented(self._handle)

    def _ready(self) -> tuple[ApprovalStore, Any]:
        with self._lock:
            if self.settings is None:
                self.settings = ApprovalSettings.from_env(self._env)
            if self.approvals is None or self.sfn is None:
                session = self.settings.session()
                self.approvals = self.approvals or ApprovalStore(
                    session.client("dynamodb", config=client_config()), self.settings.table
                )
                self.sfn = self.sfn or session.client("stepfunctions", config=client_config())
            return self.approvals, self.sfn

    def __call__(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._entry(event, context)
        return answer

    def _handle(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        approvals, sfn = self._ready()
        approval_id = str((event.get("pathParameters") or {}).get("approvalId", ""))
        method = str(event.get("requestContext", {}).get("http", {}).get("method", "GET"))
        parked = approvals.get(approval_id) if approval_id.startswith("apr_") else None
        if parked is None:
            return _json(404, {"error": "unknown approval"})
        if parked.used or parked.expired(self.now_ms()):
            return _json(410, {"error": "approval already answered or expired"})
        if method == "GET":
            return _response(200, _page(parked), "text/html; charset=utf-8")
        if method != "POST":
            return _json(405, {"error": "method not allowed"})
        claims = (
            event.get("requestContext", {}).get("authorizer", {}).get("jwt", {}).get("claims", {})
        )
        if not claims.get("sub"):
            return _json(401, {"error": "sign in to answer"})
        if claims["sub"] != parked.principal:
            return _json(403, {"error": "not the principal of this operation"})
        assert self.settings is not None
        if _agent_token(claims, self.settings.resource_uri):
            # the JWT authorizer checks the approval audience; this is the second lock on the
            # door: a token also valid for the MCP endpoint is an agent's, never a human's answer
            return _json(403, {"error": "sign in to the approval page; agent tokens cannot answer"})
        approve = _answer(event)
        if approve is None:
            return _json(400, {"error": 'send {"approve": true} or {"approve": false}'})
        now = self.now_ms()
        taken = approvals.take(approval_id, now)
        if taken is None or taken.task_token is None:
            return _json(410, {"error": "approval already answered"})
        from botocore.exceptions import ClientError

        try:
            if approve:
                approval = taken.approved(now)  # the binding alone: no task token in the output
                sfn.send_task_success(taskToken=taken.task_token, output=approval.model_dump_json())
            else:
                sfn.send_task_failure(
                    taskToken=taken.task_token,
                    error="ApprovalDeclined",
                    cause="The human declined the operation.",
                )
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if (
                code in ENDED_WAIT_ERRORS
            ):  # the run stopped waiting (its 300 s ran out, or it ended)
                return _json(410, {"error": "approval expired"})
            raise
        status = "approved" if approve else "declined"
        return _json(200, {"approval_id": approval_id, "status": status})

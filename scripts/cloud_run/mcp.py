"""The MCP client side of the flow: API Gateway HTTP API v2 events to the built adapter, and the
waits on the state machines those requests start."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import uuid
from typing import Any

from .harness import Harness
from .settings import REGION, sample

CLASSIC: str = "2025-11-25"  # URL-mode elicitation (-32042)
MODERN: str = "2026-07-28"  # form-mode confirmation (inputRequests / requestState)
APPROVE = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
DECLINE = {"engram_confirmation": {"action": "accept", "content": {"decision": "decline"}}}


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def capture_arguments(text: str, key: str) -> dict[str, Any]:
    """events/capture.json's arguments with another text (and the digests that go with it)."""
    arguments: dict[str, Any] = sample("capture.json")["arguments"]
    payload = arguments["payload"]
    payload["components"][0]["text"] = text
    payload["citations"][0]["content_digest"] = _sha(text)
    arguments["evidence"]["evidence_digest"] = _sha("evidence:" + text)
    arguments["idempotency_key"] = key
    return arguments


def value(answer: Any) -> Any:
    """The use case's value in a tools/call answer (KeyError/TypeError when there is none)."""
    return answer["result"]["structuredContent"]["output"]["value"]


def structured(answer: Any) -> dict[str, Any]:
    """The tools/call answer's structured content ({} when there is none)."""
    found: dict[str, Any] = answer.get("result", {}).get("structuredContent", {})
    return found


def receipt_state(answer: Any) -> str | None:
    """The state a transition's receipt reports (None when there is no receipt)."""
    receipt = (structured(answer).get("output") or {}).get("value", {}).get("receipt", {})
    state: str | None = receipt.get("to_state")
    return state


def search_hits(answer: Any) -> tuple[list[str], str]:
    """The record ids a search answered through the adapter, and a word on the outcome."""
    content = (answer.get("result") or {}).get("structuredContent") or {}
    if content.get("ok") is not True:
        code = (content.get("error") or {}).get("code") or json.dumps(answer)[:200]
        return [], f"error {code}"
    records = content["output"]["value"].get("records") or []
    ids = [str(packet["record"]["record_id"]) for packet in records]
    return ids, f"ok, {len(ids)} hit(s)"


def mcp(
    h: Harness,
    body: dict[str, Any],
    *,
    protocol: str,
    headers: dict[str, str] | None = None,
    confirm: tuple[str, ...] = (),
) -> tuple[int, Any]:
    """One JSON-RPC request to the built adapter, through the API's default endpoint, with a
    fresh token (whose ``engram_confirm`` lists ``confirm``)."""
    event = sample("mcp_adapter_tools_call.json")
    event["headers"]["authorization"] = f"Bearer {h.issuer.token(confirm=confirm)}"
    event["headers"]["mcp-protocol-version"] = protocol
    event["headers"].update(headers or {})
    # through the API's default endpoint: the adapter must accept its execute-api Host
    api_host = f"{event['requestContext']['apiId']}.execute-api.{REGION}.amazonaws.com"
    event["headers"]["host"] = api_host
    event["requestContext"]["domainName"] = api_host
    event["requestContext"]["requestId"] = uuid.uuid4().hex
    event["body"] = json.dumps(body)
    h.tally.mcp_requests += 1
    answer = h.worker("McpAdapterFunction").invoke(event)
    if "error" in answer:
        return 599, answer["error"]
    result = answer["result"]
    text = result.get("body") or "null"
    if result.get("isBase64Encoded"):
        text = base64.b64decode(text).decode()
    return int(result["statusCode"]), json.loads(text)


def call(h: Harness, tool: str, arguments: dict[str, Any], **params: Any) -> Any:
    """tools/call at 2025-11-25: the answer's JSON-RPC body."""
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": f"engram_memory_{tool}", "arguments": arguments, **params},
    }
    return mcp(h, body, protocol=CLASSIC)[1]


def modern_call(
    h: Harness, tool: str, arguments: dict[str, Any], confirm: tuple[str, ...] = (), **extra: Any
) -> Any:
    """tools/call at 2026-07-28 (a client that can answer a form): the answer's JSON-RPC body."""
    body = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {
            "name": f"engram_memory_{tool}",
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
            },
            **extra,
        },
    }
    headers = {"mcp-method": "tools/call", "mcp-name": f"engram_memory_{tool}"}
    return mcp(h, body, protocol=MODERN, headers=headers, confirm=confirm)[1]


def confirm_in_form_mode(
    h: Harness,
    tool: str,
    arguments: dict[str, Any],
    answer: dict[str, Any] = APPROVE,
    confirm: tuple[str, ...] = (),
) -> Any | None:
    """``tool`` at 2026-07-28: the adapter must ask for a form confirmation, the human answers
    in the client (``APPROVE`` or ``DECLINE``); the second answer (None when the first did not
    ask, reported)."""
    asked = modern_call(h, tool, arguments, confirm).get("result", {})
    if not h.report.check(
        "requestState" in asked and "engram_confirmation" in asked.get("inputRequests", {}),
        f"flow: {tool} ({MODERN}) asks for a form confirmation",
    ):
        print(f"       {json.dumps(asked)[:400]}")
        return None
    return modern_call(
        h, tool, arguments, confirm, inputResponses=answer, requestState=asked["requestState"]
    )


def capture(h: Harness, text: str, key: str) -> str | None:
    """A candidate captured with ``text``: its id (None when capture failed, reported)."""
    captured = call(h, "capture", capture_arguments(text, key))
    try:
        candidate_id = str(value(captured)["candidate_id"])
    except (KeyError, TypeError):
        h.report.check(False, f"flow: capture -> {json.dumps(captured)[:300]}")
        return None
    return candidate_id


def admit(
    h: Harness, candidate_id: str, key: str, arguments: dict[str, Any] | None = None
) -> tuple[str, str] | None:
    """request_admission of the candidate: the record's id ('' when none was made) and the
    outcome's status (None when the answer has no outcome, reported)."""
    admitted = call(
        h,
        "request_admission",
        {**(arguments or {}), "candidate_id": candidate_id, "idempotency_key": key},
    )
    try:
        outcome_ = value(admitted)["outcome"]
        return str(outcome_.get("record_id", "")), str(outcome_["status"])
    except (KeyError, TypeError):
        h.report.check(False, f"flow: request_admission -> {json.dumps(admitted)[:300]}")
        return None


def running_executions(h: Harness) -> set[str]:
    machines = [h.stack.refs[m] for m in ("WithdrawStateMachine", "ForgetStateMachine")]
    return {
        str(e["name"])
        for arn in machines
        for e in h.sfn.list_executions(stateMachineArn=arn)["executions"]
        if e["status"] == "RUNNING"
    }


# -- the state machines ----------------------------------------------------------------------------


def wait_quiet(h: Harness, timeout_s: float = 60.0) -> None:
    """Until no execution of either state machine is running (their tails have run), but those
    a declined form confirmation left waiting (``Harness.abandoned``)."""
    until = time.monotonic() + timeout_s
    machines = [h.stack.refs[m] for m in ("WithdrawStateMachine", "ForgetStateMachine")]
    while time.monotonic() < until:
        running = [
            e
            for arn in machines
            for e in h.sfn.list_executions(stateMachineArn=arn)["executions"]
            if e["status"] == "RUNNING" and e["name"] not in h.abandoned
        ]
        if not running:
            return
        time.sleep(0.2)
    names = ", ".join(str(e["name"])[:24] for e in running)
    print(f"  (still running after {timeout_s:.0f} s: {names})")


def wait_execution(h: Harness, machine: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The newest execution of ``machine`` once it is no longer running (or the time is up)."""
    arn = h.stack.refs[machine]
    until = time.monotonic() + timeout_s
    while True:
        executions = h.sfn.list_executions(stateMachineArn=arn)["executions"]
        if executions:
            described: dict[str, Any] = h.sfn.describe_execution(
                executionArn=executions[0]["executionArn"]
            )
            if described["status"] != "RUNNING":
                return described
            if time.monotonic() > until:
                print(f"  (still running after {timeout_s:.0f} s: {described['name'][:24]})")
                return described
        elif time.monotonic() > until:
            return {"status": "NOT_STARTED"}
        time.sleep(0.2)

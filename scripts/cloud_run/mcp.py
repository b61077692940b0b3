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
    h: Harness, body: dict[str, Any], *, protocol: str, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One JSON-RPC request to the built adapter, through the API's default endpoint."""
    event = sample("mcp_adapter_tools_call.json")
    event["headers"]["authorization"] = f"Bearer {h.issuer.token()}"
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


def modern_call(h: Harness, tool: str, arguments: dict[str, Any], **extra: Any) -> Any:
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
    return mcp(h, body, protocol=MODERN, headers=headers)[1]


def confirm_in_form_mode(h: Harness, tool: str, arguments: dict[str, Any]) -> Any | None:
    """``tool`` at 2026-07-28: the adapter must ask for a form confirmation, the human approves
    in the client; the second answer (None when the first did not ask, reported)."""
    asked = modern_call(h, tool, arguments).get("result", {})
    if not h.report.check(
        "requestState" in asked and "engram_confirmation" in asked.get("inputRequests", {}),
        f"flow: {tool} ({MODERN}) asks for a form confirmation",
    ):
        print(f"       {json.dumps(asked)[:400]}")
        return None
    return modern_call(
        h, tool, arguments, inputResponses=APPROVE, requestState=asked["requestState"]
    )


# -- the state machines ----------------------------------------------------------------------------


def wait_quiet(h: Harness, timeout_s: float = 60.0) -> None:
    """Until no execution of either state machine is running (their tails have run)."""
    until = time.monotonic() + timeout_s
    machines = [h.stack.refs[m] for m in ("WithdrawStateMachine", "ForgetStateMachine")]
    while time.monotonic() < until:
        running = [
            e
            for arn in machines
            for e in h.sfn.list_executions(stateMachineArn=arn)["executions"]
            if e["status"] == "RUNNING"
        ]
        if not running:
            return
        time.sleep(0.2)


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
            if described["status"] != "RUNNING" or time.monotonic() > until:
                return described
        elif time.monotonic() > until:
            return {"status": "NOT_STARTED"}
        time.sleep(0.2)

"""One message per code on the cloud host: the MCP adapter Lambda in front of the six tool
functions, on moto (the adapter's harness: tests/integration/test_mcp_adapter_lambda.py).

The same invalid calls as the embedded host's (``invalid_inputs``; tests/e2e/
test_constant_messages.py) answer the same codes with the same one message per code; the tool
functions' audit lines name the field and the rule, never a value; a function's -32603 reaches
the client with the constant message and its ``data``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from invalid_inputs import SECRETISH, Answers, invalid_cases, valid_arguments
from test_mcp_adapter_lambda import Adapter, adapter, remembered_then_forget
from test_tool_handlers import cloud, output

from engram_memory.cloud.observability import AUDIT_MESSAGE

__all__ = ["adapter", "cloud", "output"]  # the fixtures, re-used

PURPOSE = "purpose:general"  # the adapter's tokens bind it


def _error(answer: dict[str, Any]) -> tuple[int, str, Any]:
    error = answer["error"]
    return error["code"], error["message"], error.get("data")


def test_every_invalid_input_to_every_tool_answers_its_codes_one_message(
    adapter: Adapter, output: Callable[[], list[dict[str, Any]]]
) -> None:
    answers = Answers()
    audited: dict[str, Any] = {}
    for case in invalid_cases(PURPOSE):
        answer = adapter.call(case.tool, case.arguments)
        envelope = answer["result"]["structuredContent"]
        assert json.loads(answer["result"]["content"][0]["text"]) == envelope
        answers.took_envelope(case, envelope)
        audited[envelope["auditId"]] = case
    valid = valid_arguments("purpose:another-one")
    for tool in ("search", "get", "capture"):
        code, message, data = _error(adapter.call(tool, valid[tool]))
        assert data == {"reason": "purpose_mismatch"}, data
        answers.took_error(code, message, data)
    answers.took_error(*_error(adapter.call("delete_all", {})))
    answers.check()
    assert set(answers.envelope) == {"INVALID_SCHEMA", "INVALID_DIGEST"}
    assert set(answers.jsonrpc) == {-32603, -32602}

    lines = {
        line["audit_id"]: line
        for line in output()
        if line.get("message") == AUDIT_MESSAGE and line.get("audit_id") in audited
    }
    assert set(lines) == set(audited)
    for audit_id, case in audited.items():
        line = lines[audit_id]
        assert (line["tool"], line["code"]) == (case.tool, case.code)
        assert SECRETISH not in json.dumps(line) and "Q" * 10 not in json.dumps(line)
        if case.code == "INVALID_SCHEMA":
            pointer = line["violation"]["pointer"]
            assert case.where.startswith(pointer) or pointer.startswith(case.where), case


@pytest.mark.parametrize(
    ("sent", "received"),
    [
        ({"reason": "purpose_mismatch"}, {"reason": "purpose_mismatch"}),
        ({"reason": "tenant_mismatch", "page": "https://x"}, {"reason": "tenant_mismatch"}),
        ({"reason": "made_up"}, {"reason": "internal_error"}),
        (None, {"reason": "internal_error"}),
        (
            {
                "reason": "no_elicitation",
                "approval_id": "apr_1",
                "approve_with": "/srv/.venv/bin/engram-memory approvals approve apr_1",
                "page": 7,
                "extra": "x",
            },
            {"reason": "no_elicitation", "approval_id": "apr_1"},
        ),
        (
            {"reason": "no_elicitation", "page": "/srv/approvals/apr_1"},
            {"reason": "no_elicitation"},
        ),
        (
            {"reason": "no_elicitation", "page": "https://m.example.com/approvals/apr_1"},
            {"reason": "no_elicitation", "page": "https://m.example.com/approvals/apr_1"},
        ),
    ],
)
def test_a_functions_refusal_reaches_the_client_with_the_constant_message_and_checked_data(
    adapter: Adapter, sent: Any, received: dict[str, str]
) -> None:
    """A tool function's -32603 crosses the adapter with the code's message and its ``data``
    checked against the closed set: no made-up reason or key, no path, nothing but strings."""

    def refuse(function: str, payload: dict[str, Any]) -> dict[str, Any]:
        error = {"code": -32603, "message": "made up", **({"data": sent} if sent else {})}
        body = json.dumps({"protocol_error": error}).encode()
        return {"StatusCode": 200, "Payload": io.BytesIO(body)}

    adapter.lam.override = refuse
    answer = adapter.call("search", valid_arguments(PURPOSE)["search"])
    assert answer["error"] == {
        "code": -32603,
        "message": "Trusted invocation context unavailable",
        "data": received,
    }


def test_a_forget_from_a_client_that_cannot_ask_is_minus_32603_with_its_reason(
    adapter: Adapter,
) -> None:
    """A stateless 2025-11-25 request declares no elicitation: the adapter cannot ask anyone,
    and says why in ``data`` (a function composed without a state machine opens no page)."""
    _, forget = remembered_then_forget(adapter, "A note nobody can confirm forgetting.", "nochan")
    answer = adapter.call("forget", forget)
    assert answer["error"] == {
        "code": -32603,
        "message": "Trusted invocation context unavailable",
        "data": {"reason": "no_elicitation"},
    }

"""One message per code on the embedded host, through the official ``mcp`` client.

Hundreds of invalid calls (every kind of violation at every field of the six tools:
``invalid_inputs``) answer ``INVALID_SCHEMA`` or ``INVALID_DIGEST`` with the code's one constant
message and a closed error object; the audit line names the field and the rule, never a value.
Protocol refusals carry ``-32603``'s and ``-32602``'s one message; what helps is in ``data``.
The cloud runs the same cases (tests/integration/test_constant_messages_cloud.py).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest
from invalid_inputs import SECRETISH, Answers, invalid_cases, one_per_kind, valid_arguments
from mcp import MCPError

from engram_memory.mcp_surface.catalog import TOOL_NAMES

from e2e_support import (
    FORGET,
    MODERN,
    REVISIONS,
    SEARCH,
    TRUSTED_CONTEXT_UNAVAILABLE,
    WITHDRAW,
    Agent,
    HttpService,
    StdioHome,
    envelope,
    new_agent,
    new_workspace,
    protocol_error,
    stdio_client_for,
)

pytestmark = pytest.mark.anyio

NOTE = "Release branches are cut on Mondays; hotfixes go to the latest release branch only."


async def _refusals(agent: Agent, answers: Answers) -> None:
    """The protocol refusals a client can provoke: another purpose, a tool that is not one."""
    valid = valid_arguments("purpose:another-one")
    for tool in ("search", "get", "capture"):
        error = await protocol_error(partial(agent.client.call_tool, TOOL_NAMES[tool], valid[tool]))
        assert error.data == {"reason": "purpose_mismatch"}, error.data
        answers.took_error(error.code, error.message, error.data)
    error = await protocol_error(lambda: agent.client.call_tool("engram_memory_delete_all", {}))
    answers.took_error(error.code, error.message, error.data)


@pytest.mark.parametrize("mode", REVISIONS)
async def test_every_invalid_input_to_every_tool_answers_its_codes_one_message(
    http_service: HttpService, mode: str
) -> None:
    answers = Answers()
    async with new_agent(http_service, mode) as agent:
        cases = invalid_cases(agent.purpose)
        if mode == MODERN:  # the same server code: one case of each kind is enough
            cases = one_per_kind(cases)
        audited: dict[str, Any] = {}
        for case in cases:
            env = envelope(await agent.client.call_tool(TOOL_NAMES[case.tool], case.arguments))
            answers.took_envelope(case, env)
            audited[env["auditId"]] = case
        await _refusals(agent, answers)
    answers.check()
    assert set(answers.envelope) == {"INVALID_SCHEMA", "INVALID_DIGEST"}
    assert set(answers.jsonrpc) == {-32603, -32602}
    assert {case.tool for case in cases} == set(TOOL_NAMES)
    lines = http_service.audit_of(set(audited))
    for audit_id, case in audited.items():
        line = lines[audit_id]
        assert (line["tool"], line["code"], line["ok"]) == (case.tool, case.code, False)
        assert SECRETISH not in json.dumps(line) and "Q" * 10 not in json.dumps(line)
        if case.code == "INVALID_DIGEST":
            continue
        violation = line["violation"]  # the field and the rule, for the operator
        assert set(violation) == {"pointer", "rule", "says", "more"}, line
        # the field, an object that holds it, or (an extra field) a field inside it
        pointer = violation["pointer"]
        assert case.where.startswith(pointer) or pointer.startswith(case.where), (case, pointer)
        if case.kind == "secret-looking extra field":
            assert pointer.endswith("/(a name not shown)"), pointer


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_client_without_elicitation_gets_the_route_in_data_and_never_a_path(
    stdio_home: StdioHome, mode: str
) -> None:
    """The stdio server runs from the venv's absolute path, as a desktop host starts it: the
    -32603 still names the bare program, in ``data``, and its message is the constant one."""
    token = stdio_home.tokens.mint(workspace=new_workspace())
    async with stdio_client_for(stdio_home, token, mode, human=None) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        candidate_id = await agent.captured("A pending note the agent wants gone.")
        for tool, arguments in (
            (FORGET, agent.forget_arguments(record_id)),
            (WITHDRAW, agent.withdraw_arguments(candidate_id)),
        ):
            error = await protocol_error(partial(client.call_tool, tool, arguments))
            assert isinstance(error, MCPError)
            assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
            assert error.message == "Trusted invocation context unavailable"
            data = error.data
            assert set(data) == {"reason", "approval_id", "approve_with"}  # stdio: no page
            assert data["reason"] == "no_elicitation"
            assert data["approval_id"].startswith("apr_")
            assert data["approve_with"] == f"engram-memory approvals approve {data['approval_id']}"
            assert "/" not in data["approve_with"]
        # nothing changed: the question waits for a person
        found = await client.call_tool(
            SEARCH, {"query": "release branches", "purpose_ref": agent.purpose}
        )
        assert record_id in json.dumps(envelope(found))

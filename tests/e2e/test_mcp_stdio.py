"""The official ``mcp`` client drives ``engram-memory serve --stdio`` (a real subprocess).

The token comes from ``ENGRAM_TOKEN``; stdout carries only the protocol and every banner goes to
stderr. Each test connection launches its own server process over a shared data directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from e2e_support import (
    CALL_DEADLINE_S,
    LEGACY,
    REVISIONS,
    SEARCH,
    TRUSTED_CONTEXT_UNAVAILABLE,
    Agent,
    Human,
    StdioHome,
    engram_cli,
    error_code,
    new_workspace,
    ok_value,
    protocol_error,
    stdio_client_for,
)
from engram_testing import initialize_request

pytestmark = pytest.mark.anyio

NOTE = "Fact: the nightly backup job copies engram.db only; candidate keys never leave the host."


@pytest.mark.parametrize("mode", REVISIONS)
async def test_an_agent_on_stdio_walks_the_lifecycle_and_the_human_decides_each_change(
    stdio_home: StdioHome, mode: str
) -> None:
    token = stdio_home.tokens.mint(workspace=new_workspace())
    human = Human("accept")
    async with stdio_client_for(stdio_home, token, mode, human=human) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        assert await agent.found("nightly backup job") == [record_id]
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id

        human.action = "decline"
        assert error_code(await agent.forget(record_id)) == "gate_failed"
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id

        human.action = "accept"
        assert ok_value(await agent.forget(record_id))["receipt"]["to_state"] == "tombstoned"
        assert await agent.found("nightly backup job") == []
        assert error_code(await agent.get(record_id)) == "NOT_FOUND"

        candidate_id = await agent.captured("A draft about the backup window, kept by mistake.")
        withdrawn = ok_value(await agent.withdraw(candidate_id))
        assert withdrawn["receipt"]["to_state"] == "withdrawn"
        assert error_code(await agent.admit(candidate_id)) == "NOT_FOUND"
        assert len(human.asked) == 3
        # stdio serves no approval page: the form points at the terminal, never at a dead link
        assert all("http://" not in message for message in human.asked)
        assert all("engram-memory approvals approve apr_" in message for message in human.asked)


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_stdio_client_without_elicitation_is_refused_with_32603_for_gated_tools(
    stdio_home: StdioHome, mode: str
) -> None:
    token = stdio_home.tokens.mint(workspace=new_workspace())
    async with stdio_client_for(stdio_home, token, mode, human=None) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        error = await protocol_error(lambda: agent.forget(record_id))
        assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
        assert error.message == "Trusted invocation context unavailable"
        # the human's route is in data: the terminal's command, no page (stdio serves none)
        data = error.data
        assert data["reason"] == "no_elicitation"
        assert data["approve_with"] == f"engram-memory approvals approve {data['approval_id']}"
        assert "page" not in data
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


@pytest.mark.parametrize("mode", REVISIONS)
async def test_without_engram_token_stdio_lists_no_tools_refuses_calls_and_says_why_on_stderr(
    stdio_home: StdioHome, mode: str
) -> None:
    log_path = stdio_home.stderr_log()
    with log_path.open("w", encoding="utf-8") as log:
        async with stdio_client_for(stdio_home, None, mode, errlog=log) as client:
            assert (await client.list_tools()).tools == []
            error = await protocol_error(
                lambda: client.call_tool(SEARCH, {"query": "x", "purpose_ref": "general"})
            )
            assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
            assert error.message == "Trusted invocation context unavailable"
            assert error.data == {"reason": "missing_token"}
    assert "ENGRAM_TOKEN is not set" in log_path.read_text(encoding="utf-8")


async def test_an_invalid_engram_token_on_stdio_lists_no_tools_and_refuses_calls(
    stdio_home: StdioHome,
) -> None:
    async with stdio_client_for(stdio_home, "not-a-jwt", LEGACY) as client:
        assert (await client.list_tools()).tools == []
        error = await protocol_error(
            lambda: client.call_tool(SEARCH, {"query": "x", "purpose_ref": "general"})
        )
        assert error.code == TRUSTED_CONTEXT_UNAVAILABLE


async def test_stdout_carries_only_json_rpc_messages_and_banners_go_to_stderr(
    stdio_home: StdioHome,
) -> None:
    """Speak the 2025-11-25 protocol by hand and look at every byte the server writes."""
    token = stdio_home.tokens.mint(workspace=new_workspace(), tools=["search"])
    requests: list[dict[str, Any]] = [
        initialize_request("raw-e2e"),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": SEARCH, "arguments": {"query": "backup", "purpose_ref": "x"}},
        },
    ]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")}
    command = [engram_cli(), "serve", "--stdio", "--data-dir", str(stdio_home.data_dir)]
    replies: dict[int, dict[str, Any]] = {}
    with anyio.fail_after(CALL_DEADLINE_S):
        async with await anyio.open_process(command, env=env | {"ENGRAM_TOKEN": token}) as proc:
            assert proc.stdin is not None and proc.stdout is not None
            stdout = BufferedByteReceiveStream(proc.stdout)
            for request in requests:
                await proc.stdin.send(json.dumps(request).encode() + b"\n")
                if "id" not in request:
                    continue
                while request["id"] not in replies:
                    line = await stdout.receive_until(b"\n", 4 * 1024 * 1024)
                    message = json.loads(line)  # anything but JSON-RPC here would break clients
                    assert message["jsonrpc"] == "2.0", message
                    if "id" in message:
                        replies[message["id"]] = message
            await proc.stdin.aclose()
            rest = await _read_all(stdout)
            assert await proc.wait() == 0
    for line in rest.splitlines():
        assert json.loads(line)["jsonrpc"] == "2.0"
    assert replies[1]["result"]["serverInfo"]["name"] == "engram-memory"
    assert [tool["name"] for tool in replies[2]["result"]["tools"]] == [SEARCH]
    assert replies[3]["error"] == {  # purpose mismatch
        "code": TRUSTED_CONTEXT_UNAVAILABLE,
        "message": "Trusted invocation context unavailable",
        "data": {"reason": "purpose_mismatch"},
    }


async def test_the_missing_token_warning_goes_to_stderr_not_stdout(stdio_home: StdioHome) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")}
    command = [engram_cli(), "serve", "--stdio", "--data-dir", str(stdio_home.data_dir)]
    with anyio.fail_after(CALL_DEADLINE_S):
        done = await anyio.run_process(command, input=b"", env=env, check=False)
    assert done.returncode == 0
    assert done.stdout == b""
    assert b"ENGRAM_TOKEN is not set" in done.stderr


async def _read_all(stream: BufferedByteReceiveStream) -> bytes:
    chunks = []
    try:
        while True:
            chunks.append(await stream.receive())
    except (anyio.EndOfStream, anyio.ClosedResourceError):
        return b"".join(chunks)

"""The wire, end to end: names, JSON-RPC envelopes, JSON the contract refuses, Host and Origin,
token time, and confirmation states — as a client (or an attacker) actually sends them.

- Only the six ``engram_memory_*`` names run a tool; a bare grant name is ``-32602`` (§1).
- A body that is not one JSON-RPC object (a batch, a scalar, a missing field) is ``-32600``
  with a constant message: no model names, no validator URL, no echo of the request.
- Arguments with duplicate keys, ``-0`` or a lone surrogate are ``INVALID_SCHEMA`` (§5).
- ``Host`` and ``Origin`` match exactly (host and port), never by prefix.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from typing import Any

import anyio
import httpx2
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from test_mcp_refusals import answer, approval, ask

from e2e_support import (
    CALL_DEADLINE_S,
    CAPTURE,
    FORGET,
    LEGACY,
    MODERN,
    PURPOSE,
    REVISIONS,
    SEARCH,
    UNKNOWN_TOOL,
    Agent,
    HttpService,
    Human,
    StdioHome,
    engram_cli,
    error_code,
    http_client,
    new_agent,
    new_workspace,
    ok_value,
    protocol_error,
    stdio_client_for,
)
from engram_testing import capture_args, initialize_request

pytestmark = pytest.mark.anyio

NOTE = "Decision: the staging database is rebuilt from the nightly snapshot every Monday."
INVALID_REQUEST = -32600
PARSE_ERROR = -32700

# -- 5. only the six names ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_bare_grant_name_is_unknown_tool_and_runs_nothing(
    http_service: HttpService, mode: str
) -> None:
    workspace, token = http_service.tokens.fresh()
    async with http_client(http_service.url, token, mode, human=Human()) as client:
        agent = Agent(client)
        record_id = await agent.remember(NOTE)
        candidate_id = await agent.captured("A second note, still pending.")
        written = http_service.journal_cursor(workspace)
        calls: dict[str, dict[str, Any]] = {
            "search": {"query": "staging database", "purpose_ref": PURPOSE},
            "get": {"record_id": record_id, "purpose_ref": PURPOSE},
            "capture": agent.capture_arguments("A third note."),
            "request_admission": {"candidate_id": candidate_id, "idempotency_key": "k" * 20},
            "withdraw": agent.withdraw_arguments(candidate_id),
            "forget": agent.forget_arguments(record_id),
        }
        for name, arguments in calls.items():
            error = await protocol_error(partial(client.call_tool, name, arguments))
            assert (error.code, error.message) == (UNKNOWN_TOOL, "Unknown tool"), name
        assert http_service.journal_cursor(workspace) == written
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


# -- 6. malformed JSON-RPC --------------------------------------------------------------------------

HEADERS = {
    "2025-11-25": {},
    "2026-07-28": {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"},
}
NOT_ONE_REQUEST: dict[str, bytes] = {
    "empty-batch": b"[]",
    "batch": json.dumps(
        [{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"secret-echo": 1}}]
    ).encode(),
    "string": b'"tools/list"',
    "number": b"42",
    "null": b"null",
    "no-method": b'{"jsonrpc": "2.0", "id": 1, "params": {"secret-echo": 1}}',
    "no-jsonrpc": b'{"id": 1, "method": "tools/list", "params": {"secret-echo": 1}}',
    "wrong-version": b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}',
    "method-not-a-string": b'{"jsonrpc": "2.0", "id": 1, "method": 7}',
}


def post_raw(
    service: HttpService, body: bytes, revision: str, token: str | None = None
) -> httpx2.Response:
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        **HEADERS[revision],
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx2.post(service.url, content=body, headers=headers, timeout=10)


def assert_constant_error(response: httpx2.Response, code: int, message: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": code, "message": message},
    }
    lowered = response.text.lower()
    for leak in ("pydantic", "validation", "secret-echo", "tools/list", "input_value"):
        assert leak not in lowered


@pytest.mark.parametrize("revision", sorted(HEADERS))
@pytest.mark.parametrize("kind", sorted(NOT_ONE_REQUEST))
def test_a_body_that_is_not_one_json_rpc_object_is_invalid_request_with_a_constant_message(
    http_service: HttpService, kind: str, revision: str
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    response = post_raw(http_service, NOT_ONE_REQUEST[kind], revision, token)
    assert_constant_error(response, INVALID_REQUEST, "Invalid Request")


@pytest.mark.parametrize("revision", sorted(HEADERS))
def test_a_body_that_is_not_json_is_a_parse_error_with_a_constant_message(
    http_service: HttpService, revision: str
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    response = post_raw(http_service, b'{"jsonrpc": "2.0", "secret-echo', revision, token)
    assert_constant_error(response, PARSE_ERROR, "Parse error")


def _stdio_command(home: StdioHome) -> list[str]:
    return [engram_cli(), "serve", "--stdio", "--data-dir", str(home.data_dir)]


async def _stdio_exchange(
    home: StdioHome, token: str, lines: list[bytes], last_id: int, awaited: int = 0
) -> tuple[list[dict[str, Any]], bytes]:
    """Send ``initialize`` then ``lines`` then a ping with ``last_id``; every reply until the
    ping's and those of ids 1..``awaited``, and what the server wrote on stderr."""
    initialize = initialize_request("raw-e2e", request_id=0)
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    ping = {"jsonrpc": "2.0", "id": last_id, "method": "ping"}
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")}
    replies: list[dict[str, Any]] = []
    with anyio.fail_after(CALL_DEADLINE_S):
        async with await anyio.open_process(
            _stdio_command(home), env=env | {"ENGRAM_TOKEN": token}
        ) as proc:
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr
            stdout = BufferedByteReceiveStream(proc.stdout)
            payload = [json.dumps(initialize).encode(), json.dumps(initialized).encode()]
            payload += [*lines, json.dumps(ping).encode()]
            await proc.stdin.send(b"\n".join(payload) + b"\n")
            expected = {0, last_id, *range(1, awaited + 1)}
            while not expected <= {reply.get("id") for reply in replies}:
                replies.append(json.loads(await stdout.receive_until(b"\n", 4 * 1024 * 1024)))
            await proc.stdin.aclose()
            assert await proc.wait() == 0
            stderr = BufferedByteReceiveStream(proc.stderr)
            errors = b""
            try:
                while True:
                    errors += await stderr.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                pass
    return [reply for reply in replies if reply.get("id") != 0], errors


async def test_stdio_answers_a_line_that_is_not_one_json_rpc_object_with_invalid_request(
    stdio_home: StdioHome,
) -> None:
    token = stdio_home.tokens.mint(workspace=new_workspace())
    lines = [NOT_ONE_REQUEST[kind] for kind in sorted(NOT_ONE_REQUEST)]
    replies, stderr = await _stdio_exchange(stdio_home, token, [*lines, b"{not json"], 99)
    errors = [reply for reply in replies if reply.get("id") != 99]
    expected = {"code": INVALID_REQUEST, "message": "Invalid Request"}
    assert errors == [{"jsonrpc": "2.0", "id": None, "error": expected}] * len(lines) + [
        {"jsonrpc": "2.0", "id": None, "error": {"code": PARSE_ERROR, "message": "Parse error"}}
    ]
    assert replies[-1] == {"jsonrpc": "2.0", "id": 99, "result": {}}
    assert b"Traceback" not in stderr and b"secret-echo" not in stderr


# -- 8. JSON the contract refuses: duplicate keys, -0, lone surrogates ------------------------------

SEARCH_TEXT = '{"query": "staging", "purpose_ref": "' + PURPOSE + '"%s}'
REFUSED_JSON = {
    "duplicate-key": SEARCH_TEXT % ', "limit": 5, "limit": 7',
    "duplicate-nested-key": SEARCH_TEXT % ', "filters": {"kinds": ["decision"], "kinds": []}',
    "minus-zero": SEARCH_TEXT % ', "limit": -0',
    "minus-zero-float": SEARCH_TEXT % ', "limit": -0.0',
    "lone-surrogate": '{"query": "staging \\ud800", "purpose_ref": "' + PURPOSE + '"}',
    "lone-low-surrogate-key": SEARCH_TEXT % ', "\\udc00": 1',
}


def tools_call_body(arguments_text: str, request_id: int = 1) -> bytes:
    return (
        f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call", "params": {{"name":'
        f' "{SEARCH}", "arguments": {arguments_text}}}}}'
    ).encode()


def _sse_message(response: httpx2.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("application/json"):
        message: dict[str, Any] = response.json()
        return message
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if "id" in message:
                return message
    raise AssertionError(response.text)


def capture_text(key: str) -> str:
    """A capture's arguments as JSON text, valid at epoch 0 (so ``0`` is an accepted value)."""
    return json.dumps(
        capture_args("Fact: epoch zero is 1970-01-01.", key=key, valid_from=0, purpose=PURPOSE)
    )


CAPTURE_DEFECTS = {
    "duplicate-key": ('"schema_version": 2', '"schema_version": 2, "schema_version": 2'),
    "minus-zero": ('"t": 0', '"t": -0'),
    "minus-zero-float": ('"t": 0', '"t": -0.0'),
    "lone-surrogate": ("epoch zero", "epoch \\ud800zero"),
}


async def _legacy_session(service: HttpService, token: str) -> dict[str, str]:
    """Headers of an initialized 2025-11-25 session, opened by hand."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {token}",
    }
    init = initialize_request("raw-e2e", request_id=0)
    async with httpx2.AsyncClient(timeout=10) as http:
        opened = await http.post(service.url, json=init, headers=headers)
        session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"]}
        session["MCP-Protocol-Version"] = "2025-11-25"
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(service.url, json=done, headers=session)
    return session


@pytest.mark.parametrize("revision", sorted(HEADERS))
@pytest.mark.parametrize("kind", [*sorted(CAPTURE_DEFECTS), "none"])
async def test_arguments_with_duplicate_keys_minus_zero_or_lone_surrogates_are_invalid_schema(
    http_service: HttpService, kind: str, revision: str
) -> None:
    workspace, token = http_service.tokens.fresh()
    text = capture_text("capture-key-" + kind + "-" + workspace)
    if kind != "none":
        before, after = CAPTURE_DEFECTS[kind]
        assert before in text
        text = text.replace(before, after, 1)
    params = f'"name": "{CAPTURE}", "arguments": {text}'
    if revision == "2025-11-25":
        headers = await _legacy_session(http_service, token)
    else:
        headers = {
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": CAPTURE,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Authorization": f"Bearer {token}",
        }
        params += ', "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",'
        params += ' "io.modelcontextprotocol/clientCapabilities": {}}'
    body = '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {' + params + "}}"
    response = httpx2.post(http_service.url, content=body.encode(), headers=headers, timeout=30)
    message = _sse_message(response)
    assert message["id"] == 1, message
    result = message["result"]["structuredContent"]
    if kind == "none":  # the same call without the defect is accepted
        assert result["ok"] is True, result
        assert http_service.journal_cursor(workspace) == 1
    else:
        assert result["ok"] is False and result["error"]["code"] == "INVALID_SCHEMA", message
        assert http_service.journal_cursor(workspace) == 0


async def test_stdio_refuses_duplicate_keys_minus_zero_and_lone_surrogates_as_invalid_schema(
    stdio_home: StdioHome,
) -> None:
    token = stdio_home.tokens.mint(workspace=new_workspace(), tools=["search"])
    kinds = sorted(REFUSED_JSON)
    lines = [tools_call_body(REFUSED_JSON[kind], i + 1) for i, kind in enumerate(kinds)]
    good = tools_call_body(SEARCH_TEXT % "", len(kinds) + 1)
    replies, _ = await _stdio_exchange(stdio_home, token, [*lines, good], 99, len(kinds) + 1)
    by_id = {reply["id"]: reply for reply in replies}
    for i, kind in enumerate(kinds):
        envelope = by_id[i + 1]["result"]["structuredContent"]
        assert envelope["error"]["code"] == "INVALID_SCHEMA", (kind, envelope)
    assert by_id[len(kinds) + 1]["result"]["structuredContent"]["ok"] is True


# -- 7. Host and Origin match exactly ---------------------------------------------------------------


@pytest.mark.parametrize("revision", sorted(HEADERS))
@pytest.mark.parametrize(
    ("header", "value", "status"),
    [
        ("Host", "localhost:80.evil.example", 421),
        ("Host", "127.0.0.1:{port}@evil.example", 421),
        ("Host", "127.0.0.1.evil.example:{port}", 421),
        ("Host", "127.0.0.1:{port}", 200),
        ("Host", "localhost:{port}", 200),
        ("Origin", "http://localhost:80.evil.example", 403),
        ("Origin", "http://127.0.0.1:{port}@evil.example", 403),
        ("Origin", "http://localhost.evil.example:6274", 403),
        ("Origin", "http://localhost:6274", 200),
        ("Origin", "http://127.0.0.1:{port}", 200),
    ],
)
def test_host_and_origin_are_matched_exactly_never_by_prefix(
    http_service: HttpService, revision: str, header: str, value: str, status: int
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    port = http_service.base_url.rsplit(":", 1)[1]
    extra, body = (
        HEADERS[revision],
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize" if revision == "2025-11-25" else "tools/list",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "e2e", "version": "1"},
            }
            if revision == "2025-11-25"
            else {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        },
    )
    headers = {
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {token}",
        header: value.format(port=port),
        **extra,
    }
    response = httpx2.post(http_service.url, json=body, headers=headers, timeout=10)
    assert response.status_code == status, response.text


# -- 8. token time: the documented 30 s leeway --------------------------------------------------------


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_token_expired_ten_seconds_ago_is_still_served_within_the_leeway(
    http_service: HttpService, mode: str
) -> None:
    tokens = http_service.tokens
    now = int(time.time())
    token = tokens.issuer.mint(
        principal="agent-alice",
        tenant_id=tokens.config.tenant_id,
        workspace_id=new_workspace(),
        purpose_ref=PURPOSE,
        tools=["search"],
        expires_in_s=60,
        now=now - 70,  # expired 10 s ago
    )
    async with http_client(http_service.url, token, mode) as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == [SEARCH]
        assert ok_value(await Agent(client).search("anything"))["records"] == []


# -- 8. a mismatched confirmation attempt does not use up the confirmation ----------------------------


@pytest.mark.parametrize("mismatch", ["another-target", "another-operation"])
async def test_a_mismatched_confirmation_attempt_leaves_the_state_for_the_legitimate_retry(
    http_service: HttpService, mismatch: str
) -> None:
    async with new_agent(http_service, MODERN, Human()) as owner:
        client = owner.client
        record_id = await owner.remember(NOTE)
        other_id = await owner.remember("Convention: snapshots are kept for fourteen days.")
        arguments = owner.forget_arguments(record_id)
        first, state = await ask(client, FORGET, arguments)
        wrong = (
            owner.forget_arguments(other_id)
            if mismatch == "another-target"
            else {**arguments, "reason_ref": "reason:something-else"}
        )
        assert error_code(await answer(client, FORGET, wrong, approval(first), state)) == (
            "gate_failed"
        )
        done = await answer(client, FORGET, arguments, approval(first), state)
        assert ok_value(done)["receipt"]["to_state"] == "tombstoned"
        # and the state is single use all the same
        again = {**arguments, "idempotency_key": "forget-again-" + "x" * 16}
        assert error_code(await answer(client, FORGET, again, approval(first), state)) in (
            "gate_failed",
            "ALREADY_TERMINAL",
        )
        assert ok_value(await owner.get(other_id))["record"]["record_id"] == other_id


# -- 9. an agent learns the purpose its token binds ------------------------------------------------


@pytest.mark.parametrize("mode", REVISIONS)
async def test_tools_list_tells_the_connection_the_purpose_its_token_binds(
    http_service: HttpService, mode: str
) -> None:
    purpose = "purpose:release-notes"
    async with new_agent(http_service, mode, purpose=purpose) as agent:
        tools = {tool.name: tool for tool in (await agent.client.list_tools()).tools}
        for name in (SEARCH, "engram_memory_get"):
            assert tools[name].input_schema["properties"]["purpose_ref"]["const"] == purpose
        assert f'"const": "{purpose}"' in json.dumps(tools[CAPTURE].input_schema)  # the payload's
        assert "purpose_ref" not in json.dumps(tools[FORGET].input_schema)
        assert ok_value(await agent.search("anything"))["records"] == []


async def test_a_stdio_connection_is_told_its_purpose_in_the_instructions(
    stdio_home: StdioHome,
) -> None:
    token = stdio_home.tokens.mint(workspace=new_workspace(), purpose="purpose:on-call")
    async with stdio_client_for(stdio_home, token, LEGACY) as client:
        assert client.instructions is not None
        assert "purpose_ref = 'purpose:on-call'" in client.instructions

"""Refusals, driven end to end: bad tokens, foreign origins, purpose and grant mismatches,
workspace isolation, and confirmation round trips that must not go through (2026-07-28
``requestState`` replayed, minted for another principal, target or operation, or tampered).
"""

from __future__ import annotations

from typing import Any

import httpx2
import mcp.types as types
import pytest
from mcp import Client

from engram_memory.operator_plane.decisions import revoke_credentials

from e2e_support import (
    ALICE,
    BAD_TOKEN_KINDS,
    BOBBY,
    CAPTURE,
    FORGET,
    GET,
    MODERN,
    REVISIONS,
    SEARCH,
    TRUSTED_CONTEXT_UNAVAILABLE,
    UNKNOWN_TOOL,
    Agent,
    HttpService,
    Human,
    StdioHome,
    envelope,
    error_code,
    http_client,
    new_agent,
    new_key,
    new_workspace,
    now_ms,
    ok_value,
    protocol_error,
    stdio_client_for,
    without_audit_id,
)
from engram_testing import initialize_request

pytestmark = pytest.mark.anyio

NOTE = "Convention: release branches are cut on Thursdays after the integration suite passes."

# One raw request per revision, as the official client would send it.
RAW_REQUESTS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "2025-11-25": (
        {},
        initialize_request("e2e"),
    ),
    "2026-07-28": (
        {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"},
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        },
    ),
}


def raw_post(service: HttpService, revision: str, headers: dict[str, str]) -> httpx2.Response:
    extra, body = RAW_REQUESTS[revision]
    return httpx2.post(
        service.url,
        json=body,
        headers={"Accept": "application/json, text/event-stream", **extra, **headers},
        timeout=10,
    )


# -- tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("revision", sorted(RAW_REQUESTS))
@pytest.mark.parametrize("kind", BAD_TOKEN_KINDS)
def test_a_wrong_audience_expired_or_badly_signed_token_is_an_http_401_with_a_challenge(
    http_service: HttpService, kind: str, revision: str
) -> None:
    token = http_service.tokens.bad(kind, new_workspace())
    response = raw_post(http_service, revision, {"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    challenge = response.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    assert "resource_metadata=" in challenge
    assert token not in response.text


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("missing", "no bearer token was sent"),
        ("expired", "the bearer token has expired"),
        ("wrong-audience", "issued for another resource (audience)"),
        ("badly-signed", "the bearer token"),
    ],
)
def test_a_401_says_whether_the_token_was_missing_expired_or_for_another_audience(
    http_service: HttpService, kind: str, said: str
) -> None:
    """RFC 6750: ``error="invalid_token"`` with an ``error_description`` naming the reason."""
    headers: dict[str, str] = {}
    if kind != "missing":
        headers["Authorization"] = f"Bearer {http_service.tokens.bad(kind, new_workspace())}"
    response = raw_post(http_service, "2026-07-28", headers)
    assert response.status_code == 401
    challenge = response.headers["WWW-Authenticate"]
    assert challenge.startswith('Bearer error="invalid_token", error_description="')
    assert said in challenge and said in response.json()["error_description"]
    if kind == "wrong-audience":
        assert http_service.resource in challenge  # which resource this server is
    assert "resource_metadata=" in challenge


def test_a_401_says_the_token_was_revoked_and_other_principals_go_on(
    http_service: HttpService,
) -> None:
    workspace, token = http_service.tokens.fresh(principal="agent-revoked-at-the-door")
    other = http_service.tokens.mint(workspace=workspace)
    bearer = {"Authorization": f"Bearer {token}"}
    assert raw_post(http_service, "2026-07-28", bearer).status_code == 200
    tenant = http_service.server.surface.runtime.host.tenant_id
    revoke_credentials(
        http_service.server.host.engine, tenant, "ops", principal="agent-revoked-at-the-door"
    )
    response = raw_post(http_service, "2026-07-28", bearer)
    assert response.status_code == 401
    said = "the bearer token was revoked by the host's operator"
    assert said in response.headers["WWW-Authenticate"]
    assert said in response.json()["error_description"] and token not in response.text
    assert (
        raw_post(http_service, "2026-07-28", {"Authorization": f"Bearer {other}"}).status_code
        == 200
    )


@pytest.mark.parametrize("mode", REVISIONS)
@pytest.mark.parametrize("kind", BAD_TOKEN_KINDS)
async def test_a_bad_token_reaches_the_official_client_as_32603(
    http_service: HttpService, kind: str, mode: str
) -> None:
    token = http_service.tokens.bad(kind, new_workspace())

    async def attempt() -> None:
        async with http_client(http_service.url, token, mode) as client:
            await client.call_tool(SEARCH, {"query": "anything", "purpose_ref": "purpose:x"})

    assert (await protocol_error(attempt)).code == TRUSTED_CONTEXT_UNAVAILABLE


@pytest.mark.parametrize("mode", REVISIONS)
@pytest.mark.parametrize("kind", BAD_TOKEN_KINDS)
async def test_a_bad_token_on_stdio_lists_no_tools_and_calls_are_32603(
    stdio_home: StdioHome, kind: str, mode: str
) -> None:
    token = stdio_home.tokens.bad(kind, new_workspace())
    async with stdio_client_for(stdio_home, token, mode) as client:
        assert (await client.list_tools()).tools == []
        error = await protocol_error(
            lambda: client.call_tool(SEARCH, {"query": "x", "purpose_ref": "purpose:x"})
        )
        assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
        assert error.message == "Trusted invocation context unavailable"
        reason = "token_expired" if kind == "expired" else "invalid_token"
        assert error.data == {"reason": reason}


@pytest.mark.parametrize("mode", REVISIONS)
@pytest.mark.parametrize("kind", ["maintenance-grant", "foreign-tenant"])
async def test_an_authentic_token_that_binds_no_agent_context_is_refused_with_32603(
    http_service: HttpService, kind: str, mode: str
) -> None:
    workspace = new_workspace()
    tokens = http_service.tokens
    token = (
        tokens.maintenance(workspace)
        if kind == "maintenance-grant"
        else tokens.foreign_tenant(workspace)
    )
    async with http_client(http_service.url, token, mode) as client:
        assert (await client.list_tools()).tools == []
        error = await protocol_error(lambda: Agent(client).search("anything"))
        assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
        assert error.message == "Trusted invocation context unavailable"
        reason = "maintenance_token" if kind == "maintenance-grant" else "tenant_mismatch"
        assert error.data == {"reason": reason}


# -- origin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("revision", sorted(RAW_REQUESTS))
def test_a_request_from_a_foreign_origin_is_refused_with_403(
    http_service: HttpService, revision: str
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    headers = {"Authorization": f"Bearer {token}", "Origin": "https://evil.example"}
    assert raw_post(http_service, revision, headers).status_code == 403
    del headers["Origin"]
    assert raw_post(http_service, revision, headers).status_code == 200


@pytest.mark.parametrize("revision", sorted(RAW_REQUESTS))
def test_a_request_addressed_to_a_foreign_host_is_refused(
    http_service: HttpService, revision: str
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())
    headers = {"Authorization": f"Bearer {token}", "Host": "evil.example"}
    assert raw_post(http_service, revision, headers).status_code == 421  # DNS rebinding


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_foreign_origin_reaches_the_official_client_as_32603(
    http_service: HttpService, mode: str
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace())

    async def attempt() -> None:
        headers = {"Origin": "https://evil.example"}
        async with http_client(http_service.url, token, mode, headers=headers) as client:
            await Agent(client).search("anything")

    assert (await protocol_error(attempt)).code == TRUSTED_CONTEXT_UNAVAILABLE


# -- purpose and grants --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_purpose_other_than_the_tokens_is_refused_with_32603_and_writes_nothing(
    http_service: HttpService, mode: str
) -> None:
    workspace, token = http_service.tokens.fresh()
    async with http_client(http_service.url, token, mode) as client:
        record_id = await Agent(client).remember(NOTE)
        written = http_service.journal_cursor(workspace)
        stranger = Agent(client, purpose="purpose:something-else")
        for attempt in (
            lambda: stranger.search("release branches"),
            lambda: stranger.get(record_id),
            lambda: stranger.capture("Another note under the wrong purpose."),
        ):
            error = await protocol_error(attempt)
            assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
            assert error.message == "Trusted invocation context unavailable"
            assert error.data == {"reason": "purpose_mismatch"}
        assert http_service.journal_cursor(workspace) == written


@pytest.mark.parametrize("mode", REVISIONS)
async def test_an_ungranted_tool_is_not_listed_and_calling_it_is_unknown_tool(
    http_service: HttpService, mode: str
) -> None:
    workspace, token = http_service.tokens.fresh(tools=["search", "get"])
    async with http_client(http_service.url, token, mode) as client:
        assert sorted(tool.name for tool in (await client.list_tools()).tools) == sorted(
            [SEARCH, GET]
        )
        agent = Agent(client)
        for attempt in (
            lambda: agent.capture(NOTE),
            lambda: client.call_tool(FORGET, agent.forget_arguments("mem_" + "a" * 56)),
            lambda: client.call_tool("engram_memory_admin", {}),
        ):
            error = await protocol_error(attempt)
            assert error.code == UNKNOWN_TOOL
            assert error.message == "Unknown tool"
        assert ok_value(await agent.search("release branches"))["records"] == []
    assert http_service.journal_cursor(workspace) == 0


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_token_without_grants_lists_no_tools_and_every_call_is_unknown_tool(
    http_service: HttpService, mode: str
) -> None:
    async with new_agent(http_service, mode, tools=[]) as agent:
        assert (await agent.client.list_tools()).tools == []
        error = await protocol_error(lambda: agent.search("anything"))
        assert error.code == UNKNOWN_TOOL


# -- isolation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_token_for_one_workspace_cannot_see_or_touch_another_workspaces_memory(
    http_service: HttpService, mode: str
) -> None:
    home, elsewhere = new_workspace(), new_workspace()
    owner_token = http_service.tokens.mint(workspace=home)
    # Same principal and purpose, full grants: only the workspace differs.
    outsider_token = http_service.tokens.mint(workspace=elsewhere)
    human = Human("accept")
    async with http_client(http_service.url, owner_token, mode) as client:
        owner = Agent(client)
        record_id = await owner.remember(NOTE)
        candidate_id = await owner.captured("A pending note that stays in its workspace.")
    written = http_service.journal_cursor(home)

    async with http_client(http_service.url, outsider_token, mode, human=human) as client:
        outsider = Agent(client)
        foreign = envelope(await outsider.get(record_id))
        unknown = envelope(await outsider.get("mem_" + "b" * 56))
        assert foreign["error"]["code"] == "NOT_FOUND"
        assert without_audit_id(foreign) == without_audit_id(unknown)
        assert foreign["auditId"] != unknown["auditId"]
        assert await outsider.found("release branches Thursdays") == []
        assert error_code(await outsider.admit(candidate_id)) == "NOT_FOUND"
        assert error_code(await outsider.withdraw(candidate_id)) == "NOT_FOUND"
        assert error_code(await outsider.forget(record_id)) == "NOT_FOUND"
        assert human.asked == []  # nobody is asked to approve what cannot run

    assert http_service.journal_cursor(home) == written
    async with http_client(http_service.url, owner_token, mode) as client:
        owner = Agent(client)
        assert await owner.found("release branches Thursdays") == [record_id]
        assert ok_value(await owner.admit(candidate_id))["outcome"]["status"] == "accepted"


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_candidate_is_private_to_its_principal_but_a_record_is_shared_in_the_workspace(
    http_service: HttpService, mode: str
) -> None:
    workspace = new_workspace()
    alice = http_service.tokens.mint(workspace=workspace, principal=ALICE)
    bobby = http_service.tokens.mint(workspace=workspace, principal=BOBBY)
    async with http_client(http_service.url, alice, mode) as client:
        owner = Agent(client)
        record_id = await owner.remember(NOTE)
        candidate_id = await owner.captured("Alice's pending note.")
    async with http_client(http_service.url, bobby, mode) as client:
        colleague = Agent(client)
        assert error_code(await colleague.admit(candidate_id)) == "NOT_FOUND"
        assert ok_value(await colleague.get(record_id))["record"]["record_id"] == record_id


# -- 2026-07-28 confirmation round trips driven by hand -------------------------------------------


def approval(first: types.InputRequiredResult, action: str = "accept") -> dict[str, Any]:
    """The human's answer to the single elicitation of ``first``."""
    assert first.input_requests is not None
    (key,) = first.input_requests
    assert isinstance(first.input_requests[key], types.ElicitRequest)
    content = {"decision": "approve"} if action == "accept" else None
    return {key: types.ElicitResult(action=action, content=content)}


async def ask(
    client: Client, tool: str, arguments: dict[str, Any]
) -> tuple[types.InputRequiredResult, str]:
    """Round one: the server asks for a confirmation; the round and its sealed state."""
    first = await client.session.call_tool(tool, arguments, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    assert first.request_state
    return first, first.request_state


async def answer(
    client: Client,
    tool: str,
    arguments: dict[str, Any],
    responses: dict[str, Any],
    request_state: str,
) -> types.CallToolResult:
    """Round two: the same call again, with the human's answer and a ``requestState``."""
    result = await client.session.call_tool(
        tool,
        arguments,
        input_responses=responses,
        request_state=request_state,
        allow_input_required=True,
    )
    assert isinstance(result, types.CallToolResult), result
    return result


async def test_a_replayed_request_state_is_gate_failed_and_authorizes_nothing_more(
    http_service: HttpService,
) -> None:
    workspace, token = http_service.tokens.fresh(confirm=["capture"])
    async with http_client(http_service.url, token, MODERN, human=Human()) as client:
        agent = Agent(client)
        arguments = agent.capture_arguments(NOTE, new_key("capture"))
        first, state = await ask(client, CAPTURE, arguments)
        assert http_service.journal_cursor(workspace) == 0  # nothing before the approval
        done = await answer(client, CAPTURE, arguments, approval(first), state)
        assert ok_value(done)["status"] == "committed_pending"
        assert http_service.journal_cursor(workspace) == 1

        # The same approval again, for the same content under a new key: a second mutation.
        again = {**arguments, "idempotency_key": new_key("capture")}
        replayed = await answer(client, CAPTURE, again, approval(first), state)
        assert error_code(replayed) == "gate_failed"
        assert envelope(replayed)["error"]["retriable"] is False
        assert http_service.journal_cursor(workspace) == 1


@pytest.mark.parametrize(
    "mismatch", ["another-principal", "another-target", "another-operation", "tampered"]
)
async def test_a_request_state_not_minted_for_this_very_operation_is_gate_failed(
    http_service: HttpService, mismatch: str
) -> None:
    workspace = new_workspace()
    alice = http_service.tokens.mint(workspace=workspace, principal=ALICE)
    bobby = http_service.tokens.mint(workspace=workspace, principal=BOBBY)
    async with (
        http_client(http_service.url, alice, MODERN, human=Human()) as alice_client,
        http_client(http_service.url, bobby, MODERN, human=Human()) as bobby_client,
    ):
        owner = Agent(alice_client)
        record_id = await owner.remember(NOTE)
        other_record_id = await owner.remember("Convention: hotfixes go through the same suite.")
        minted_for = owner.forget_arguments(record_id)
        first, state = await ask(alice_client, FORGET, minted_for)

        caller, arguments = alice_client, owner.forget_arguments(record_id)
        if mismatch == "another-principal":
            caller = bobby_client
        elif mismatch == "another-target":
            arguments = owner.forget_arguments(other_record_id)
        elif mismatch == "another-operation":
            arguments = {**arguments, "reason_ref": "reason:something-else"}
        else:
            middle = len(state) // 2
            state = state[:middle] + ("A" if state[middle] != "A" else "B") + state[middle + 1 :]
        written = http_service.journal_cursor(workspace)

        refused = await answer(caller, FORGET, arguments, approval(first), state)
        assert error_code(refused) == "gate_failed"
        assert http_service.journal_cursor(workspace) == written
        for kept in (record_id, other_record_id):
            assert ok_value(await owner.get(kept))["record"]["record_id"] == kept

        # The caller's own, properly minted round trip for that operation still goes through.
        own, own_state = await ask(caller, FORGET, arguments)
        done = await answer(caller, FORGET, arguments, approval(own), own_state)
        assert ok_value(done)["receipt"]["to_state"] == "tombstoned"


async def test_a_declined_hand_driven_round_trip_is_gate_failed_and_changes_nothing(
    http_service: HttpService,
) -> None:
    async with new_agent(http_service, MODERN, Human()) as agent:
        client = agent.client
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        for action in ("decline", "cancel"):
            first, state = await ask(client, FORGET, arguments)
            result = await answer(client, FORGET, arguments, approval(first, action), state)
            assert error_code(result) == "gate_failed"
            assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id
        # The human may still approve the very same operation later.
        first, state = await ask(client, FORGET, arguments)
        done = await answer(client, FORGET, arguments, approval(first), state)
        assert ok_value(done)["receipt"]["to_state"] == "tombstoned"


@pytest.mark.parametrize("how", ["decline-action", "decline-decision"])
async def test_a_request_state_is_spent_by_its_first_answer_even_a_decline(
    http_service: HttpService, how: str
) -> None:
    """CONTRACT.md §8: declined with S, then approved with the same S: still ``gate_failed``."""
    async with new_agent(http_service, MODERN, Human()) as agent:
        client = agent.client
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        first, state = await ask(client, FORGET, arguments)
        (key,) = first.input_requests or {}
        declined = (
            approval(first, "decline")
            if how == "decline-action"
            else {key: types.ElicitResult(action="accept", content={"decision": "decline"})}
        )
        assert error_code(await answer(client, FORGET, arguments, declined, state)) == (
            "gate_failed"
        )

        replayed = await answer(client, FORGET, arguments, approval(first), state)
        assert error_code(replayed) == "gate_failed"
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


async def test_a_state_whose_question_was_declined_at_the_terminal_never_approves(
    http_service: HttpService,
) -> None:
    """Declined at the terminal, reported once (the question closes, the next call asks anew):
    the first round trip's state, replayed with an approval, is still ``gate_failed``."""
    async with new_agent(http_service, MODERN, Human()) as agent:
        client = agent.client
        record_id = await agent.remember(NOTE)
        arguments = agent.forget_arguments(record_id)
        first, state = await ask(client, FORGET, arguments)
        (pending,) = [
            row for row in http_service.server.approvals.pending() if row.target == record_id
        ]
        book = http_service.server.approvals.book
        assert book.answer(pending.approval_id, False, now_ms=now_ms(), by="terminal")

        reported = await client.session.call_tool(FORGET, arguments, allow_input_required=True)
        assert isinstance(reported, types.CallToolResult)
        assert error_code(reported) == "gate_failed"
        await ask(client, FORGET, arguments)  # asked anew, under a new id
        assert book.answer(pending.approval_id, True, now_ms=now_ms(), by="terminal") is None

        replayed = await answer(client, FORGET, arguments, approval(first), state)
        assert error_code(replayed) == "gate_failed"
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id

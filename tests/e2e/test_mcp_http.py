"""The official ``mcp`` client drives the real server over Streamable HTTP, on both revisions.

Lifecycle (capture → request_admission → search → get → forget), withdraw, the confirmation gate
(approve, decline, cancel, no elicitation capability), the closed input schemas, the envelope's
text/structured equality, and the RFC 9728 protected-resource metadata.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx2
import jsonschema
import pytest

from engram_memory.contract.canonical import canonical_bytes

from e2e_support import (
    ADMIT,
    CAPTURE,
    FORGET,
    GET,
    INVALID_SCHEMA_MESSAGE,
    MODERN,
    REVISIONS,
    SEARCH,
    TRUSTED_CONTEXT_UNAVAILABLE,
    WITHDRAW,
    Agent,
    HttpService,
    Human,
    envelope,
    error_code,
    http_client,
    new_agent,
    new_key,
    new_workspace,
    ok_value,
    protocol_error,
)
from engram_testing import object_paths

pytestmark = pytest.mark.anyio

WAL_NOTE = "Decision: the embedded store runs SQLite in WAL mode so readers never block the writer."


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_memory_is_captured_admitted_found_read_and_then_forgotten_for_good(
    http_service: HttpService, mode: str
) -> None:
    human = Human("accept")
    async with new_agent(http_service, mode, human) as agent:
        candidate_id = await agent.captured(WAL_NOTE)
        assert await agent.found("WAL readers writer") == []  # pending is never returned

        outcome = ok_value(await agent.admit(candidate_id))["outcome"]
        assert outcome["status"] == "accepted"
        record_id = outcome["record_id"]
        assert await agent.found("WAL readers writer") == [record_id]
        read = ok_value(await agent.get(record_id))
        assert read["record"]["record_id"] == record_id
        assert read["read_receipt"]["record_id"] == record_id
        assert human.asked == []  # capture and admission were not confirmation-gated

        forgotten = ok_value(await agent.forget(record_id))
        assert forgotten["receipt"]["operation"] == "tombstone"
        assert forgotten["receipt"]["from_state"] == "accepted_current"
        assert forgotten["receipt"]["to_state"] == "tombstoned"
        assert forgotten["replayed"] is False
        assert len(human.asked) == 1 and record_id in human.asked[0]

        assert await agent.found("WAL readers writer") == []
        assert error_code(await agent.get(record_id)) == "NOT_FOUND"


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_pending_candidate_is_withdrawn_with_confirmation_and_stays_ended(
    http_service: HttpService, mode: str
) -> None:
    human = Human("accept")
    async with new_agent(http_service, mode, human) as agent:
        candidate_id = await agent.captured("A draft note about the staging deploy flag.")

        withdrawn = ok_value(await agent.withdraw(candidate_id))
        assert withdrawn["receipt"]["operation"] == "withdraw"
        assert (withdrawn["receipt"]["from_state"], withdrawn["receipt"]["to_state"]) == (
            "pending",
            "withdrawn",
        )
        assert withdrawn["key_destruction"] in ("pending", "complete")
        assert len(human.asked) == 1 and candidate_id in human.asked[0]

        assert error_code(await agent.admit(candidate_id)) == "NOT_FOUND"
        assert error_code(await agent.withdraw(candidate_id)) == "ALREADY_TERMINAL"
        assert len(human.asked) == 1  # state checks come before anybody is asked


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_retried_forget_or_withdraw_returns_the_stored_result_without_asking_again(
    http_service: HttpService, mode: str
) -> None:
    human = Human("accept")
    async with new_agent(http_service, mode, human) as agent:
        record_id = await agent.remember(WAL_NOTE)
        candidate_id = await agent.captured("A draft that is withdrawn, then withdrawn again.")
        calls = [
            (FORGET, agent.forget_arguments(record_id)),
            (WITHDRAW, agent.withdraw_arguments(candidate_id)),
        ]
        for tool, arguments in calls:
            first = ok_value(await agent.client.call_tool(tool, arguments))
            again = ok_value(await agent.client.call_tool(tool, arguments))
            assert (first["replayed"], again["replayed"]) == (False, True)
            assert again["receipt"] == first["receipt"]
        assert len(human.asked) == 2  # one approval per operation, none for the replays


@pytest.mark.parametrize("answer", ["decline", "cancel"])
@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_declined_or_cancelled_confirmation_is_gate_failed_and_changes_nothing(
    http_service: HttpService, mode: str, answer: str
) -> None:
    human = Human(answer)
    async with new_agent(http_service, mode, human) as agent:
        record_id = await agent.remember(WAL_NOTE)
        candidate_id = await agent.captured("A second note that somebody wants to keep.")

        refused = envelope(await agent.forget(record_id))
        assert refused["error"] == {
            "code": "gate_failed",
            "message": refused["error"]["message"],
            "retriable": False,
        }
        assert error_code(await agent.withdraw(candidate_id)) == "gate_failed"
        assert len(human.asked) == 2

        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id
        assert await agent.found("WAL readers writer") == [record_id]
        assert ok_value(await agent.admit(candidate_id))["outcome"]["status"] == "accepted"


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_client_that_cannot_ask_a_human_is_refused_with_32603_and_nothing_changes(
    http_service: HttpService, mode: str
) -> None:
    async with new_agent(http_service, mode, None) as agent:
        record_id = await agent.remember(WAL_NOTE)
        candidate_id = await agent.captured("A second note that stays pending.")

        for attempt in (lambda: agent.forget(record_id), lambda: agent.withdraw(candidate_id)):
            error = await protocol_error(attempt)
            assert error.code == TRUSTED_CONTEXT_UNAVAILABLE
            # the constant message; what the human can do is in data: the host's terminal
            # command (the bare program name, no path) and the approval page
            assert error.message == "Trusted invocation context unavailable"
            data = error.data
            assert data["reason"] == "no_elicitation"
            assert data["approve_with"] == f"engram-memory approvals approve {data['approval_id']}"
            assert data["page"].startswith(f"{http_service.base_url}/approvals/apr_")
            assert set(data) == {"reason", "approval_id", "approve_with", "page"}

        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id
        assert ok_value(await agent.admit(candidate_id))["outcome"]["status"] == "accepted"
        # What cannot run is answered before any confirmation channel is needed.
        assert error_code(await agent.forget("mem_" + "c" * 56)) == "NOT_FOUND"
        assert error_code(await agent.withdraw(candidate_id)) == "ILLEGAL_TRANSITION"


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_capture_the_host_makes_confirmable_is_written_only_after_approval(
    http_service: HttpService, mode: str
) -> None:
    human = Human("accept")
    async with new_agent(http_service, mode, human, confirm=["capture"]) as agent:
        value = ok_value(await agent.capture(WAL_NOTE))
        assert value["status"] == "committed_pending"
        assert len(human.asked) == 1


async def test_an_approved_2026_round_trip_opens_its_request_state_whatever_its_length(
    http_service: HttpService,
) -> None:
    """Regression: sealed requestStates of every base64 length must open (the padding bug)."""
    workspace = new_workspace()
    for principal in ("agent-x", "agent-xy", "agent-xyz", "agent-xyzw"):
        token = http_service.tokens.mint(workspace=workspace, principal=principal)
        human = Human("accept")
        async with http_client(http_service.url, token, MODERN, human=human) as client:
            agent = Agent(client)
            record_id = await agent.remember(f"A note kept by {principal} for a while.")
            forgotten = ok_value(await agent.forget(record_id))
            assert forgotten["receipt"]["to_state"] == "tombstoned", principal
            candidate_id = await agent.captured(f"A draft by {principal}.")
            assert ok_value(await agent.withdraw(candidate_id))["receipt"]["to_state"] == (
                "withdrawn"
            )
            assert len(human.asked) == 2


# -- schemas and envelopes -------------------------------------------------------------------


def _object_schemas(node: Any, path: str = "#") -> list[tuple[str, dict[str, Any]]]:
    """Every sub-schema that describes an object, with its JSON pointer."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            found.append((path, node))
        for name, child in node.items():
            found.extend(_object_schemas(child, f"{path}/{name}"))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found.extend(_object_schemas(child, f"{path}/{index}"))
    return found


@pytest.mark.parametrize("mode", REVISIONS)
async def test_every_published_input_schema_is_closed_at_every_level(
    http_service: HttpService, mode: str
) -> None:
    async with new_agent(http_service, mode) as agent:
        tools = (await agent.client.list_tools()).tools
    assert sorted(tool.name for tool in tools) == sorted(
        [SEARCH, GET, CAPTURE, ADMIT, WITHDRAW, FORGET]
    )
    for tool in tools:
        schema = tool.input_schema
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)
        objects = _object_schemas(schema)
        assert objects[0][0] == "#", tool.name
        for pointer, node in objects:
            assert node.get("type") == "object", (tool.name, pointer)
            assert node.get("additionalProperties") is False, (tool.name, pointer)
        assert tool.output_schema is not None and tool.output_schema.get("type") == "object"


@pytest.mark.parametrize("mode", REVISIONS)
async def test_tool_annotations_tell_reads_appends_and_destructive_changes_apart(
    http_service: HttpService, mode: str
) -> None:
    async with new_agent(http_service, mode) as agent:
        hints = {
            tool.name: tool.annotations.model_dump(by_alias=True, exclude_none=True)
            for tool in (await agent.client.list_tools()).tools
            if tool.annotations is not None
        }
    for name in (SEARCH, GET):
        assert hints[name]["readOnlyHint"] is True and hints[name]["openWorldHint"] is False
    for name in (CAPTURE, ADMIT):
        assert hints[name] == {
            "readOnlyHint": False,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        }
    for name in (WITHDRAW, FORGET):
        assert hints[name]["destructiveHint"] is True and hints[name]["idempotentHint"] is True
        assert hints[name]["openWorldHint"] is False


def _with_extra_field_at_each_level(arguments: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One copy of ``arguments`` per object in it, with an unexpected field added to that object."""
    variants = []
    for path in object_paths(arguments):
        variant = copy.deepcopy(arguments)
        target: Any = variant
        for part in path:
            target = target[part]
        target["unexpected_field"] = 1
        variants.append(("/" + "/".join(map(str, path)), variant))
    return variants


@pytest.mark.parametrize("mode", REVISIONS)
async def test_an_extra_field_at_any_level_is_an_invalid_schema_envelope_not_a_crash(
    http_service: HttpService, mode: str
) -> None:
    human = Human("accept")
    async with new_agent(http_service, mode, human) as agent:
        record_id = await agent.remember(WAL_NOTE)
        candidate_id = await agent.captured("A pending note for the schema checks.")
        valid_arguments: dict[str, dict[str, Any]] = {
            SEARCH: {
                "query": "WAL",
                "purpose_ref": agent.purpose,
                "capability_policy": {"minimum_channels": "lexical", "network": "forbid"},
            },
            GET: {"record_id": record_id, "purpose_ref": agent.purpose},
            CAPTURE: agent.capture_arguments("Another cited note.", new_key("capture")),
            ADMIT: {"candidate_id": candidate_id, "idempotency_key": new_key("admit")},
            WITHDRAW: agent.withdraw_arguments(candidate_id),
            FORGET: agent.forget_arguments(record_id),
        }
        schemas = {tool.name: tool.input_schema for tool in (await agent.client.list_tools()).tools}
        tried = 0
        for tool, arguments in valid_arguments.items():
            validator = jsonschema.Draft202012Validator(schemas[tool])
            validator.validate(arguments)  # the published schema accepts the valid call
            for pointer, variant in _with_extra_field_at_each_level(arguments):
                assert not validator.is_valid(variant), (tool, pointer)  # and refuses the extra
                env = envelope(await agent.client.call_tool(tool, variant))
                assert not env["ok"], (tool, pointer)
                assert env["error"]["code"] == "INVALID_SCHEMA", (tool, pointer, env)
                assert env["error"]["retriable"] is False
                # the message is the code's constant one; the audit line names the field as a
                # JSON pointer and the rule it broke
                assert env["error"]["message"] == INVALID_SCHEMA_MESSAGE
                violation = http_service.audited(env["auditId"])["violation"]
                field = f"{pointer.rstrip('/')}/unexpected_field"
                assert (violation["pointer"], violation["rule"]) == (field, "extra_forbidden")
                tried += 1
        assert tried == 14  # every object of every tool's arguments
        assert human.asked == []  # validation happens before anybody is asked
        # Nothing was written by the refused calls: the record and the candidate are untouched.
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id
        assert ok_value(await agent.admit(candidate_id))["outcome"]["status"] == "accepted"


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_model_written_confirmation_is_an_extra_field_and_nobody_is_asked(
    http_service: HttpService, mode: str
) -> None:
    human = Human("accept")
    async with new_agent(http_service, mode, human) as agent:
        record_id = await agent.remember(WAL_NOTE)
        arguments = {**agent.forget_arguments(record_id), "confirmed": True}
        assert error_code(await agent.client.call_tool(FORGET, arguments)) == "INVALID_SCHEMA"
        assert human.asked == []
        assert ok_value(await agent.get(record_id))["record"]["record_id"] == record_id


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_null_optional_field_or_a_wrong_type_is_invalid_schema(
    http_service: HttpService, mode: str
) -> None:
    async with new_agent(http_service, mode) as agent:
        for options in ({"limit": None}, {"limit": "10"}, {"limit": True}, {"limit": 51}):
            assert error_code(await agent.search("WAL", **options)) == "INVALID_SCHEMA", options


@pytest.mark.parametrize("mode", REVISIONS)
async def test_the_text_content_is_the_structured_envelope_as_canonical_json(
    http_service: HttpService, mode: str
) -> None:
    async with new_agent(http_service, mode) as agent:
        results = [
            await agent.capture(WAL_NOTE),
            await agent.search("WAL"),
            await agent.get("mem_" + "a" * 56),
            await agent.search("WAL", unexpected_field=1),
        ]
    assert [envelope(result)["ok"] for result in results] == [True, True, False, False]
    for result in results:
        text = result.content[0].text  # type: ignore[union-attr]
        assert text == canonical_bytes(result.structured_content).decode("utf-8")


# -- HTTP surface: RFC 9728 metadata, challenges, origins ------------------------------------


@pytest.mark.parametrize(
    "path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]
)
def test_the_protected_resource_metadata_reports_the_configured_resource(
    http_service: HttpService, path: str
) -> None:
    response = httpx2.get(http_service.base_url + path, timeout=10)
    assert response.status_code == 200
    metadata = response.json()
    assert metadata["resource"] == http_service.resource == http_service.url
    # The local issuer mints tokens from the command line and serves no OAuth metadata: no
    # authorization server is advertised, so no client starts an OAuth flow that cannot succeed.
    assert "authorization_servers" not in metadata
    assert "header" in metadata.get("bearer_methods_supported", ["header"])


def test_a_request_without_a_token_is_401_with_a_bearer_resource_metadata_challenge(
    http_service: HttpService,
) -> None:
    response = httpx2.post(
        http_service.url,
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={"Accept": "application/json, text/event-stream"},
        timeout=10,
    )
    assert response.status_code == 401
    challenge = response.headers["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    resource_origin = http_service.resource.removesuffix("/mcp")
    assert (
        f'resource_metadata="{resource_origin}/.well-known/oauth-protected-resource/mcp"'
        in challenge
    )


@pytest.mark.parametrize("mode", REVISIONS)
async def test_a_client_from_an_allowed_local_origin_is_served(
    http_service: HttpService, mode: str
) -> None:
    token = http_service.tokens.mint(workspace=new_workspace(), tools=["search"])
    headers = {"Origin": "http://localhost:6274"}
    async with http_client(http_service.url, token, mode, headers=headers) as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == [SEARCH]
        assert ok_value(await Agent(client).search("anything"))["records"] == []


@pytest.mark.parametrize("mode", REVISIONS)
async def test_invalid_schema_has_one_message_and_the_audit_line_names_the_field_and_rule(
    http_service: HttpService, mode: str
) -> None:
    secretish = "sk-live-" + "Q" * 40
    async with new_agent(http_service, mode) as agent:
        hidden = "(a name not shown)"
        cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
            (
                {"query": "WAL", "purpose_ref": agent.purpose, "limit": 51},
                {"pointer": "/limit", "rule": "less_than_equal", "says": "must be at most 50"},
            ),
            (
                {"query": secretish, "purpose_ref": agent.purpose, "limit": "10"},
                {"pointer": "/limit", "rule": "int_type", "says": "must be an integer"},
            ),
            (
                {"query": "WAL", "purpose_ref": agent.purpose, secretish: 1},
                {"pointer": f"/{hidden}", "rule": "extra_forbidden"},
            ),
            ({"purpose_ref": agent.purpose}, {"pointer": "/query", "rule": "missing"}),
        ]
        for arguments, expected in cases:
            env = envelope(await agent.client.call_tool(SEARCH, arguments))
            assert env["error"] == {
                "code": "INVALID_SCHEMA",
                "message": INVALID_SCHEMA_MESSAGE,
                "retriable": False,
            }
            line = http_service.audited(env["auditId"])
            assert line["code"] == "INVALID_SCHEMA" and line["tool"] == "search"
            assert expected.items() <= line["violation"].items(), line["violation"]
            assert set(line["violation"]) == {"pointer", "rule", "says", "more"}
            assert secretish not in json.dumps(line) and "Q" * 10 not in json.dumps(line)

"""Parts of the MCP surface that need no transport: catalog, request-state sealing, round trips."""

from __future__ import annotations

import mcp.types as types
import pytest

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.models import INPUT_MODELS
from engram_memory.engine.context import TOOLS
from engram_memory.engine.gate import Approval, check_approval
from engram_memory.mcp_surface.catalog import (
    GRANT_OF,
    INSTRUCTIONS,
    SNAPSHOT,
    TOOL_NAMES,
    build_tools,
    load_tools,
    snapshot_text,
)
from engram_memory.mcp_surface.confirmations import (
    approval_of_state,
    approved,
    can_elicit,
    state_for,
)
from engram_memory.mcp_surface.request_state import RequestStateInvalid, RequestStateSealer
from engram_memory.mcp_surface.server import envelope_result

from engram_testing import forget_request

REQUEST = forget_request("mem_abc", reason_ref="reason:x", summary="Tool: forget")
ELICIT = types.ClientCapabilities(elicitation=types.ElicitationCapability())
APPROVE = types.ElicitResult(action="accept", content={"decision": "approve"})


# The contract's six tools and their effects (CONTRACT.md §3); a tool added later is held to the
# annotations of the effect its card declares.
CONTRACT_EFFECTS = {
    "search": "read",
    "get": "read",
    "capture": "write",
    "request_admission": "write",
    "withdraw": "destructive",
    "forget": "destructive",
}


def test_every_tool_is_published_with_contract_annotations_and_closed_schemas() -> None:
    tools = build_tools()
    assert set(tools) == set(TOOLS) == set(TOOL_NAMES)
    assert {GRANT_OF[t.name] for t in tools.values()} == set(TOOLS)
    effects = {grant: INPUT_MODELS[grant].tool.effect for grant in tools}
    assert {grant: effects[grant] for grant in CONTRACT_EFFECTS} == CONTRACT_EFFECTS
    for grant, tool in tools.items():
        annotations = tool.annotations
        assert annotations is not None and annotations.open_world_hint is False
        if effects[grant] == "read":
            assert annotations.read_only_hint is True
        elif effects[grant] == "write":
            assert (
                annotations.read_only_hint,
                annotations.destructive_hint,
                annotations.idempotent_hint,
            ) == (False, False, True)
        else:
            assert (annotations.destructive_hint, annotations.idempotent_hint) == (True, True)
        assert tool.input_schema["additionalProperties"] is False
        assert tool.output_schema is not None and "oneOf" in tool.output_schema
        assert tool.description and len(tool.description) > 200
    assert "search before you capture" in INSTRUCTIONS.lower()


def test_the_shipped_tool_snapshot_is_what_the_contract_models_generate() -> None:
    built = build_tools()
    assert SNAPSHOT.read_text(encoding="utf-8") == snapshot_text(built), (
        "mcp_surface/tools.json is stale: run python -m engram_memory.mcp_surface.catalog"
    )
    assert load_tools() == built  # the same tools, field for field


def test_a_sealed_state_opens_only_untouched_and_under_its_key() -> None:
    sealer = RequestStateSealer(b"k" * 32)
    state = state_for(REQUEST, 1_000)
    token = sealer.seal(state)
    assert "alice" not in token and "mem_abc" not in token
    assert sealer.open(token) == state
    with pytest.raises(RequestStateInvalid):
        RequestStateSealer(b"j" * 32).open(token)
    with pytest.raises(RequestStateInvalid):
        sealer.open(token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:])
    with pytest.raises(RequestStateInvalid):
        sealer.open("not-a-state")


def test_the_retry_brings_back_an_approval_of_exactly_the_state_s_operation() -> None:
    state = state_for(REQUEST, 4_000)
    approval = approval_of_state(state, 5_000)
    assert approval == Approval.of(
        REQUEST,
        approval_id=state.approval_id,
        issued_at_ms=4_000,
        approved_at_ms=5_000,
        by="form answered by the client",  # the record's history says so
    )
    check_approval(approval, REQUEST, 5_000)  # the engine's gate accepts it


@pytest.mark.parametrize(
    "change",
    [
        {"principal": "bob"},
        {"target": "mem_other"},
        {"tool": "withdraw"},
        {"operation_digest": "sha256:" + "2" * 64},
        {"workspace_id": "w2"},
    ],
)
def test_a_state_minted_for_another_operation_fails_the_gate(change: dict[str, str]) -> None:
    state = state_for(REQUEST, 1_000).model_copy(update=change)
    with pytest.raises(EngramError) as refused:
        check_approval(approval_of_state(state, 2_000), REQUEST, 2_000)
    assert refused.value.code is ErrorCode.GATE_FAILED


@pytest.mark.parametrize(
    "answer",
    [
        types.ElicitResult(action="decline"),
        types.ElicitResult(action="cancel"),
        types.ElicitResult(action="accept", content={"decision": "decline"}),
        types.ElicitResult(action="accept", content={"approve": True}),  # the old checkbox
        None,
    ],
)
def test_anything_but_an_explicit_approval_is_no_approval(
    answer: types.ElicitResult | None,
) -> None:
    assert approved(APPROVE)
    assert not approved(answer)


def test_a_client_without_elicitation_has_no_confirmation_channel() -> None:
    assert can_elicit(ELICIT)
    assert not can_elicit(types.ClientCapabilities())


def test_the_text_content_is_the_envelope_byte_for_byte() -> None:
    import json

    envelope = {
        "ok": False,
        "auditId": "aud_1",
        "redactionClass": "high",
        "error": {
            "code": "NOT_FOUND",
            "message": "The target is not available.",
            "retriable": False,
        },
    }
    result = envelope_result(envelope)
    assert result.is_error is True
    assert result.structured_content == envelope
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    assert json.loads(content.text) == envelope

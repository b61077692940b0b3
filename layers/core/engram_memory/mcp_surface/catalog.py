"""What agents see: tool names, descriptions, annotations, schemas and server instructions."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

import mcp.types as types

from engram_memory.contract.models import INPUT_MODELS

# Grant names (token claims) -> MCP tool names (CONTRACT.md §7, §12).
TOOL_NAMES: Final = {grant: f"engram_memory_{grant}" for grant in INPUT_MODELS}
GRANT_OF: Final = {name: grant for grant, name in TOOL_NAMES.items()}

DESCRIPTIONS: Final = {grant: model.tool.description for grant, model in INPUT_MODELS.items()}


def _annotations(grant: str) -> types.ToolAnnotations:
    effect = INPUT_MODELS[grant].tool.effect
    if effect == "read":
        return types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    return types.ToolAnnotations(
        read_only_hint=False,
        destructive_hint=effect == "destructive",
        idempotent_hint=True,
        open_world_hint=False,
    )


def instructions_for(purpose_ref: str | None) -> str:
    """The server instructions, naming the connection's purpose when it is known (stdio)."""
    if purpose_ref is None:
        return INSTRUCTIONS
    return (
        INSTRUCTIONS + f"\nThe purpose bound to this connection: purpose_ref = {purpose_ref!r}.\n"
    )


def for_purpose(tool: types.Tool, purpose_ref: str) -> types.Tool:
    """``tool`` as one connection sees it: every ``purpose_ref`` of its input schema (search and
    get: an argument; capture: the payload's) fixed to the purpose the token binds, so an agent
    can learn it (the argument must repeat it exactly)."""
    if "purpose_ref" not in json.dumps(tool.input_schema):
        return tool
    return tool.model_copy(update={"input_schema": _bind_purpose(tool.input_schema, purpose_ref)})


def _bind_purpose(schema: Any, purpose_ref: str) -> Any:
    if isinstance(schema, list):
        return [_bind_purpose(item, purpose_ref) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bound = {key: _bind_purpose(value, purpose_ref) for key, value in schema.items()}
    properties = bound.get("properties")
    if isinstance(properties, dict) and isinstance(properties.get("purpose_ref"), dict):
        properties["purpose_ref"] = {
            **properties["purpose_ref"],
            "const": purpose_ref,
            "description": "The purpose your host bound to this connection: exactly this value.",
        }
    return bound


# ``build_tools``' output, generated once and shipped beside this module: generating it imports
# the output models and runs pydantic's JSON Schema generation, ~0.2-0.4 s of CPU that a server
# would spend before its first tools/list. ``python -m engram_memory.mcp_surface.catalog``
# writes it; tests/unit/test_mcp_surface_parts.py fails when it differs from ``build_tools``.
SNAPSHOT: Final = Path(__file__).with_name("tools.json")


def load_tools() -> dict[str, types.Tool]:
    """Every tool, keyed by grant name, as ``build_tools`` makes them, read from ``SNAPSHOT``."""
    published = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    return {grant: types.Tool.model_validate(published[grant]) for grant in TOOL_NAMES}


def snapshot_text(tools: dict[str, types.Tool]) -> str:
    """``SNAPSHOT``'s text for ``tools``: each tool as it goes on the wire (JSON, by alias)."""
    published = {
        grant: tool.model_dump(mode="json", by_alias=True, exclude_none=True)
        for grant, tool in tools.items()
    }
    return json.dumps(published, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def build_tools() -> dict[str, types.Tool]:
    """Every tool, keyed by grant name, with schemas generated from the contract models."""
    from engram_memory.contract.schemas import input_schema, output_envelope_schema

    return {
        grant: types.Tool(
            name=name,
            title=INPUT_MODELS[grant].tool.title,
            description=DESCRIPTIONS[grant],
            input_schema=input_schema(grant),
            output_schema=output_envelope_schema(grant),
            annotations=_annotations(grant),
        )
        for grant, name in TOOL_NAMES.items()
    }


INSTRUCTIONS: Final = """\
Engram Memory is governed, durable memory shared by the agents of this workspace.

When to use it: for knowledge worth finding again in a later session or by another agent —
decisions with their reasons, verified facts about a system with a citable source, conventions,
recurring pitfalls and their fixes, hand-off facts. When not to: temporary or in-progress state,
chat transcripts, raw tool output, local task notes, speculation.

Your purpose: search, get and capture take a purpose_ref that must equal the purpose your host
bound to this connection; each of those tools' input schema gives it (purpose_ref "const").

How: search before you capture; if an equivalent current record exists, cite its record_id.
capture creates an encrypted PENDING candidate (not searchable yet); request_admission asks the
host's policy: accepted (now a record), rejected (refused, destroyed) or pending_adjudication (a
human decides later). withdraw (pending candidates) and forget (records) need a human's
confirmation, which the host asks for — you can never confirm on your own.

Never store secrets, credentials, tokens, API or signing keys, passwords, connection strings,
.env values, session cookies, or the host's own tenant/workspace ids and grants.

Every result is an envelope {ok, output | error, auditId}. Act on error.code and
error.retriable only. Use one idempotency_key per logical operation and reuse it, with identical
arguments, when you retry. JSON-RPC errors -32603 (trusted context unavailable) and -32602
(unknown tool) are not memory answers: stop and report them to the host operator. A -32603's
data.reason says why; for "no_elicitation" (withdraw or forget from a client that cannot ask a
human), give your human data.approve_with or data.page, then retry the same call.
"""


if __name__ == "__main__":  # regenerate the snapshot after a change to the contract models
    SNAPSHOT.write_text(snapshot_text(build_tools()), encoding="utf-8")
    sys.exit(0)

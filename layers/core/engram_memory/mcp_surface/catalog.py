"""What agents see: tool names, descriptions, annotations, schemas and server instructions."""

from __future__ import annotations

import json
from typing import Any, Final

import mcp.types as types

# Grant names (token claims) -> MCP tool names (CONTRACT.md §7, §12).
TOOL_NAMES: Final = {
    "search": "engram_memory_search",
    "get": "engram_memory_get",
    "capture": "engram_memory_capture",
    "request_admission": "engram_memory_request_admission",
    "withdraw": "engram_memory_withdraw",
    "forget": "engram_memory_forget",
}
GRANT_OF: Final = {name: grant for grant, name in TOOL_NAMES.items()}

_ERRORS: Final = (
    " Every result is an envelope: act on ok, error.code and error.retriable, never on the message."
    " retriable: back off and retry (for a mutation, with the same idempotency_key and identical"
    " arguments)."
)

DESCRIPTIONS: Final = {
    "search": (
        "Search durable, admitted memories of this workspace (decisions with their reasons, verified"
        " facts with citations, conventions, recurring pitfalls and fixes). Use it before capture, and"
        " before answering from assumptions. Returns only current accepted records, each with its"
        " citations, a score and a rank, plus a rank receipt. records: [] means no match."
        " STALE_PAGE: search again without page_cursor. PROJECTION_OVERSIZED / RESULT_TOO_LARGE: lower"
        " limit or raise max_packet_bytes. RANKING_UNAVAILABLE: retry, or ask for lexical ranking."
        + _ERRORS
    ),
    "get": (
        "Read one known record by record_id (copied exactly from search or admission), without ranking,"
        " with a read receipt. NOT_FOUND means unknown, out of your scope or no longer current —"
        " indistinguishable by design; do not probe variants." + _ERRORS
    ),
    "capture": (
        "Submit durable, cited knowledge worth finding again later (a decision and its reason, a"
        " verified fact with a source, a convention, a hand-off fact) as an encrypted PENDING candidate."
        " Search first: if an equivalent current record exists, cite its record_id instead. Never"
        " capture secrets, credentials, tokens, passwords, connection strings, .env values or the host's"
        " own ids; never capture chat transcripts, raw tool output, temporary task state or speculation."
        " A candidate is not searchable or readable until request_admission accepts it; a candidate_id"
        " is not a record_id. status committed_pending = new candidate; duplicate_exact = the same"
        " idempotency_key with the same content again (not a semantic duplicate check)."
        " DIGEST_CONFLICT: the key was used for other content. Omit retention and reconciliation unless"
        " instructed." + _ERRORS
    ),
    "request_admission": (
        "Ask the host's admission policy to decide on one of your pending candidates. You cannot supply"
        " or influence the decision; report the outcome exactly. accepted: the record is now current and"
        " outcome.record_id identifies it. rejected: the policy refused it (e.g. it held a secret); the"
        " candidate is destroyed. pending_adjudication: a human decides later; nothing was stored —"
        " including when forgotten content was captured again. These are successful outcomes, not"
        " errors. NOT_FOUND: unknown, not yours, or not pending." + _ERRORS
    ),
    "withdraw": (
        "End one of your pending candidates (for example captured by mistake) and crypto-shred it: its"
        " data key is destroyed, so it can never be read again. Needs a human's confirmation, which the"
        " host asks for; you cannot confirm yourself. gate_failed: the human declined or the confirmation"
        " failed — ask the human through the host, do not retry blindly. ALREADY_TERMINAL: already"
        " withdrawn or rejected. ILLEGAL_TRANSITION: it was admitted; use forget on its record."
        + _ERRORS
    ),
    "forget": (
        "Make an admitted record permanently ineligible: search and get stop returning it at once and"
        " the same content can never be admitted again without a human. Needs a human's confirmation,"
        " which the host asks for. gate_failed: declined or failed confirmation. ALREADY_TERMINAL: it"
        " was already forgotten. projection_invalidation pending/complete reports the index clean-up,"
        " which completes on its own." + _ERRORS
    ),
}

_TITLES: Final = {
    "search": "Search memory",
    "get": "Get a memory",
    "capture": "Capture a memory (pending)",
    "request_admission": "Request admission of a memory",
    "withdraw": "Withdraw a pending memory",
    "forget": "Forget a memory",
}


def _annotations(grant: str) -> types.ToolAnnotations:
    if grant in ("search", "get"):
        return types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    if grant in ("capture", "request_admission"):
        return types.ToolAnnotations(
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=True,
            open_world_hint=False,
        )
    return types.ToolAnnotations(
        read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
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


def build_tools() -> dict[str, types.Tool]:
    """Every tool, keyed by grant name, with schemas generated from the contract models."""
    from engram_memory.contract.schemas import input_schema, output_envelope_schema

    return {
        grant: types.Tool(
            name=name,
            title=_TITLES[grant],
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
(unknown tool) are not memory answers: stop and report them to the host operator.
"""

"""The result envelope every tool returns (CONTRACT.md §2)."""

from __future__ import annotations

from typing import Any

import orjson

from engram_memory.contract.canonical import canonical_bytes
from engram_memory.contract.errors import MESSAGES, RETRIABLE, ErrorCode

REDACTION_CLASS = "high"
OUTPUT_SCHEMA_VERSION = 1


def success(value: dict[str, Any], audit_id: str) -> dict[str, Any]:
    return {
        "ok": True,
        "output": {"schema_version": OUTPUT_SCHEMA_VERSION, "value": value},
        "auditId": audit_id,
        "redactionClass": REDACTION_CLASS,
    }


def failure(code: ErrorCode, audit_id: str) -> dict[str, Any]:
    """The failure envelope: its error object is closed (``code``, the code's one constant
    message, ``retriable``); what else is known (an ``INVALID_SCHEMA``'s field and rule) goes to
    the audit line under ``auditId``."""
    return {
        "ok": False,
        "auditId": audit_id,
        "redactionClass": REDACTION_CLASS,
        "error": {"code": code.value, "message": MESSAGES[code], "retriable": code in RETRIABLE},
    }


def envelope_json(envelope: dict[str, Any]) -> bytes:
    """The envelope's size on the wire: compact JSON, members in the order the envelope holds them
    (how the MCP SDK writes ``structuredContent``), for the transport ceiling. orjson, so the
    check does not walk the envelope in Python."""
    return orjson.dumps(envelope)


def envelope_text(envelope: dict[str, Any]) -> str:
    """The text content that repeats ``structuredContent``: the envelope as canonical JSON (one
    serialization for every transport; the canonical fast path is orjson behind a type check)."""
    return canonical_bytes(envelope).decode("utf-8")

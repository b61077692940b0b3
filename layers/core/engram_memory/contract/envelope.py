"""The result envelope every tool returns (CONTRACT.md §2)."""

from __future__ import annotations

from typing import Any

import orjson

from .errors import MESSAGES, RETRIABLE, ErrorCode

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
    return {
        "ok": False,
        "auditId": audit_id,
        "redactionClass": REDACTION_CLASS,
        "error": {"code": code.value, "message": MESSAGES[code], "retriable": code in RETRIABLE},
    }


def envelope_json(envelope: dict[str, Any]) -> bytes:
    """The envelope as compact JSON, members in the order the envelope holds them: the text
    content that repeats ``structuredContent`` (the order and spacing the MCP SDK gives that copy
    on the wire), and the size the transport ceiling is checked against. Not canonical JSON: the
    envelope is never digested, so nothing here walks it in Python."""
    return orjson.dumps(envelope)

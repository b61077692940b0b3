"""The one error tree of the contract.

Every failure an agent can see is either a *domain failure* (``EngramError``: a failure envelope
with a contract code and a retriable flag) or a *protocol refusal* (``ProtocolRefusal``: a JSON-RPC
error, not a tool result). Adapters translate vendor exceptions into the port-level exceptions of
``engine.ports``; the engine translates those into ``EngramError`` once. Messages are constant per
code: nothing from the input or from internals is ever echoed. One exception adds to it, never a
value: an ``INVALID_SCHEMA`` names the offending field as a JSON pointer and the rule it broke
(``schema_violation``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Final


class ErrorCode(StrEnum):
    INVALID_SCHEMA = "INVALID_SCHEMA"
    INVALID_DIGEST = "INVALID_DIGEST"
    DIGEST_CONFLICT = "DIGEST_CONFLICT"
    UNAUTHORIZED = "UNAUTHORIZED"
    AUTHORIZATION_EXPIRED = "AUTHORIZATION_EXPIRED"
    AUTHORIZATION_REVOKED = "AUTHORIZATION_REVOKED"
    NOT_FOUND = "NOT_FOUND"
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"
    ALREADY_TERMINAL = "ALREADY_TERMINAL"
    MUTATION_OUTCOME_UNKNOWN = "MUTATION_OUTCOME_UNKNOWN"
    GATE_FAILED = "gate_failed"
    STALE_PAGE = "STALE_PAGE"
    RESULT_TOO_LARGE = "RESULT_TOO_LARGE"
    PROJECTION_OVERSIZED = "PROJECTION_OVERSIZED"
    RATE_LIMITED = "RATE_LIMITED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    STORE_UNAVAILABLE = "STORE_UNAVAILABLE"
    FENCE_LOST = "FENCE_LOST"
    CURSOR_GAP = "CURSOR_GAP"
    POLICY_UNAVAILABLE = "POLICY_UNAVAILABLE"
    POLICY_STALE = "POLICY_STALE"
    PROJECTION_STALE = "PROJECTION_STALE"
    RANKING_UNAVAILABLE = "RANKING_UNAVAILABLE"
    CAPABILITY_UNAVAILABLE = "CAPABILITY_UNAVAILABLE"
    JOURNAL_CORRUPT = "JOURNAL_CORRUPT"
    BLOB_MISSING = "BLOB_MISSING"
    REGISTRY_VERSION_UNAVAILABLE = "REGISTRY_VERSION_UNAVAILABLE"
    BACKUP_INVALID = "BACKUP_INVALID"
    RESTORE_REFUSED = "RESTORE_REFUSED"
    MIGRATION_LEDGER_INVALID = "MIGRATION_LEDGER_INVALID"


RETRIABLE: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.MUTATION_OUTCOME_UNKNOWN,
        ErrorCode.RATE_LIMITED,
        ErrorCode.DEADLINE_EXCEEDED,
        ErrorCode.CANCELLED,
        ErrorCode.STORE_UNAVAILABLE,
        ErrorCode.FENCE_LOST,
        ErrorCode.CURSOR_GAP,
        ErrorCode.POLICY_UNAVAILABLE,
        ErrorCode.POLICY_STALE,
        ErrorCode.PROJECTION_STALE,
        ErrorCode.RANKING_UNAVAILABLE,
    }
)

# Constant, sanitized messages: clients act on ``code`` and ``retriable`` only.
MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.INVALID_SCHEMA: "The arguments do not match the closed input schema.",
    ErrorCode.INVALID_DIGEST: "A digest is malformed or does not bind what it claims.",
    ErrorCode.DIGEST_CONFLICT: "The idempotency key was already used with other content, target or tool.",
    ErrorCode.UNAUTHORIZED: "The host has not granted the authority this call needs.",
    ErrorCode.AUTHORIZATION_EXPIRED: "The host authorization has expired.",
    ErrorCode.AUTHORIZATION_REVOKED: "The host authorization has been revoked.",
    ErrorCode.NOT_FOUND: "The target is not available.",
    ErrorCode.ILLEGAL_TRANSITION: "The lifecycle does not allow this transition.",
    ErrorCode.ALREADY_TERMINAL: "The target is already in a terminal state.",
    ErrorCode.MUTATION_OUTCOME_UNKNOWN: "The mutation may have committed; retry with the same key and arguments.",
    ErrorCode.GATE_FAILED: "The confirmation or policy gate was not satisfied.",
    ErrorCode.STALE_PAGE: "The page cursor no longer matches; start a new search without page_cursor.",
    ErrorCode.RESULT_TOO_LARGE: "The result does not fit the transport ceiling; lower limit or max_packet_bytes.",
    ErrorCode.PROJECTION_OVERSIZED: "A record does not fit max_packet_bytes; raise max_packet_bytes.",
    ErrorCode.RATE_LIMITED: "Too many requests; back off and retry.",
    ErrorCode.DEADLINE_EXCEEDED: "The host deadline passed before the call completed.",
    ErrorCode.CANCELLED: "The host cancelled the call.",
    ErrorCode.STORE_UNAVAILABLE: "The store is unavailable; back off and retry.",
    ErrorCode.FENCE_LOST: "A concurrent writer holds the fence; retry.",
    ErrorCode.CURSOR_GAP: "The journal has a gap; retry.",
    ErrorCode.POLICY_UNAVAILABLE: "The admission policy is unavailable; retry.",
    ErrorCode.POLICY_STALE: "The admission policy changed during the decision; retry.",
    ErrorCode.PROJECTION_STALE: "A projection is behind the canonical store; retry.",
    ErrorCode.RANKING_UNAVAILABLE: "A required ranking channel is unavailable; retry or ask for lexical ranking.",
    ErrorCode.CAPABILITY_UNAVAILABLE: "A required capability is unavailable; report to the host operator.",
    ErrorCode.JOURNAL_CORRUPT: "The journal failed an integrity check; report to the host operator.",
    ErrorCode.BLOB_MISSING: "A stored blob is missing; report to the host operator.",
    ErrorCode.REGISTRY_VERSION_UNAVAILABLE: "The registry version is unavailable; report to the host operator.",
    ErrorCode.BACKUP_INVALID: "The backup is invalid; report to the host operator.",
    ErrorCode.RESTORE_REFUSED: "The restore was refused; report to the host operator.",
    ErrorCode.MIGRATION_LEDGER_INVALID: "The migration ledger is invalid; report to the host operator.",
}


class EngramError(Exception):
    """A domain failure: becomes a failure envelope carrying ``code`` and ``retriable``;
    ``violation`` (``INVALID_SCHEMA`` only: the field and the rule) follows the constant message."""

    def __init__(self, code: ErrorCode, violation: str | None = None) -> None:
        super().__init__(code.value)
        self.code = code
        self.violation = violation

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    @property
    def message(self) -> str:
        return MESSAGES[self.code]


# The rule a pydantic error type stands for, in words; ``{…}`` from the error's context, which
# holds the schema's bounds (numbers), never the input.
_RULES: Final[dict[str, str]] = {
    "missing": "is required",
    "extra_forbidden": "is not allowed (the schema is closed: no extra fields)",
    "string_too_short": "must be at least {min_length} characters",
    "string_too_long": "must be at most {max_length} characters",
    "too_short": "must have at least {min_length} items",
    "too_long": "must have at most {max_length} items",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "list_type": "must be an array",
    "none_required": "must be absent",
    "literal_error": "must be one of the values the schema lists",
    "enum": "must be one of the values the schema lists",
    "string_pattern_mismatch": "does not have the required format",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "unique_items": "must not repeat an item",
    # the contract's own rules (contract.types, contract.models)
    "null_value": "must be absent rather than null",
    "utf8_length": "must be {min_bytes}..{max_bytes} UTF-8 bytes",
    "not_nfc": "must be in Unicode NFC",
    "pattern": "does not have the required format",
    "not_distinct": "must hold distinct values",
    "instant": "must be a UTC instant written YYYY-MM-DDTHH:mm:ss.sssZ",
    "valid_time_order": "must not end before it starts",
    "family_refs_order": "must be sorted and unique",
    "duplicate_id": "repeats a citation or component id",
    "unresolved_citation": "cites a citation that the evidence does not hold",
    "unresolved_component": "names a component that the payload does not hold",
}
_SHOWN_NAME: Final = re.compile(r"^[A-Za-z0-9_]{1,64}$")


def _pointer(loc: Sequence[Any]) -> str:
    """RFC 6901 pointer to the field; a name that is not a plain identifier (the caller's own
    text, e.g. an extra key) is not shown."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
        elif isinstance(part, str) and _SHOWN_NAME.match(part):
            parts.append(part)
        elif isinstance(part, str) and "[" in part:  # pydantic's tag of a union branch
            continue
        else:
            parts.append("(a name not shown)")
    return "/" + "/".join(parts) if parts else ""


def _rule(kind: str, context: Mapping[str, Any]) -> str:
    template = _RULES.get(kind)
    if template is None:
        return "breaks a rule of the contract (a bound, NFC, a cross-reference or a format)"
    bounds = {k: v for k, v in context.items() if isinstance(v, int | float)}
    try:
        return template.format(**bounds)
    except (KeyError, IndexError):
        return template.split(" {", 1)[0]


def schema_violation(errors: Sequence[Mapping[str, Any]]) -> str:
    """``At /field: the rule.`` for the first violation (pydantic's ``errors()``), and how many
    more there are; never an input value."""
    first = errors[0]
    where = _pointer(first.get("loc", ())) or "the top level"
    text = f"At {where}: {_rule(str(first.get('type', '')), first.get('ctx') or {})}."
    more = len(errors) - 1
    return text + (f" ({more} more violation{'s' if more > 1 else ''}.)" if more else "")


TRUSTED_CONTEXT_UNAVAILABLE = "Trusted invocation context unavailable"
UNKNOWN_TOOL = "Unknown tool"


class ProtocolRefusal(Exception):
    """A refusal that is a JSON-RPC error, not a tool result (CONTRACT.md §1.1)."""

    jsonrpc_code: int = -32603
    message: str = TRUSTED_CONTEXT_UNAVAILABLE

    def __init__(self) -> None:
        super().__init__(self.message)


class TrustedContextUnavailable(ProtocolRefusal):
    """-32603: missing or invalid host context, purpose/principal/tenant mismatch, no confirmation channel."""

    jsonrpc_code = -32603
    message = TRUSTED_CONTEXT_UNAVAILABLE


class NoConfirmationChannel(TrustedContextUnavailable):
    """-32603 for a call that needs a human's confirmation and a client that cannot ask one.

    The message is the constant one followed by what a person can do instead (``route``: e.g.
    the host's terminal command), so the agent can tell its human; it never holds input."""

    def __init__(self, route: str) -> None:
        self.message = f"{TRUSTED_CONTEXT_UNAVAILABLE}: {route}"
        super().__init__()


class UnknownTool(ProtocolRefusal):
    """-32602: the tool is not granted, or is not one of the six."""

    jsonrpc_code = -32602
    message = UNKNOWN_TOOL

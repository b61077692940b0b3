"""The one error tree of the contract.

Every failure an agent can see is either a *domain failure* (``EngramError``: a failure envelope
with a contract code and a retriable flag) or a *protocol refusal* (``ProtocolRefusal``: a JSON-RPC
error, not a tool result). Adapters translate vendor exceptions into the port-level exceptions of
``engine.ports``; the engine translates those into ``EngramError`` once. Messages are constant per
code: nothing from the input or from internals is ever echoed.
"""

from __future__ import annotations

from enum import StrEnum


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
    """A domain failure: becomes a failure envelope carrying ``code`` and ``retriable``."""

    def __init__(self, code: ErrorCode) -> None:
        super().__init__(code.value)
        self.code = code

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    @property
    def message(self) -> str:
        return MESSAGES[self.code]


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

"""The one error tree of the contract.

Every failure an agent can see is either a *domain failure* (``EngramError``: a failure envelope
with a contract code and a retriable flag) or a *protocol refusal* (``ProtocolRefusal``: a JSON-RPC
error, not a tool result). Adapters translate vendor exceptions into the port-level exceptions of
``engine.ports``; the engine translates those into ``EngramError`` once. Messages are constant per
code, on both hosts: nothing from the input or from internals is ever echoed, and clients act on
the code alone (CONTRACT.md §1.1, §2).

What helps beyond the code goes elsewhere, never into a message:

- an ``INVALID_SCHEMA``'s first offending field (a JSON pointer) and the rule it broke
  (``Violation``, from ``schema_violation``) go to the call's audit line, for the operator;
- a ``-32603``'s reason (``RefusalReason``, a closed set) and, for a confirmation no client can
  ask, what a person can do instead go to the JSON-RPC error's ``data`` (``ProtocolRefusal.data``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Violation:
    """Where the arguments broke the closed schema (``INVALID_SCHEMA``): the call's audit line
    holds it (``AuditEvent.violation``), the envelope never does.

    ``pointer``: RFC 6901 pointer to the first offending field ("" is the top level), a name
    that is not a plain identifier shown as ``(a name not shown)``; ``rule``: one of ``RULES``;
    ``says``: the rule in words, with the schema's bounds (never an input value); ``more``: how
    many other violations the arguments hold."""

    pointer: str
    rule: str
    says: str
    more: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"pointer": self.pointer, "rule": self.rule, "says": self.says, "more": self.more}


class EngramError(Exception):
    """A domain failure: becomes a failure envelope carrying ``code``, its constant message and
    ``retriable``; ``violation`` (``INVALID_SCHEMA`` only) goes to the audit line."""

    def __init__(self, code: ErrorCode, violation: Violation | None = None) -> None:
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
    # the engine's own checks before the models (engine.service)
    "not_one_object": "must be one JSON object (no duplicate keys, no -0, no lone surrogate)",
    "too_large": "must be at most {max_bytes} bytes of JSON",
    # a rule the table does not name
    "other": "breaks a rule of the contract (a bound, NFC, a cross-reference or a format)",
}
# The closed set of ``Violation.rule``.
RULES: Final = frozenset(_RULES)
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


def _says(rule: str, context: Mapping[str, Any]) -> str:
    template = _RULES[rule]
    bounds = {k: v for k, v in context.items() if isinstance(v, int | float)}
    try:
        return template.format(**bounds)
    except (KeyError, IndexError):
        return template.split(" {", 1)[0]


def top_level_violation(rule: str, **bounds: int) -> Violation:
    """A violation of the arguments as a whole (``not_one_object``, ``too_large``)."""
    return Violation(pointer="", rule=rule, says=_says(rule, bounds))


def schema_violation(errors: Sequence[Mapping[str, Any]]) -> Violation:
    """The first violation (pydantic's ``errors()``) as a ``Violation``, and how many more
    there are; never an input value."""
    first = errors[0]
    kind = str(first.get("type", ""))
    rule = kind if kind in _RULES else "other"
    return Violation(
        pointer=_pointer(first.get("loc", ())),
        rule=rule,
        says=_says(rule, first.get("ctx") or {}),
        more=len(errors) - 1,
    )


TRUSTED_CONTEXT_UNAVAILABLE: Final = "Trusted invocation context unavailable"
UNKNOWN_TOOL: Final = "Unknown tool"


class RefusalReason(StrEnum):
    """Why a call was refused with ``-32603``: its JSON-RPC error's ``data.reason``.

    A closed set (docs/contract.md §1, "Protocol errors"); each value names something the caller,
    its human or the host's operator can act on, and none says anything about another tenant (a
    token bound to any tenant but the host's is ``tenant_mismatch``, whether that tenant exists
    or not):

    - ``missing_token``: no bearer token reached the server (stdio: ``ENGRAM_TOKEN`` unset);
    - ``invalid_token``: malformed, badly signed, not for this service, not yet valid, or its
      claims are malformed;
    - ``token_expired``: its ``exp`` has passed (the host mints a new one);
    - ``maintenance_token``: it carries a maintenance grant, never used on the agent path;
    - ``tenant_mismatch``: it binds a tenant that is not this host's;
    - ``purpose_mismatch``: the arguments' ``purpose_ref`` is not the one the token binds;
    - ``no_elicitation``: a person must confirm the call and this client cannot ask one;
    - ``internal_error``: the host failed to serve the call (report it to the host's operator).
    """

    MISSING_TOKEN = "missing_token"  # noqa: S105 - a reason's name, not a secret
    INVALID_TOKEN = "invalid_token"  # noqa: S105
    TOKEN_EXPIRED = "token_expired"  # noqa: S105
    MAINTENANCE_TOKEN = "maintenance_token"  # noqa: S105
    TENANT_MISMATCH = "tenant_mismatch"
    PURPOSE_MISMATCH = "purpose_mismatch"
    NO_ELICITATION = "no_elicitation"
    INTERNAL_ERROR = "internal_error"


# The keys ``ProtocolRefusal.data`` may hold: a closed set, each value a string.
REFUSAL_DATA_KEYS: Final = ("reason", "approval_id", "approve_with", "page")


class ProtocolRefusal(Exception):
    """A refusal that is a JSON-RPC error, not a tool result (CONTRACT.md §1.1): its ``message``
    is the code's constant one, what helps beyond the code is in ``data``."""

    jsonrpc_code: int = -32603
    message: str = TRUSTED_CONTEXT_UNAVAILABLE

    def __init__(self) -> None:
        super().__init__(self.message)

    @property
    def data(self) -> dict[str, str] | None:
        """The JSON-RPC error's ``data`` object (None: the error has none)."""
        return None


class TrustedContextUnavailable(ProtocolRefusal):
    """-32603: missing or invalid host context, a purpose or tenant mismatch, a maintenance
    token, a confirmation no client can ask, a host failure; ``reason`` says which."""

    jsonrpc_code = -32603
    message = TRUSTED_CONTEXT_UNAVAILABLE

    def __init__(self, reason: RefusalReason) -> None:
        super().__init__()
        self.reason = reason

    @property
    def data(self) -> dict[str, str]:
        return {"reason": self.reason.value}


class NoConfirmationChannel(TrustedContextUnavailable):
    """-32603 for a call that needs a human's confirmation and a client that cannot ask one.

    ``data`` says what a person can do instead, when the host knows: the question it opened
    (``approval_id``), the host's command that answers it (``approve_with``, the bare program
    name: never a path) and the approval page (``page``). Never an input value."""

    def __init__(
        self,
        *,
        approval_id: str | None = None,
        approve_with: str | None = None,
        page: str | None = None,
    ) -> None:
        super().__init__(RefusalReason.NO_ELICITATION)
        self.hints = {
            key: value
            for key, value in (
                ("approval_id", approval_id),
                ("approve_with", approve_with),
                ("page", page),
            )
            if value
        }

    @property
    def data(self) -> dict[str, str]:
        return {"reason": self.reason.value, **self.hints}


def refusal_of_data(data: object) -> TrustedContextUnavailable:
    """The ``-32603`` a ``data`` object from another process stands for (the cloud's tool
    function answers one to its adapter): only the closed keys and reasons, strings only,
    ``approve_with`` without a path and ``page`` an https or http URL; a reason outside the set
    is ``internal_error``."""
    if not isinstance(data, Mapping):
        return TrustedContextUnavailable(RefusalReason.INTERNAL_ERROR)
    try:
        reason = RefusalReason(str(data.get("reason")))
    except ValueError:
        return TrustedContextUnavailable(RefusalReason.INTERNAL_ERROR)
    if reason is not RefusalReason.NO_ELICITATION:
        return TrustedContextUnavailable(reason)
    hints = {key: data.get(key) for key in REFUSAL_DATA_KEYS[1:]}
    shown = {key: value for key, value in hints.items() if isinstance(value, str)}
    if "/" in shown.get("approve_with", ""):
        shown.pop("approve_with")
    if not shown.get("page", "https://").startswith(("https://", "http://")):
        shown.pop("page")
    return NoConfirmationChannel(**shown)


class UnknownTool(ProtocolRefusal):
    """-32602: the tool is not granted, or is not one of the six."""

    jsonrpc_code = -32602
    message = UNKNOWN_TOOL

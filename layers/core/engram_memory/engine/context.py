"""The trusted context the host binds to every call (CONTRACT.md §1).

The MCP surface fills it from verified token claims; nothing in it ever comes from tool arguments.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Final, Protocol

TOOLS: Final = ("search", "get", "capture", "request_admission", "withdraw", "forget")
ALWAYS_CONFIRMED: Final = frozenset({"withdraw", "forget"})
CONFIRMABLE: Final = frozenset({"capture", "request_admission"})


@dataclass(frozen=True, slots=True)
class Scope:
    tenant_id: str
    workspace_id: str


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """The host's retention policy: may the agent ask to retain, and the expiry ceiling."""

    allow_retain: bool = False
    max_expires_in_s: int = 31_536_000  # 365 days, the embedded default


class Cancellation(Protocol):
    @property
    def cancelled(self) -> bool: ...


@dataclass(slots=True)
class CancellationFlag:
    """A simple settable cancellation token."""

    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass(frozen=True, slots=True)
class TrustedContext:
    tenant_id: str
    workspace_id: str
    principal: str
    purpose_ref: str
    audit_id: str
    grants: frozenset[str] = frozenset(TOOLS)
    confirm_required: frozenset[str] = frozenset()
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    reconcile_consent: bool = False
    agent_id: str | None = None
    session_id: str | None = None
    deadline_ms: int | None = None  # absolute, on the engine's clock
    cancellation: Cancellation | None = None
    # Host binding facts that must never be stored (e.g. the bearer token the call came with).
    host_facts: tuple[str, ...] = ()
    # The credential the call came with (a token's ``jti`` and issue time), checked against the
    # operator's revocations on every call; None for contexts that no credential carries.
    credential_id: str | None = None
    credential_issued_at_ms: int | None = None

    @property
    def scope(self) -> Scope:
        return Scope(self.tenant_id, self.workspace_id)

    def needs_confirmation(self, tool: str) -> bool:
        return tool in ALWAYS_CONFIRMED or tool in self.confirm_required


def new_audit_id() -> str:
    """A fresh audit id (``aud_`` + 32 hex): minted by the server for every call."""
    return "aud_" + uuid.uuid4().hex

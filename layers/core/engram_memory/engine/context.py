"""The trusted context the host binds to every call (CONTRACT.md §1).

The MCP surface fills it from verified token claims; nothing in it ever comes from tool arguments.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from engram_memory.contract.models import INPUT_MODELS

# The grant names of the tools, in the contract's order: a tool exists once it has an input model.
TOOLS: Final = tuple(INPUT_MODELS)
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


@dataclass(frozen=True, slots=True)
class HostFactDigests:
    """Keyed digests of host binding facts (the bearer token): what leaves the process instead.

    A fact itself (a credential) never crosses a process boundary: the cloud adapter sends these
    to the tool functions, and from there they reach the Step Functions execution input, where
    anyone with ``states:DescribeExecution`` could read them for 90 days. Each digest is
    HMAC-SHA256 of the case-folded fact under ``key``, random per call: it names the fact for
    ``matches`` and for nothing else (it cannot be presented as a bearer token, nor correlated
    across calls).
    """

    key: bytes
    digests: frozenset[str]

    @classmethod
    def of(cls, facts: Iterable[str], key: bytes | None = None) -> HostFactDigests:
        key = key if key is not None else os.urandom(32)
        return cls(key, frozenset(_keyed(key, fact) for fact in facts))

    def matches(self, text: str) -> bool:
        """Is ``text`` (case-insensitively) one of the facts?"""
        return _keyed(self.key, text) in self.digests


def _keyed(key: bytes, fact: str) -> str:
    return hmac.new(key, fact.strip().casefold().encode("utf-8"), hashlib.sha256).hexdigest()


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
    # Host binding facts that must never be stored (e.g. the bearer token the call came with):
    # in the process that verified them as themselves, beyond it as keyed digests.
    host_facts: tuple[str, ...] = ()
    host_fact_digests: HostFactDigests | None = None
    # The credential the call came with (a token's ``jti`` and issue time), checked against the
    # operator's revocations on every call; None for contexts that no credential carries.
    credential_id: str | None = None
    credential_issued_at_ms: int | None = None
    # Who answers this principal's confirmations on the cloud approval page: the subject the
    # operator named in the agent's verified token (its approver claim); None: the principal
    # itself, signing in as a person. The embedded host does not read it (its code is the proof).
    approver: str | None = None

    # The constructors below are the only places a context is made (a guard test holds every
    # module of the package to them): a new field is added here, in the token's claims
    # (``binding.tokens``) and, if it crosses to the tool functions, in the cloud's invocation.

    @classmethod
    def bound(
        cls,
        scope: Scope,
        principal: str,
        purpose_ref: str,
        *,
        audit_id: str | None = None,
        **facts: Any,
    ) -> TrustedContext:
        """A context for ``principal`` in ``scope``; a fresh audit id unless one is given.

        ``facts`` are the other fields, by name, as a verified credential or the host gives
        them (grants, retention, the credential's id, …); a field it does not name keeps its
        default.
        """
        return cls(
            tenant_id=scope.tenant_id,
            workspace_id=scope.workspace_id,
            principal=principal,
            purpose_ref=purpose_ref,
            audit_id=audit_id if audit_id is not None else new_audit_id(),
            **facts,
        )

    @classmethod
    def for_operator(
        cls, scope: Scope, principal: str, purpose_ref: str, grants: Iterable[str] = TOOLS
    ) -> TrustedContext:
        """An operator's seat acting in ``scope`` (its decisions, inspections, imports): no
        credential, no deadline, only ``grants``."""
        return cls.bound(scope, principal, purpose_ref, grants=frozenset(grants))

    @classmethod
    def unbound(cls, audit_id: str) -> TrustedContext:
        """The context of a call refused before anything bound it (no tenant, no principal):
        what its audit line is written under."""
        return cls(tenant_id="", workspace_id="", principal="", purpose_ref="", audit_id=audit_id)

    @property
    def scope(self) -> Scope:
        return Scope(self.tenant_id, self.workspace_id)

    def needs_confirmation(self, tool: str) -> bool:
        return tool in ALWAYS_CONFIRMED or tool in self.confirm_required


def new_audit_id() -> str:
    """A fresh audit id (``aud_`` + 32 hex): minted by the server for every call."""
    return "aud_" + uuid.uuid4().hex

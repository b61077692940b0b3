"""Where an operator acts: the port each host implements once for the operator plane.

An ``OperatorSeat`` is one host's data opened for one operator: the embedded host's data
directory (``embedded.operator_seat``) or a deployed stack reached with the operator's AWS
credentials (``cloud.operator``). The operator's use cases (``operator_plane.inspection``,
``decisions``) run on the seat's engine through ``call``; what differs by host — how a backup
is taken and restored, how keys rotate, how the search index is rebuilt, where the audit lives,
where the admission policy is set — is one method each. The command line (``operator_plane.commands``) is the one
front end over both.

Failures a seat raises:

- ``EngramError`` (and ``OperationRefused``): a contract failure, printed as
  ``<what> failed: <code>: <detail>`` (exit 1);
- ``SeatFailure``: the host could not do it (a stack that does not exist, AWS refusing the
  operator's role, an operation this host does not have), one line for a person (exit 1);
- ``UsageError``: the operator asked for something malformed (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from engram_memory.engine.context import Scope
    from engram_memory.engine.kernel import Kernel

__all__ = ["AuditPage", "OperatorSeat", "SeatFailure", "UsageError"]

T = TypeVar("T")

# A use case as the seat runs it: (engine, the workspace's scope, the operator) -> result.
UseCase = Callable[["Kernel", "Scope", str], T]


class UsageError(Exception):
    """Bad input from the operator: one line, exit code 2."""


class SeatFailure(Exception):
    """The host could not do what was asked: one line for a person, exit code 1."""


@dataclass(frozen=True, slots=True)
class AuditPage:
    """The most recent audit entries (ids and outcomes, never content)."""

    entries: list[dict[str, Any]]
    total: int
    unreadable: int = 0
    source: str = ""
    empty_reason: str | None = None  # set when there is no audit yet
    warnings: list[str] = field(default_factory=list)


class OperatorSeat(Protocol):
    """One host's data, opened for one operator."""

    @property
    def operator(self) -> str:
        """Who acts, as audited (a login, an IAM caller ARN)."""
        ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def notes(self) -> list[str]:
        """What the operator should know after the operation (printed on stderr)."""
        ...

    def call(self, workspace: str, run: UseCase[T], *, mutates: bool) -> T:
        """Run a use case on the seat's engine in ``workspace``; an operation that ``mutates``
        has its projection changes applied before the call returns (or the host says when)."""
        ...

    def backup(self, target: str | None) -> dict[str, Any]: ...

    def restore(self, source: str, *, new_keys: bool) -> dict[str, Any]: ...

    def rotate_keys(self) -> dict[str, Any]: ...

    def token_issued(self, token_id: str) -> bool | None:
        """Whether this host's issuer minted ``token_id``: None when it cannot tell (tokens from
        an external identity provider), so a revocation by id goes ahead."""
        ...

    def reindex(self, workspace: str) -> dict[str, Any]: ...

    def audit(self, limit: int) -> AuditPage: ...

    def policy_lines(self) -> list[str]:
        """The admission policy and ceilings, one line each."""
        ...

    def set_admission_mode(self, mode: str) -> list[str]: ...

    def smoke(self, token: str, endpoint: str | None, say: Callable[[str], None]) -> dict[str, Any]:
        """The six tools through the host's deployed API with an agent's ``token``, each step
        ``say``-ed as it happens; its document (a failed step: ``SeatFailure``)."""
        ...

    def close(self) -> None: ...

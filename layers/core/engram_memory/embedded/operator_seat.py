"""The embedded host's operator seat: a data directory, for ``engram-memory admin``.

Implements ``operator_plane.seat.OperatorSeat`` over the data directory: the use cases run on an
engine opened for the one call (``open_existing``: the operations plane never creates a data
directory, except ``restore``'s target), the host-wide operations are the embedded ones
(``embedded.backup``, ``embedded.rotation``), the audit is the data directory's audit log and
the admission policy is ``host.json``'s. Inside a running server (its console) the use cases
run on the server's own engine (``opened``) instead.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from engram_memory.operator_plane.commands import command_name
from engram_memory.operator_plane.seat import AuditPage, SeatFailure, UsageError

if TYPE_CHECKING:
    from engram_memory.binding.host_config import HostConfig
    from engram_memory.embedded.composition import EmbeddedHost
    from engram_memory.engine.context import Scope
    from engram_memory.engine.kernel import Kernel
    from engram_memory.operator_plane.seat import UseCase

__all__ = ["DataDirSeat"]

T = TypeVar("T")


class DataDirSeat:
    """The data directory ``data_dir``, opened for ``operator`` (``opened``: the engine of the
    server that serves it, for its console; else one is opened for each call)."""

    def __init__(
        self,
        data_dir: Path,
        operator: str | None,
        *,
        opened: Callable[[], EmbeddedHost] | None = None,
    ) -> None:
        if operator is not None and not operator.strip():
            raise UsageError("--operator must not be empty")
        self._data_dir = Path(data_dir)
        self._operator = operator or "operator"
        self._opened = opened
        self.notes: list[str] = []

    @property
    def operator(self) -> str:
        return self._operator

    @property
    def tenant_id(self) -> str:
        return self._config().tenant_id

    def _existing(self) -> Path:
        """The data directory of an operation that needs an initialised one."""
        if not self._data_dir.is_dir():
            raise UsageError(
                f"no Engram Memory data directory at {self._data_dir};"
                f" run `{command_name()} init --data-dir {self._data_dir}` first"
            )
        return self._data_dir

    def _config(self) -> HostConfig:
        from engram_memory.embedded.host_file import load_host_config

        return load_host_config(self._existing())

    def call(self, workspace: str, run: UseCase[T], *, mutates: bool) -> T:
        from engram_memory.embedded.composition import open_existing
        from engram_memory.engine.context import Scope

        config = self._config()
        scope = Scope(config.tenant_id, workspace)
        if self._opened is not None:
            engine = self._opened().engine
            result = run(engine, scope, self._operator)
            engine.drain_outbox()
            return result
        host = open_existing(self._data_dir, config=config)
        try:
            result = run(host.engine, scope, self._operator)
            host.engine.drain_outbox()  # the projections follow before the command returns
            self._note_unknown(host.engine, scope)
            return result
        finally:
            host.close()

    def _note_unknown(self, engine: Kernel, scope: Scope) -> None:
        """A workspace nothing here names (a typo, most likely) is said, not shown empty."""
        from engram_memory.embedded.issuer_keys import token_workspaces
        from engram_memory.operator_plane.inspection import workspaces
        from engram_memory.operator_plane.text import cell

        known = set(workspaces(engine, scope.tenant_id)) | token_workspaces(self._data_dir)
        if scope.workspace_id in known or not known:
            return
        self.notes.append(
            f"no records, captures or tokens in workspace {cell(scope.workspace_id)};"
            f" known: {', '.join(cell(name) for name in sorted(known))}"
        )

    def backup(self, target: str | None) -> dict[str, Any]:
        from engram_memory.embedded.backup import backup

        if target is None:
            raise UsageError("name the backup FILE to write")
        return backup(self._existing(), Path(target), self._operator)

    def restore(self, source: str, *, new_keys: bool) -> dict[str, Any]:
        from engram_memory.embedded.backup import restore
        from engram_memory.embedded.data_dir_lease import DataDirectoryBusy, acquire_lease

        target = self._data_dir
        if not target.is_dir():  # nothing can be serving a directory that does not exist yet
            return restore(Path(source), target, self._operator, new_keys=new_keys)
        try:
            with acquire_lease(target, "`engram-memory admin restore`"):
                return restore(Path(source), target, self._operator, new_keys=new_keys)
        except DataDirectoryBusy as busy:
            raise self._busy(
                busy, f"restore {source}", " (or restore into a new data directory)"
            ) from None

    def rotate_keys(self) -> dict[str, Any]:
        from engram_memory.embedded.data_dir_lease import DataDirectoryBusy
        from engram_memory.embedded.rotation import rotate_keys

        try:
            return rotate_keys(self._existing(), self._operator)
        except DataDirectoryBusy as busy:
            raise self._busy(busy, "keys rotate") from None

    def _busy(self, busy: Exception, command: str, aside: str = "") -> SeatFailure:
        """The one line of a command refused because another process holds the directory."""
        return SeatFailure(
            f"{busy}; nothing was changed. Stop it, then run"
            f" `{command_name()} admin {command} --data-dir {self._data_dir}` again{aside}"
        )

    def token_issued(self, token_id: str) -> bool | None:
        from engram_memory.embedded.issuer_keys import token_issued

        return token_issued(self._existing(), token_id)

    def reindex(self, workspace: str) -> dict[str, Any]:
        from engram_memory.operator_plane.repair import reindex

        return self.call(
            workspace,
            lambda engine, scope, _operator: {
                "workspace": workspace,
                **reindex(engine, scope).as_dict(),
            },
            mutates=False,
        )

    def audit(self, limit: int) -> AuditPage:
        from engram_memory.adapters.local.audit import audit_lines
        from engram_memory.embedded.data_dir import AUDIT_FILE

        path = self._existing() / AUDIT_FILE
        if not path.exists() and not any(path.parent.glob(f"{AUDIT_FILE}.*")):
            return AuditPage([], 0, empty_reason=f"no audit entries yet ({path} does not exist)")
        rows: list[dict[str, Any]] = []
        unreadable = 0
        for line in audit_lines(path):  # the gzip'd segments, then audit.log
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = None
            if isinstance(entry, dict):
                rows.append(entry)
            else:
                unreadable += 1
        return AuditPage(rows[-limit:], len(rows), unreadable, str(path))

    def policy_lines(self) -> list[str]:
        from engram_memory.embedded.data_dir import host_config_path

        config = self._config()
        path = host_config_path(self._data_dir)
        policy = config.admission_policy()
        written = "" if path.exists() else " (not written yet: defaults)"
        rules = [f"  - {rule.name} ({rule.kind})" for rule in policy.host_rules]
        return [
            f"host configuration: {path}{written}",
            f"admission mode: {policy.mode}",
            f"policy version: {policy.version()}",
            *(["host rules:", *rules] if rules else ["host rules: none"]),
            f"retention: allow_retain={str(config.retention.allow_retain).lower()},"
            f" max_expires_in_s={config.retention.max_expires_in_s}",
            f"reconciliation consent: {str(config.reconcile_consent).lower()}",
            f"resource: {config.resource}",
            f"issuer: {config.issuer}",
            f"tenant: {config.tenant_id}",
        ]

    def set_admission_mode(self, mode: str) -> list[str]:
        from engram_memory.binding.host_config import HostConfig
        from engram_memory.embedded.host_file import save_host_config

        config = self._config()
        previous = config.admission.mode
        updated = HostConfig.model_validate(
            {**config.model_dump(), "admission": {**config.admission.model_dump(), "mode": mode}}
        )
        path = save_host_config(self._data_dir, updated)
        return [
            f"admission mode: {updated.admission.mode} (was {previous}), saved to {path}",
            "A running server applies it from its next call.",
        ]

    def smoke(self, token: str, endpoint: str | None, say: Callable[[str], None]) -> dict[str, Any]:
        raise UsageError(
            "smoke runs the six tools through a deployed stack's API: `admin --stack NAME smoke`"
            " (on this host, `tour` walks them against the engine)"
        )

    def close(self) -> None:
        """Nothing stays open between calls: each opens and closes its own engine."""

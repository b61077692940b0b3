"""The embedded host's configuration file, ``<data_dir>/host.json``: closed (an unknown key is an
error), written atomically with mode 0600; a missing file means "all defaults".

A running server reads its admission policy from the file as it is at each call
(``LiveAdmissionPolicy``), so ``admin policy set`` applies at the server's next call.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from engram_memory.adapters.local.private_files import write_private_file
from engram_memory.binding.host_config import HostConfig, describe_validation_error
from engram_memory.embedded.data_dir import host_config_path
from engram_memory.embedded.errors import HostConfigError
from engram_memory.engine.ports import AnticipatingPolicy

if TYPE_CHECKING:
    from engram_memory.engine.ports import AdmissionPolicy, AdmissionRequest, PolicyDecision

__all__ = [
    "LiveAdmissionPolicy",
    "host_config_of",
    "host_config_text",
    "load_host_config",
    "save_host_config",
]


def load_host_config(data_dir: Path) -> HostConfig:
    """Read ``<data_dir>/host.json``; a missing file gives the defaults.

    Raises ``HostConfigError`` (with a message for a person) when the file cannot be read, is not
    JSON, or does not describe a valid configuration.
    """
    path = host_config_path(data_dir)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return HostConfig()
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else "unreadable"
        raise HostConfigError(f"cannot read the host configuration {path}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise HostConfigError(
            f"the host configuration {path} is not valid JSON"
            f" (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    if not isinstance(data, dict):
        raise HostConfigError(f"the host configuration {path} must hold a JSON object")
    try:
        return HostConfig.model_validate(data)
    except ValidationError as error:
        raise HostConfigError(
            f"the host configuration {path} is invalid: {describe_validation_error(error)}"
        ) from None


def host_config_text(config: HostConfig) -> str:
    """``config`` as ``host.json`` holds it (a backup carries the same text)."""
    return json.dumps(config.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"


def host_config_of(text: str, where: str) -> HostConfig:
    """The configuration ``text`` (``host.json``'s form) describes; ``HostConfigError`` naming
    ``where`` it came from otherwise."""
    try:
        return HostConfig.model_validate_json(text)
    except ValidationError as error:
        raise HostConfigError(
            f"the host configuration in {where} is invalid: {describe_validation_error(error)}"
        ) from None


def save_host_config(data_dir: Path, config: HostConfig) -> Path:
    """Write ``config`` to ``<data_dir>/host.json`` atomically (mode 0600); returns the path."""
    path = host_config_path(data_dir)
    write_private_file(path, host_config_text(config).encode("utf-8"), replace=True)
    return path


_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    """What changes when ``host.json`` is rewritten (it is replaced by a rename: a new inode)."""
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size


class LiveAdmissionPolicy:
    """The admission policy ``host.json`` describes now: read again whenever the file changed
    (one ``stat`` per decision), so an operator's ``admin policy set`` reaches a running server
    at its next call without a restart. A file made invalid meanwhile keeps the last valid policy
    in force (said once on stderr): a typo never opens the gate wider or stops the server."""

    def __init__(self, data_dir: Path, current: AdmissionPolicy) -> None:
        self._data_dir = Path(data_dir)
        self._path = host_config_path(data_dir)
        self._seen = _stamp(self._path)
        self._policy = current
        self.policy_id = current.policy_id
        self._lock = threading.Lock()

    def _current(self) -> AdmissionPolicy:
        stamp = _stamp(self._path)
        if stamp == self._seen:
            return self._policy
        with self._lock:
            if stamp != self._seen:
                try:
                    self._policy = load_host_config(self._data_dir).admission_policy()
                except (HostConfigError, ValueError, TypeError) as error:
                    print(
                        f"engram-memory: {error}; the admission policy in force is unchanged",
                        file=sys.stderr,
                        flush=True,
                    )
                self._seen = stamp
            return self._policy

    def version(self) -> str:
        return self._current().version()

    def decide(self, request: AdmissionRequest) -> PolicyDecision:
        return self._current().decide(request)

    def anticipate(self, request: AdmissionRequest) -> None:
        policy = self._current()
        if isinstance(policy, AnticipatingPolicy):
            policy.anticipate(request)

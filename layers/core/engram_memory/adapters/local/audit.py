"""Audit sinks: an append-only JSON-lines file for the embedded mode, and an in-memory list.

An audit event holds ids, the outcome code and digests; never content, never tokens.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ...contract.types import format_instant
from ...engine.ports import AuditEvent


def audit_line(event: AuditEvent) -> dict[str, Any]:
    data = asdict(event)
    data["at"] = format_instant(data.pop("at_ms"))
    data["digests"] = dict(event.digests)
    return data


class JsonlAuditLog:
    """Appends one JSON object per call to ``path`` (owner-only permissions), fsync'd per line."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)

    def record(self, event: AuditEvent) -> None:
        line = json.dumps(audit_line(event), sort_keys=True, separators=(",", ":")) + "\n"
        with self._lock:
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self) -> list[dict[str, Any]]:
        with self._lock, self._path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]


class MemoryAuditLog:
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self._lock = threading.Lock()

    def record(self, event: AuditEvent) -> None:
        with self._lock:
            self.events.append(event)

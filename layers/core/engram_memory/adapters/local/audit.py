"""Audit sinks: an append-only JSON-lines file for the embedded mode, and an in-memory list.

An audit event holds ids, the outcome code and digests; never content, never tokens.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...contract.types import format_instant
from ...engine.ports import AuditEvent


def audit_line(event: AuditEvent) -> dict[str, Any]:
    data = asdict(event)
    data["at"] = format_instant(data.pop("at_ms"))
    data["digests"] = dict(event.digests)
    return data


@dataclass
class _Batch:
    """Lines written together with one ``fsync``; their callers wait for it."""

    lines: list[bytes] = field(default_factory=list)
    done: bool = False
    error: OSError | None = None


class JsonlAuditLog:
    """Appends one JSON object per call to ``path`` (owner-only permissions).

    Lines are group-committed: ``record`` returns only once its line is written and fsync'd (the
    durability of a line per ``fsync`` is unchanged), but the callers that arrive while a batch is
    being synced share the next ``fsync`` instead of queueing one each. The first waiting caller
    writes the batch; the others wait for it and see its error, if any, as their own.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()  # read() against a batch being written
        self._turn = threading.Condition()
        self._open: _Batch | None = None  # the batch new lines join
        self._syncing = False
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)

    def record(self, event: AuditEvent) -> None:
        line = json.dumps(audit_line(event), sort_keys=True, separators=(",", ":")) + "\n"
        with self._turn:
            if self._open is None:
                self._open = _Batch()
            mine = self._open
            mine.lines.append(line.encode("utf-8"))
            while not mine.done:
                if self._syncing:
                    self._turn.wait()
                    continue
                # The caller's own batch is still open: no writer has taken it yet.
                batch, self._open, self._syncing = self._open or mine, None, True
                self._turn.release()
                try:
                    self._append(batch)
                finally:
                    self._turn.acquire()
                    batch.done, self._syncing = True, False
                    self._turn.notify_all()
        if mine.error is not None:
            raise mine.error

    def _append(self, batch: _Batch) -> None:
        try:
            with self._lock:
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
                try:
                    pending = memoryview(b"".join(batch.lines))
                    while pending:
                        pending = pending[os.write(fd, pending) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as error:
            batch.error = error

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

"""Audit sinks: an append-only JSON-lines file for the embedded mode, and an in-memory list.

An audit event holds ids, the outcome code and digests; never content, never tokens.

The embedded log is segmented: lines are appended to ``audit.log`` (plain JSON lines, each
durable before its call returns); once it holds ``segment_bytes`` (1 MiB), it is sealed into
``audit.log.<n>.gz`` (gzip, 5-6x smaller: the lines are mostly the same keys and hex digests) and
a new ``audit.log`` begins. Writers in several processes (a server and the CLI) take an exclusive
``flock`` on ``audit.log.lock`` for each batch and for the sealing: a file that is never renamed,
so the lock covers the sealing from the rename to the last unlink (a lock on ``audit.log`` itself
would pass to the fresh file the moment it is created, and let a second writer seal the same
segment). ``audit_lines`` reads every segment in order, then ``audit.log``.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from engram_memory.adapters.local.private_files import fsync_dir
from engram_memory.contract.types import parse_instant
from engram_memory.engine.ports import AuditEvent, OutboxItem

SEGMENT_BYTES = 1 << 20
# Lines appended by ``follow`` (durable in the store's outbox) synced together at the latest.
SETTLE_LINES = 64
_SEGMENT = re.compile(r"\.(\d{6})(\.gz)?$")


def _segments(path: Path) -> list[tuple[int, Path]]:
    """The sealed (or, after a crash mid-sealing, still plain) segments of ``path`` in order, the
    gzip'd one when both forms of a segment are there."""
    found: dict[int, Path] = {}
    for candidate in path.parent.glob(path.name + ".*"):
        match = _SEGMENT.search(candidate.name[len(path.name) :])
        if match is None or candidate.name != f"{path.name}{match.group()}":
            continue
        number = int(match.group(1))
        if match.group(2) or number not in found:
            found[number] = candidate
    return sorted(found.items())


def audit_lines(path: Path) -> Iterator[str]:
    """Every line of the audit log at ``path``, oldest first: its segments, then ``path``.
    Undecodable bytes are replaced, so one damaged line never hides the others.

    The files are opened under a shared ``flock`` on ``audit.log.lock`` and read after it is
    released (an open file stays readable once unlinked): a consistent cut, where no line of a
    segment sealed meanwhile is missed or read twice, that never holds a writer up for the
    length of the read.
    """
    segments, active, active_bytes = _open_cut(path)
    try:
        for handle, sealed in segments:
            if sealed:
                with gzip.open(handle, "rt", encoding="utf-8", errors="replace") as lines:
                    yield from lines
            else:  # left plain by a crash mid-sealing
                yield from handle.read().decode("utf-8", errors="replace").splitlines(True)
        if active is not None:
            text = active.read(active_bytes).decode("utf-8", errors="replace")
            yield from text.splitlines(keepends=True)
    finally:
        for handle, _ in segments:
            handle.close()
        if active is not None:
            active.close()


def _open_cut(path: Path) -> tuple[list[tuple[BinaryIO, bool]], BinaryIO | None, int]:
    """The log's segments opened, each with whether it is gzip'd, and ``path`` opened with its
    length at the cut."""
    try:
        lock: int | None = os.open(
            path.with_name(path.name + ".lock"), os.O_RDONLY | os.O_CREAT, 0o600
        )
    except OSError:  # a read-only copy of a data directory: no writer to exclude
        lock = None
    segments: list[tuple[BinaryIO, bool]] = []
    try:
        if lock is not None:
            fcntl.flock(lock, fcntl.LOCK_SH)
        for _, segment in _segments(path):
            segments.append((segment.open("rb"), segment.suffix == ".gz"))
        try:
            active: BinaryIO | None = path.open("rb")
        except FileNotFoundError:
            active = None
        size = os.fstat(active.fileno()).st_size if active is not None else 0
    except BaseException:
        for handle, _ in segments:
            handle.close()
        raise
    finally:
        if lock is not None:
            os.close(lock)
    return segments, active, size


def _lines_since(path: Path, items: Sequence[OutboxItem]) -> set[str]:
    """The lines of the log that could hold ``items``' lines: ``path`` and the segments sealed
    since the earliest of them was made (a minute's slack for clocks)."""
    since_ms = min(parse_instant(json.loads(item.target)["at"]) for item in items) - 60_000
    found: set[str] = set()
    for _, segment in _segments(path):
        if segment.stat().st_mtime * 1000 < since_ms:
            continue
        data = segment.read_bytes()
        text = gzip.decompress(data) if segment.suffix == ".gz" else data
        found.update(text.decode("utf-8", errors="replace").splitlines())
    if path.exists():
        found.update(path.read_text(encoding="utf-8", errors="replace").splitlines())
    return found


def _write_durably(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


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

    A committed mutation's line comes through ``follow`` instead (``CommittedAuditLog``): it is
    already durable in the store's commit, so it is appended without a sync and made durable
    here by the next sync of the log (a ``record``, a sealing, ``SETTLE_LINES`` such lines, or
    the drainer's ``recover``).
    """

    def __init__(self, path: Path, segment_bytes: int = SEGMENT_BYTES) -> None:
        self._path = path
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()  # read() against a batch being written
        self._turn = threading.Condition()
        self._open: _Batch | None = None  # the batch new lines join
        self._syncing = False
        self._lock_path = path.with_name(path.name + ".lock")
        # ``follow``'s lines not yet synced, and the items of lines synced since: their outbox
        # items are dropped by the engine (``take_settled``)
        self._unsynced: list[OutboxItem] = []
        self._settled: list[OutboxItem] = []
        # The log as ``follow`` left it (inode, size, mtime): while it is still so, no writer
        # has appended since, so none has recovered a line of ours (``follow`` says why).
        self._followed: tuple[int, int, int] | None = None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.close(fd)

    def record(self, event: AuditEvent) -> None:
        line = event.as_json_line() + "\n"
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
            with self._exclusive():
                self._write(b"".join(batch.lines), sync=True)
        except OSError as error:
            batch.error = error

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        """This process's lock, then the log's ``flock`` (every writer of every process)."""
        with self._lock:
            lock = os.open(self._lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield
            finally:
                os.close(lock)  # releases the lock

    def _write(self, data: bytes, *, sync: bool) -> os.stat_result | None:
        """Append ``data`` (under ``_exclusive``); with ``sync``, fsync it, and with it every line
        ``follow`` appended unsynced before (then settled); seal a full log. The log's state
        after the write, or None when it was sealed."""
        self._followed = None  # any write but follow's own: follow asks the store again
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            pending = memoryview(data)
            while pending:
                pending = pending[os.write(fd, pending) :]
            if sync or len(self._unsynced) >= SETTLE_LINES:
                os.fsync(fd)
                self._settled.extend(self._unsynced)
                self._unsynced.clear()
            written = os.fstat(fd)
        finally:
            os.close(fd)
        if written.st_size < self._segment_bytes:
            return written
        self._seal()  # its segment is synced: the lines it holds are durable
        self._settled.extend(self._unsynced)
        self._unsynced.clear()
        return None

    # -- lines that ride in the store's commit (engine.ports.CommittedAuditLog) ---------------

    def follow(self, item: OutboxItem, owed: Callable[[OutboxItem], bool]) -> None:
        """Append the line of ``item``, committed with its mutation, without a sync of its own:
        the store's commit made it durable. It is synced with the next line that is (or once
        ``SETTLE_LINES`` wait), and its item settled then. Skipped when the item is no longer
        owed: a drainer in another process recovered it first."""
        with self._exclusive():
            if not self._unchanged_since_follow() and not owed(item):
                return
            self._unsynced.append(item)
            written = self._write(item.target.encode("utf-8") + b"\n", sync=False)
            if written is not None:
                self._followed = (written.st_ino, written.st_size, written.st_mtime_ns)

    def _unchanged_since_follow(self) -> bool:
        """Whether the log is as this object's last ``follow`` left it (``_exclusive`` held).

        A drainer recovers an item only by appending its missing line (``recover``), under the
        lock, so a log nobody wrote since proves the item still owed without asking the store:
        one ``stat`` instead of a query per committed call. Any other write, here or in another
        process, a sealing included, changes the inode, size or mtime, and the store decides."""
        if self._followed is None:
            return False
        try:
            now = os.stat(self._path)
        except FileNotFoundError:
            return False
        return (now.st_ino, now.st_size, now.st_mtime_ns) == self._followed

    def recover(
        self,
        items: Sequence[OutboxItem],
        owed: Callable[[OutboxItem], bool],
        settle: Callable[[Sequence[OutboxItem]], None],
    ) -> None:
        """Make the lines of ``items`` (found in the store's outbox) durable in the log, once:
        the ones this process appended are synced; any other is looked up in the log (its
        committer may have appended it before it died) and appended only when missing. Every
        item is settled before the log's lock is released, so a committer still on its way
        finds its item gone and does not append it again."""
        with self._exclusive():
            mine = {item.item_id for item in (*self._unsynced, *self._settled)}
            foreign = [i for i in items if i.item_id not in mine and owed(i)]
            written = _lines_since(self._path, foreign) if foreign else set()
            missing = [i for i in foreign if i.target not in written]
            if self._unsynced or foreign:  # a line found written may not be synced yet
                self._write(b"".join(i.target.encode("utf-8") + b"\n" for i in missing), sync=True)
            if self._settled or foreign:
                settle([*self._settled, *foreign])
            self._settled.clear()

    def take_settled(self) -> list[OutboxItem]:
        """The items whose lines are durable in the log since the last call."""
        with self._lock:
            settled, self._settled = self._settled, []
        return settled

    def _seal(self) -> None:
        """Turn the full ``audit.log`` (``audit.log.lock`` held) into the next gzip'd segment.

        Renamed first (one atomic step: every line is in exactly one file at every moment), then
        compressed and synced, then the plain copy removed. A crash part-way leaves a plain or a
        doubled segment, which readers read once and the next sealing finishes.
        """
        numbers = [number for number, _ in _segments(self._path)]
        number = max(numbers, default=0) + 1
        plain = self._path.with_name(f"{self._path.name}.{number:06d}")
        os.rename(self._path, plain)
        os.close(os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        fsync_dir(self._path.parent)
        for _, segment in _segments(self._path):
            if segment.suffix != ".gz":
                sealed = segment.with_name(segment.name + ".gz")
                _write_durably(sealed, gzip.compress(segment.read_bytes(), mtime=0))
                fsync_dir(self._path.parent)
                segment.unlink()
        for number_, segment in _segments(self._path):  # a crash after writing, before unlinking
            leftover = segment.with_name(f"{self._path.name}.{number_:06d}")
            if leftover.exists() and segment.suffix == ".gz":
                leftover.unlink()

    def read(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(line) for line in audit_lines(self._path) if line.strip()]


class MemoryAuditLog:
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []
        self._lock = threading.Lock()

    def record(self, event: AuditEvent) -> None:
        with self._lock:
            self.events.append(event)

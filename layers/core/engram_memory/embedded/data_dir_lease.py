"""One owner per data directory: an exclusive lease, an OS file lock on ``<data_dir>/lease.lock``.

A server (``open_server``, so ``serve`` on HTTP or stdio) holds it for as long as it runs; the
operator commands that replace what a server keeps loaded — ``admin keys rotate`` (the master
key a server wraps new keys under) and ``admin restore`` into an existing directory (the database
file it has open) — hold it while they run. Whoever comes second is refused with one line naming
the holder's PID, and nothing is written: two processes never both write keys.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on an open file, so the kernel drops it when the holder's
process ends in any way, SIGKILL included: a crashed server never leaves a stale lease to clean
up (its file stays behind, unlocked, and the next holder takes it). A holder removes the file
when it lets go. Its content, the holder's PID and role, is only for the refusal message, never
for the decision: whether the lease is held is the lock's to say.

An HTTP server also ``announce``s where it serves, in ``server.json`` (written atomically, removed
when the lease is let go), so the commands that need the running server's address (``console``,
``token``) find it without ``--port``. ``serving_address`` believes the file only while its
writer holds the lease: one left by a killed server names an address nobody serves, and is
ignored.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from engram_memory.adapters.local.private_files import write_private_file
from engram_memory.embedded.data_dir import LEASE_FILE, SERVER_FILE
from engram_memory.embedded.errors import DataDirectoryRefused

__all__ = [
    "DataDirLease",
    "DataDirectoryBusy",
    "acquire_lease",
    "lease_holder",
    "owned",
    "serving_address",
]

SERVER: Final = "the server"
_ATTEMPTS: Final = 8  # lease files removed under us in a row before we call it busy
# The leases this process holds, by resolved data directory: what it opens there is its own.
_HELD: dict[Path, DataDirLease] = {}
_HELD_LOCK = threading.Lock()


class DataDirectoryBusy(DataDirectoryRefused):
    """Another process holds the data directory's lease; nothing was done.

    ``pid`` and ``holder`` (``"the server"``, or an operator command) as the holder wrote them,
    when it could be read."""

    def __init__(self, data_dir: Path, pid: int | None, holder: str | None) -> None:
        self.data_dir = Path(data_dir)
        self.pid = pid
        self.holder = holder or "another engram-memory process"
        who = self.holder if pid is None else f"{self.holder} (PID {pid})"
        super().__init__(f"{who} holds {self.data_dir.resolve()}")


class DataDirLease:
    """A held lease; ``release`` (or the end of the process) gives it up."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        with _HELD_LOCK:
            _HELD[path.parent.resolve()] = self

    @property
    def held(self) -> bool:
        return self._fd is not None

    def announce(self, address: dict[str, Any]) -> None:
        """Say where the holder serves (``url``, ``host``, ``port``), until ``release``."""
        document = {**address, "pid": os.getpid()}
        write_private_file(
            self.path.parent / SERVER_FILE, json.dumps(document).encode(), replace=True
        )

    def release(self) -> None:
        """Give the lease up; idempotent. The file goes first, while still locked (a newcomer
        that opened it meanwhile sees it is gone once it gets the lock, and tries again)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with _HELD_LOCK:
                _HELD.pop(self.path.parent.resolve(), None)
            with contextlib.suppress(OSError):
                (self.path.parent / SERVER_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                if _same_file(fd, self.path):
                    self.path.unlink()
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> DataDirLease:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def acquire_lease(data_dir: Path, holder: str = SERVER) -> DataDirLease:
    """The lease of ``data_dir`` (which must exist), for ``holder`` (named in others' refusals).

    Raises ``DataDirectoryBusy`` when another process (or another lease in this one) holds it."""
    path = Path(data_dir) / LEASE_FILE
    for _attempt in range(_ATTEMPTS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            pid, who = lease_holder(data_dir)
            raise DataDirectoryBusy(Path(data_dir), pid, who) from None
        if not _same_file(fd, path):  # its holder removed it as we locked it: a new one
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n{holder}\n".encode(), 0)
        except OSError:
            os.close(fd)
            raise
        return DataDirLease(path, fd)
    raise DataDirectoryBusy(Path(data_dir), None, None)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def lease_holder(data_dir: Path) -> tuple[int | None, str | None]:
    """The PID and role the lease's holder wrote (``None``s when unreadable or not yet written).
    Read for messages only: whether the lease is held is the lock's to say."""
    try:
        text = (Path(data_dir) / LEASE_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None, None
    lines = text.splitlines()
    pid = int(lines[0]) if lines and lines[0].strip().isdigit() else None
    holder = lines[1].strip() if len(lines) > 1 and lines[1].strip() else None
    return pid, holder


@contextlib.contextmanager
def owned(data_dir: Path, holder: str) -> Iterator[bool]:
    """Whether this process owns ``data_dir`` for the block: it holds the lease already (a
    server, a rotation), or takes it for the block (as ``holder``). ``False`` when another process
    holds it: then what only the owner may do (finish a rotation left half done) is not done."""
    with _HELD_LOCK:
        mine = Path(data_dir).resolve() in _HELD
    if mine:
        yield True
        return
    try:
        lease = acquire_lease(data_dir, holder)
    except DataDirectoryBusy:
        yield False
        return
    with lease:
        yield True


def _held_now(data_dir: Path) -> bool:
    """Whether some open file description holds the lease now: a shared lock cannot be had
    beside the holder's exclusive one (and is let go at once, never writing anything)."""
    try:
        fd = os.open(Path(data_dir) / LEASE_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False  # no lease file: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # drops the shared lock, if it was taken
    return False


def serving_address(data_dir: Path) -> dict[str, Any] | None:
    """Where the server holding ``data_dir`` serves HTTP (``url``, ``host``, ``port``, ``pid``),
    or ``None``: no server, a stdio one, or a ``server.json`` its killed writer left behind."""
    try:
        document = json.loads((Path(data_dir) / SERVER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict) or not isinstance(document.get("port"), int):
        return None
    holder_pid, _role = lease_holder(data_dir)
    if document.get("pid") != holder_pid or not _held_now(data_dir):
        return None
    return document

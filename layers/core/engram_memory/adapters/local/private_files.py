"""Owner-only directories and files, written to disk for real (fsync), without heavy imports.

Shared by the local vault (key files), the audit log, backups and the embedded host's files
(``write_private_file``: host.json, issuer keys, the request-state key), so the cloud adapter
can read its host configuration without importing the encryption SDK.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["fsync_dir", "make_private_dirs", "write_all", "write_private_file"]


def make_private_dirs(directory: Path) -> None:
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(directory: Path) -> None:
    """fsync a directory (a rename or link in it made durable), or a file: the same call."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private_file(path: Path, data: bytes, *, replace: bool) -> bool:
    """Write ``data`` to ``path`` with mode 0600 through a temporary file and a rename.

    Missing parent directories are created with mode 0700. With ``replace=False`` an existing file
    is kept (``link`` never replaces, so concurrent creators agree on one content) and the result
    is ``False``; otherwise the file is written (``os.replace``) and the result is ``True``.
    """
    path = Path(path)
    make_private_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    written = True
    try:
        try:
            os.fchmod(fd, 0o600)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                written = False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)
    return written

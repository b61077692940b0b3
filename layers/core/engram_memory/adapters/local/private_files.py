"""Owner-only directories and files, written to disk for real (fsync), without heavy imports.

Shared by the local vault (key files) and the host configuration (issuer key, host.json), so the
cloud adapter can read its host configuration without importing the encryption SDK.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "make_private_dirs", "write_all"]


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

"""Owner-only files written atomically (shared by the host configuration and the issuer key)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from engram_memory.adapters.local.private_files import fsync_dir, make_private_dirs, write_all


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

"""The console's one-time sign-in links, shared by the CLI that mints them and the server that
redeems them: a table in the data directory's ``console.sqlite3`` (WAL, owner-only), as the
approval book passes a terminal's answers to a running server.

A link carries a 256-bit secret (``secrets.token_urlsafe``, as the approval links'); only its
SHA-256 is stored, so reading the file does not sign anyone in. A link is redeemed once (the
``UPDATE`` that marks it used is the check) and within ``LINK_TTL_MS`` of its minting; it names
the operator the session acts as.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Final

from engram_memory.embedded.data_dir import CONSOLE_FILE

LINK_TTL_MS: Final = 300_000  # five minutes to open the link
KEEP_SPENT_MS: Final = 86_400_000  # spent and expired links are pruned after a day

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS sign_in_links (
    secret_hash TEXT PRIMARY KEY,
    operator TEXT NOT NULL,
    minted_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    used_at_ms INTEGER
);
"""


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


class SignInLinks:
    """The sign-in links of one data directory (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = path = Path(data_dir) / CONSOLE_FILE
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # owner-only before SQLite
        self._db = sqlite3.connect(path, timeout=10.0, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def mint(self, operator: str, now_ms: int, ttl_ms: int = LINK_TTL_MS) -> str:
        """A new link's secret for ``operator`` (the only time it exists in the clear)."""
        if not operator.strip():
            raise ValueError("the operator's name must not be empty")
        secret = secrets.token_urlsafe(32)
        with self._lock, self._db:
            self._db.execute(
                "DELETE FROM sign_in_links WHERE expires_at_ms < ?", (now_ms - KEEP_SPENT_MS,)
            )
            self._db.execute(
                "INSERT INTO sign_in_links (secret_hash, operator, minted_at_ms, expires_at_ms)"
                " VALUES (?, ?, ?, ?)",
                (secret_hash(secret), operator, now_ms, now_ms + ttl_ms),
            )
        return secret

    def redeem(self, secret: str, now_ms: int) -> str | None:
        """The operator a live, unused link names, spending it; None for any other secret."""
        hashed = secret_hash(secret)
        with self._lock, self._db:
            spent = self._db.execute(
                "UPDATE sign_in_links SET used_at_ms = ?"
                " WHERE secret_hash = ? AND used_at_ms IS NULL AND expires_at_ms > ?",
                (now_ms, hashed, now_ms),
            ).rowcount
            if spent != 1:
                return None
            row = self._db.execute(
                "SELECT operator FROM sign_in_links WHERE secret_hash = ?", (hashed,)
            ).fetchone()
        return str(row[0])

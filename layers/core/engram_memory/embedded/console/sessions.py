"""The console's sessions: held by the running server alone (a restart signs everyone out).

A session is what a redeemed sign-in link becomes: a random cookie value (only its SHA-256 is
kept), the operator it names, and an absolute expiry ``SESSION_TTL_MS`` after sign-in. Its CSRF
token is bound to the session under the server's key (``approval_page.csrf_token``).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Final

from engram_memory.approval_page import csrf_token
from engram_memory.embedded.console.links import secret_hash

SESSION_TTL_MS: Final = 1_800_000  # thirty minutes, then a new link


@dataclass(slots=True)
class Session:
    operator: str
    key: str  # the cookie value's hash
    expires_at_ms: int
    csrf: str


class Sessions:
    def __init__(self, csrf_key: bytes, ttl_ms: int = SESSION_TTL_MS) -> None:
        self._csrf_key = csrf_key
        self._ttl_ms = ttl_ms
        self._by_key: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self, operator: str, now_ms: int) -> tuple[str, Session]:
        """A new session for ``operator``: the cookie value (handed out once) and the session."""
        cookie = secrets.token_urlsafe(32)
        key = secret_hash(cookie)
        session = Session(
            operator=operator,
            key=key,
            expires_at_ms=now_ms + self._ttl_ms,
            csrf=csrf_token(self._csrf_key, "console", key),
        )
        with self._lock:
            self._by_key = {k: s for k, s in self._by_key.items() if s.expires_at_ms > now_ms}
            self._by_key[key] = session
        return cookie, session

    def find(self, cookie: str | None, now_ms: int) -> Session | None:
        """The live session of a cookie value; None for none, an unknown or an expired one."""
        if not cookie:
            return None
        with self._lock:
            session = self._by_key.get(secret_hash(cookie))
            if session is not None and session.expires_at_ms <= now_ms:
                del self._by_key[session.key]
                return None
        return session

    def close(self, cookie: str | None) -> None:
        if cookie:
            with self._lock:
                self._by_key.pop(secret_hash(cookie), None)

    def all(self) -> list[Session]:
        with self._lock:
            return list(self._by_key.values())

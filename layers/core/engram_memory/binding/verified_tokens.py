"""Bearer tokens verified once per lifetime on the embedded host, not on every request.

The HTTP transport checks a request's bearer token, and the MCP surface checks it again to build
the call's context: two signature checks (~0.2 ms of CPU each) per tool call. A successful
verification depends on nothing but the token and the verifier's keys, issuer and audience, which
are fixed for the verifier's life (``local_verifier`` reads them once; ``keys rotate`` needs the
server stopped), and on the clock only through the token's expiry. So the claims of a token that
verified are kept, keyed by the token's SHA-256, and returned while the token has not expired —
the same instant at which the verifier itself would refuse it (``exp`` + ``LEEWAY_S``). Nothing
is accepted that the verifier would refuse:

- failures are never kept (a token not yet valid is verified again when it comes back);
- an entry is dropped, and the token verified again (and refused as expired), once it expires;
- revocation is not the verifier's: the engine checks every call's token id and principal
  against the store (``Kernel.check_revoked``), and this cache does not stand in front of it;
- a verifier whose keys come from a key source (an OIDC issuer's JWKS, which may drop a key) is
  not cached: ``cached`` returns it as it is.

Bounded: at most ``max_entries`` tokens, the least recently used dropped first.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, Protocol

from engram_memory.binding.tokens import LEEWAY_S, TokenVerifier, VerifiedClaims

__all__ = ["MAX_ENTRIES", "ClaimsVerifier", "VerifiedTokenCache", "cached"]

MAX_ENTRIES: Final = 1024


class ClaimsVerifier(Protocol):
    """What the MCP surface needs to check a bearer token (``TokenVerifier`` or its cache)."""

    def verify(self, token: str) -> VerifiedClaims: ...


class VerifiedTokenCache:
    """``verifier``'s successes, kept until each token expires (see the module doc)."""

    def __init__(
        self,
        verifier: TokenVerifier,
        *,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._verifier = verifier
        self._max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[VerifiedClaims, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def verify(self, token: str) -> VerifiedClaims:
        """The token's claims; raises ``InvalidToken`` exactly as the verifier does."""
        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                claims, expires = entry
                if self._clock() < expires:
                    self._entries.move_to_end(key)
                    return claims
                del self._entries[key]  # expired: the verifier refuses it below
        claims = self._verifier.verify(token)
        # PyJWT refuses a token once ``exp + leeway`` is past (its ``exp <= now - leeway``).
        expires = claims.expires_at + LEEWAY_S
        with self._lock:
            self._entries[key] = (claims, expires)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return claims


def cached(verifier: TokenVerifier, *, max_entries: int = MAX_ENTRIES) -> ClaimsVerifier:
    """``verifier`` behind a ``VerifiedTokenCache``, unless its keys can change under it."""
    if verifier.has_key_source:
        return verifier
    return VerifiedTokenCache(verifier, max_entries=max_entries)

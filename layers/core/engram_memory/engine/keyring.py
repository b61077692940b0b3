"""The versions of a rotating key, newest first: the first signs or seals, every one verifies or
opens (the overlap window of a rotation).

A cloud secret rotates (``cloud.secret_rotation``): its current version keys what is made from
then on, its previous version still opens what was made before. ``load`` reads the versions
(``cloud.settings.read_secret_versions``: current, then previous); they are read again every
``KEY_REFRESH_S``, and sooner (at most every ``KEY_RETRY_S``) when a value verifies under none of
them, since another instance may have read a newer version first. A host with one fixed key
(the embedded host's files, a test) passes bytes where a ``KeyRing`` is taken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

KEY_REFRESH_S: Final = 300.0
KEY_RETRY_S: Final = 60.0

T = TypeVar("T")


class KeyRing:
    """The key versions ``load`` returns, newest first, each at least ``minimum`` bytes."""

    def __init__(
        self,
        load: Callable[[], Sequence[bytes]],
        *,
        minimum: int = 32,
        clock: Callable[[], float] = time.time,
        held: Sequence[bytes] | None = None,
    ) -> None:
        self._load = load
        self._minimum = minimum
        self._clock = clock
        self._keys = self._checked(load() if held is None else held)
        self._read_at = clock()

    @staticmethod
    def fixed(key: bytes | KeyRing, *, minimum: int = 32) -> KeyRing:
        """``key`` as a ring (one version that never changes), or ``key`` itself."""
        if isinstance(key, KeyRing):
            return key
        held = (bytes(key),)
        return KeyRing(lambda: held, minimum=minimum)

    def _checked(self, keys: Sequence[bytes]) -> tuple[bytes, ...]:
        if not keys or any(len(key) < self._minimum for key in keys):
            raise ValueError(f"a key must be at least {self._minimum} bytes")
        return tuple(keys)

    def current(self) -> bytes:
        """The version that signs or seals."""
        return self.all()[0]

    def all(self) -> tuple[bytes, ...]:
        if self._clock() - self._read_at >= KEY_REFRESH_S:
            self.reread()
        return self._keys

    def reread(self) -> bool:
        """Read the keys again unless they were read within ``KEY_RETRY_S``; whether they
        changed. A failed read keeps the keys held: the host goes on with what it knows."""
        if self._clock() - self._read_at < KEY_RETRY_S:
            return False
        self._read_at = self._clock()
        try:
            keys = self._checked(self._load())
        except Exception:  # the secret unreadable for a moment: the held keys still verify
            return False
        changed, self._keys = keys != self._keys, keys
        return changed

    def first_that(self, attempt: Callable[[bytes], T | None]) -> T | None:
        """``attempt``'s first answer that is not None, trying each version newest first; when
        none answers, once more after reading the versions again (when they changed)."""
        for key in self.all():
            found = attempt(key)
            if found is not None:
                return found
        if self.reread():
            for key in self._keys:
                found = attempt(key)
                if found is not None:
                    return found
        return None

"""Sealed, single-use ``requestState`` for the 2026-07-28 confirmation round trip.

The state travels through the client between the first call (which asks the human) and the retry
(which carries the human's answer). It is the open ``engine.gate.Approval`` (principal, scope,
tool, target, operation digest, issue time; not answered yet) as JSON, sealed with AES-256-GCM
under the host's request-state key, so the client can neither read nor alter it; the engine
re-checks the binding and the 300 s / 30 s windows. Its id (``rs_`` + 32 hex) is the approval id,
which the commit it authorizes consumes (single use).
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.engine.gate import Approval
from engram_memory.engine.keyring import KeyRing

_PREFIX: Final = "ers1."
_AAD: Final = b"engram-memory/request-state/v1"


class RequestStateInvalid(Exception):
    """The state does not decode, was tampered with, or was sealed under another key."""


class RequestStateSealer:
    """Seals under the key's current version; opens under any version it holds (a ``KeyRing``
    when the key rotates: a state sealed just before a rotation still opens after it)."""

    def __init__(self, key: bytes | KeyRing) -> None:
        self._keys = KeyRing.fixed(key, minimum=32)
        if any(len(version) != 32 for version in self._keys.all()):
            raise ValueError("request-state key must be 32 bytes")

    def seal(self, state: Approval) -> str:
        nonce = os.urandom(12)
        body = state.model_dump_json().encode()
        sealed = nonce + AESGCM(self._keys.current()).encrypt(nonce, body, _AAD)
        return _PREFIX + base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=")

    def open(self, token: str) -> Approval:
        if not token.startswith(_PREFIX):
            raise RequestStateInvalid("unknown format")
        try:
            body_text = token[len(_PREFIX) :]
            raw = base64.urlsafe_b64decode(body_text + "=" * (-len(body_text) % 4))
        except (binascii.Error, ValueError):
            raise RequestStateInvalid("cannot open") from None

        def opened(key: bytes) -> bytes | None:
            try:
                return AESGCM(key).decrypt(raw[:12], raw[12:], _AAD)
            except (InvalidTag, ValueError):
                return None

        body = self._keys.first_that(opened)
        if body is None:
            raise RequestStateInvalid("cannot open")
        try:
            return Approval.model_validate_json(body)
        except ValueError:  # ValidationError too
            raise RequestStateInvalid("cannot open") from None

"""Sealed, single-use ``requestState`` for the 2026-07-28 confirmation round trip.

The state travels through the client between the first call (which asks the human) and the retry
(which carries the human's answer). It is sealed with AES-256-GCM under the host's request-state
key, so the client can neither read nor alter it, and it binds the principal, scope, tool, target,
operation digest and issue time; the engine re-checks the binding and the 300 s / 30 s windows.
The state's nonce becomes the approval id, which the commit it authorizes consumes (single use).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import asdict, dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_PREFIX: Final = "ers1."
_AAD: Final = b"engram-memory/request-state/v1"


@dataclass(frozen=True, slots=True)
class ConfirmationState:
    nonce: str
    principal: str
    tenant_id: str
    workspace_id: str
    tool: str
    target: str
    operation_digest: str
    issued_at_ms: int


class RequestStateInvalid(Exception):
    """The state does not decode, was tampered with, or was sealed under another key."""


class RequestStateSealer:
    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("request-state key must be 32 bytes")
        self._aead = AESGCM(key)

    def seal(self, state: ConfirmationState) -> str:
        nonce = os.urandom(12)
        body = json.dumps(asdict(state), sort_keys=True, separators=(",", ":")).encode()
        sealed = nonce + self._aead.encrypt(nonce, body, _AAD)
        return _PREFIX + base64.urlsafe_b64encode(sealed).decode("ascii").rstrip("=")

    def open(self, token: str) -> ConfirmationState:
        if not token.startswith(_PREFIX):
            raise RequestStateInvalid("unknown format")
        try:
            body_text = token[len(_PREFIX) :]
            raw = base64.urlsafe_b64decode(body_text + "=" * (-len(body_text) % 4))
            body = self._aead.decrypt(raw[:12], raw[12:], _AAD)
            data = json.loads(body)
            return ConfirmationState(**data)
        except (binascii.Error, InvalidTag, ValueError, TypeError):
            raise RequestStateInvalid("cannot open") from None

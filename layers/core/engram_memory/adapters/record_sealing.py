"""What both key stores share about sealed record bodies: the key hierarchy and the formats.

A record body is sealed with AES-256-GCM under the record's own random data key; that key is
wrapped (AES-256-GCM) under its scope's key; the scope key is wrapped by the key store's root
(embedded: the master key file; cloud: a KMS data key decrypted once per process). Associated
data binds every layer to its place: a body to its tenant, workspace and record id, a wrapped
record key to the same, so a body or key moved to another record fails authentication.

No KMS call and no Encryption SDK message per record: a read unwraps the record key with the
cached scope key and opens the body, two AES-GCM operations. The record keys live in the key
store, which is never backed up; destroying one makes every copy of its body unreadable.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SEALED_BODY_FORMAT, SealIntegrityError, is_sealed_body

KEY_BYTES: Final = 32
_NONCE_BYTES: Final = 12
# The first bytes of every sealed body, so a body sealed in another format is recognised.
BODY_FORMAT: Final = SEALED_BODY_FORMAT
_BODY_AAD: Final = b"engram-memory/record-body/v1\x00"
_RECORD_KEY_AAD: Final = b"engram-memory/record-key/v1\x00"
_SCOPE_KEY_AAD: Final = b"engram-memory/scope-key/v1\x00"


def _bound(prefix: bytes, *fields: str) -> bytes:
    """Associated data: a prefix and length-prefixed fields (no two field lists collide)."""
    parts = [field.encode("utf-8") for field in fields]
    return prefix + b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _seal(key: AESGCM, plaintext: bytes, aad: bytes) -> bytes:
    nonce = secrets.token_bytes(_NONCE_BYTES)
    return nonce + key.encrypt(nonce, plaintext, aad)


def _open(key: AESGCM, sealed: bytes, aad: bytes, what: str) -> bytes:
    try:
        return key.decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], aad)
    except (InvalidTag, ValueError) as exc:
        raise SealIntegrityError(f"{what} failed authentication") from exc


def seal_body(record_key: bytes, scope: Scope, record_id: str, plaintext: bytes) -> bytes:
    aad = _bound(_BODY_AAD, scope.tenant_id, scope.workspace_id, record_id)
    return BODY_FORMAT + _seal(AESGCM(record_key), plaintext, aad)


def open_body(record_key: bytes, scope: Scope, record_id: str, sealed: bytes) -> bytes:
    if not is_sealed_body(sealed):
        raise SealIntegrityError("the record body is not sealed")
    aad = _bound(_BODY_AAD, scope.tenant_id, scope.workspace_id, record_id)
    return _open(AESGCM(record_key), sealed[len(BODY_FORMAT) :], aad, "record body")


def wrap_scope_key(root: AESGCM, scope: Scope, scope_key: bytes) -> bytes:
    """An embedded scope key wrapped under the master key (the cloud's is wrapped by KMS)."""
    return _seal(root, scope_key, _bound(_SCOPE_KEY_AAD, scope.tenant_id, scope.workspace_id))


def unwrap_scope_key(root: AESGCM, scope: Scope, wrapped: bytes) -> bytes:
    aad = _bound(_SCOPE_KEY_AAD, scope.tenant_id, scope.workspace_id)
    return _open(root, wrapped, aad, "scope key")


class ScopeKeys:
    """Unwrapped scope keys of one process, each unwrapped once (``load``) and then cached.

    ``load(scope)`` returns the scope's key, making one when the scope has none yet. The cache
    holds only scope keys: record keys are read from the key store on every open, so a record
    key destroyed by another process is gone for this one too.
    """

    def __init__(self, load: Callable[[Scope], bytes]) -> None:
        self._load = load
        self._keys: dict[Scope, AESGCM] = {}
        self._lock = threading.Lock()

    def get(self, scope: Scope) -> AESGCM:
        cached = self._keys.get(scope)
        if cached is not None:
            return cached
        with self._lock:
            cached = self._keys.get(scope)
            if cached is None:
                cached = self._keys[scope] = AESGCM(self._load(scope))
            return cached

    def new_record_key(self, scope: Scope, record_id: str) -> tuple[bytes, bytes]:
        """A fresh record key and its wrapping under the scope key."""
        record_key = secrets.token_bytes(KEY_BYTES)
        aad = _bound(_RECORD_KEY_AAD, scope.tenant_id, scope.workspace_id, record_id)
        return record_key, _seal(self.get(scope), record_key, aad)

    def unwrap_record_key(self, scope: Scope, record_id: str, wrapped: bytes) -> bytes:
        aad = _bound(_RECORD_KEY_AAD, scope.tenant_id, scope.workspace_id, record_id)
        return _open(self.get(scope), wrapped, aad, "record key")

    def seal_body(self, scope: Scope, record_id: str, wrapped: bytes, plaintext: bytes) -> bytes:
        """A body sealed under the record key ``wrapped`` (as stored in the key store)."""
        record_key = self.unwrap_record_key(scope, record_id, wrapped)
        return seal_body(record_key, scope, record_id, plaintext)

    def open_bodies(
        self, scope: Scope, wrapped: Mapping[str, bytes], sealed: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        """The bodies ``sealed`` (by record id) whose wrapped keys ``wrapped`` holds, opened;
        the others (their keys destroyed) are left out."""
        opened: dict[str, bytes] = {}
        for record_id, key in wrapped.items():
            record_key = self.unwrap_record_key(scope, record_id, key)
            opened[record_id] = open_body(record_key, scope, record_id, sealed[record_id])
        return opened

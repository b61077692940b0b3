"""What every host's restore checks before it touches anything, and the refusal it answers.

A backup's record bodies are checked the same way on both hosts: each sealed body opens with the
key store and every plaintext hashes to the digest its row names; a failure is
``BACKUP_INVALID`` (or ``RESTORE_REFUSED`` when the key store cannot be read).
"""

from __future__ import annotations

from collections.abc import Mapping

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    RecordKeys,
    SealIntegrityError,
    VaultUnavailable,
    is_sealed_body,
)
from engram_memory.engine.records import decode, record_digest_matches

__all__ = ["OperationRefused", "check_record_bodies", "record_body_intact"]


class OperationRefused(EngramError):
    """An operator's operation refused with a sentence for the operator (``detail``): a backup
    (``BACKUP_INVALID``), a restore (``RESTORE_REFUSED``), a decision taken already
    (``ALREADY_TERMINAL``); the contract message stays the constant one."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(code)
        self.detail = detail


def check_record_bodies(
    scope: Scope, bodies: Mapping[str, tuple[bytes, str]], record_keys: RecordKeys | None
) -> int:
    """Check stored record bodies (record id -> (body, the row's digest)): each sealed one is
    opened with ``record_keys`` and every plaintext must hash to its digest. Returns how many
    could not be opened for want of their key; raises ``OperationRefused``."""
    sealed = {rid: body for rid, (body, _) in bodies.items() if is_sealed_body(body)}
    try:
        opened = record_keys.open_many(scope, sealed) if record_keys and sealed else {}
    except SealIntegrityError:
        raise OperationRefused(
            ErrorCode.BACKUP_INVALID, "a record body fails its authentication"
        ) from None
    except VaultUnavailable:
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED, "the key store could not be read"
        ) from None
    without_key = 0
    for record_id, (body, record_digest) in bodies.items():
        # A body from before sealed bodies is checked as it is (sealed when the store opens).
        plaintext = opened.get(record_id) if record_id in sealed else body
        if plaintext is None:
            without_key += 1
        elif not record_body_intact(plaintext, record_digest):
            raise OperationRefused(
                ErrorCode.BACKUP_INVALID, f"record {record_id} does not match its digest"
            )
    return without_key


def record_body_intact(body: bytes, record_digest: str) -> bool:
    """Whether a stored record body hashes to its own digest, the one its row names."""
    try:
        record = decode(body)
        return record_digest_matches(record) and record["record_digest"] == record_digest
    except (ValueError, KeyError, TypeError):
        return False

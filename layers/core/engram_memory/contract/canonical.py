"""Canonical JSON (RFC 8785 over NFC data) and domain-separated digests (CONTRACT.md §5).

``rfc8785`` (Trail of Bits) does the JCS serialization; this module adds the checks the contract
layers on top: every string and key must already be NFC (we reject, never normalize silently),
integers must be safe, floats finite and not ``-0``, and ``None`` is never data (absent means absent).
"""

from __future__ import annotations

import base64
import hashlib
import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, Final

import rfc8785

MAX_SAFE_INTEGER: Final = 2**53 - 1
DIGEST_PREFIX: Final = "sha256:"
GENESIS_HASH: Final = DIGEST_PREFIX + "0" * 64

# Upstream domain names, kept so digests stay comparable with upstream stores.
_VERSIONED_DOMAINS: Final = {
    "payload": "graphify-memory/payload/v2",
    "record": "graphify-memory/record/v2",
}


class CanonicalizationError(ValueError):
    """The value cannot be canonicalized under the contract's rules."""


def domain_for(kind: str) -> str:
    return _VERSIONED_DOMAINS.get(kind, f"graphify-memory/{kind}/v1")


def _check(value: Any, path: str) -> None:
    if value is None:
        raise CanonicalizationError(f"null at {path}")
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise CanonicalizationError(f"unsafe integer at {path}")
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalizationError(f"non-finite number at {path}")
        if value == 0.0 and math.copysign(1.0, value) < 0:
            raise CanonicalizationError(f"negative zero at {path}")
        return
    if isinstance(value, str):
        if not unicodedata.is_normalized("NFC", value):
            raise CanonicalizationError(f"non-NFC string at {path}")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalizationError(f"non-string key at {path}")
            if not unicodedata.is_normalized("NFC", key):
                raise CanonicalizationError(f"non-NFC key at {path}")
            _check(item, f"{path}/{key}")
        return
    if isinstance(value, Sequence):
        for index, item in enumerate(value):
            _check(item, f"{path}/{index}")
        return
    raise CanonicalizationError(f"unsupported type at {path}")


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value`` after the contract's NFC / number / null checks."""
    _check(value, "")
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalizationError("value cannot be canonicalized") from exc


def digest_bytes(kind: str, value: Any) -> bytes:
    return hashlib.sha256(
        domain_for(kind).encode("utf-8") + b"\x00" + canonical_bytes(value)
    ).digest()


def digest(kind: str, value: Any) -> str:
    """``sha256:`` + hex(SHA-256(UTF-8(domain) ‖ 0x00 ‖ JCS(value)))."""
    return DIGEST_PREFIX + digest_bytes(kind, value).hex()


def digest_without(kind: str, value: Mapping[str, Any], field: str) -> str:
    """Digest of a receipt computed over the receipt without its own digest field."""
    return digest(kind, {k: v for k, v in value.items() if k != field})


def record_id_for(record_digest: str) -> str:
    """``mem_`` + lowercase unpadded RFC 4648 base32 of the 32 record-digest bytes (56 chars)."""
    raw = bytes.fromhex(record_digest.removeprefix(DIGEST_PREFIX))
    return "mem_" + base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def candidate_id_for(
    tenant_id: str, workspace_id: str, principal: str, idempotency_key: str
) -> str:
    """``candidate_`` + 64 hex of the principal-scoped capture identity digest (§12)."""
    identity = digest(
        "capture-identity",
        {
            "tenant_id": tenant_id,
            "workspace_id": workspace_id,
            "principal": principal,
            "idempotency_key": idempotency_key,
        },
    )
    return "candidate_" + identity.removeprefix(DIGEST_PREFIX)

"""Canonical JSON (RFC 8785 over NFC data) and domain-separated digests (CONTRACT.md §5).

``rfc8785`` (Trail of Bits) does the JCS serialization; this module adds the checks the contract
layers on top: every string and key must already be NFC (we reject, never normalize silently),
integers must be safe, floats finite and not ``-0``, and ``None`` is never data (absent means absent).

Most values the engine digests (records, receipts, search pages) take a fast path with the same
bytes: ``orjson`` (sorted keys, compact, UTF-8, the escapes RFC 8785 uses) produces exactly the
RFC 8785 serialization for a value whose keys are ASCII (JCS sorts by UTF-16 code units, orjson
by code points: they agree below U+D800) and whose floats print alike in Python and ECMAScript
(non-integral, 1e-4 ≤ |x| < 1e16: both the shortest round-trip digits in fixed notation). The
strings' NFC check runs once over the whole text, which is equivalent: every string in it sits
between quotes, which neither compose nor reorder with what follows them.
Anything else (``None``, unsafe integers, other floats, non-ASCII keys, non-dict mappings) takes the
checked ``rfc8785`` path, which also names the offending place.
"""

from __future__ import annotations

import base64
import hashlib
import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
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


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON that the C encoder serializes exactly as RFC 8785 does (see the
    module docstring); strings are checked for NFC afterwards, over the whole text."""
    # A walk with a stack of its own rather than a call per value, and strings (most of the
    # leaves) passed over where they are found: a record's walk is a third cheaper.
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            for key, member in item.items():
                if type(key) is not str or not key.isascii():
                    return False
                if type(member) is not str:
                    push(member)
        elif kind is list or kind is tuple:
            for member in item:
                if type(member) is not str:
                    push(member)
        elif kind is int:
            if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                return False
        elif kind is float:
            if not (1e-4 <= abs(item) < 1e16 and not item.is_integer()):
                return False
        elif kind is not str and kind is not bool:
            return False
    return True


_FAST_OPTIONS: Final = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER


def _fast_canonical(value: Any) -> bytes | None:
    if not _plain(value):
        return None
    try:
        encoded = orjson.dumps(value, option=_FAST_OPTIONS)
    except orjson.JSONEncodeError:  # a lone surrogate: the checked path refuses it
        return None
    if not encoded.isascii() and not unicodedata.is_normalized("NFC", encoded.decode("utf-8")):
        return None
    return encoded


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value`` after the contract's NFC / number / null checks."""
    fast = _fast_canonical(value)
    if fast is not None:
        return fast
    _check(value, "")
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, ValueError) as exc:
        raise CanonicalizationError("value cannot be canonicalized") from exc


def canonical_object(members: Mapping[str, bytes]) -> bytes:
    """RFC 8785 bytes of the object whose members' canonical bytes are already known (each value
    in ``members`` is ``canonical_bytes`` of that member's value): members sorted by key, as JCS
    does, so a page of packets already serialized once is not walked again."""
    if not all(type(key) is str and key.isascii() for key in members):
        raise CanonicalizationError("canonical_object takes ASCII keys only")
    return (
        b"{"
        + b",".join(canonical_bytes(key) + b":" + members[key] for key in sorted(members))
        + b"}"
    )


def canonical_array(items: Sequence[bytes]) -> bytes:
    """RFC 8785 bytes of the array whose items' canonical bytes are ``items``."""
    return b"[" + b",".join(items) + b"]"


def digest_bytes(kind: str, value: Any) -> bytes:
    return hashlib.sha256(
        domain_for(kind).encode("utf-8") + b"\x00" + canonical_bytes(value)
    ).digest()


def digest_of_canonical(kind: str, canonical: bytes) -> str:
    """``digest`` of the value whose canonical bytes are ``canonical`` (already serialized)."""
    return (
        DIGEST_PREFIX
        + hashlib.sha256(domain_for(kind).encode("utf-8") + b"\x00" + canonical).hexdigest()
    )


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

"""Opaque search page cursors (CONTRACT.md §7.1, §12).

A cursor binds the request digest, the scope and principal, the pinned ``(valid_as_of,
system_as_of)``, the ``ordered_ids_digest`` and the offset, and is authenticated with the host's
cursor key so it cannot be forged or moved to another scope. Anything that does not verify is
``STALE_PAGE``. The key may rotate (a ``KeyRing``): a cursor is signed with the current version
and verifies under the current or the previous one, so a page fetched across a rotation goes on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from engram_memory.contract.canonical import canonical_bytes
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.keyring import KeyRing

_VERSION = 1
_TAG_BYTES = 16


@dataclass(frozen=True, slots=True)
class PageState:
    request_digest: str
    binding: str  # digest of scope + principal
    valid_as_of: int
    system_as_of: str
    ordered_ids_digest: str
    offset: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_cursor(state: PageState, key: bytes | KeyRing) -> str:
    body = canonical_bytes(
        {
            "v": _VERSION,
            "rd": state.request_digest,
            "bd": state.binding,
            "va": state.valid_as_of,
            "sa": state.system_as_of,
            "od": state.ordered_ids_digest,
            "o": state.offset,
        }
    )
    signing = key.current() if isinstance(key, KeyRing) else key
    tag = hmac.new(signing, body, hashlib.sha256).digest()[:_TAG_BYTES]
    return _b64(body) + "." + _b64(tag)


def decode_cursor(cursor: str, key: bytes | KeyRing) -> PageState:
    try:
        body_part, tag_part = cursor.split(".")
        body = _unb64(body_part)
        tag = _unb64(tag_part)
    except (ValueError, binascii.Error):
        raise EngramError(ErrorCode.STALE_PAGE) from None

    def verified(version: bytes) -> bool | None:
        expected = hmac.new(version, body, hashlib.sha256).digest()[:_TAG_BYTES]
        return True if hmac.compare_digest(tag, expected) else None

    if KeyRing.fixed(key, minimum=0).first_that(verified) is None:
        raise EngramError(ErrorCode.STALE_PAGE)
    try:
        data: dict[str, Any] = json.loads(body)
        if data["v"] != _VERSION:
            raise EngramError(ErrorCode.STALE_PAGE)
        return PageState(
            request_digest=str(data["rd"]),
            binding=str(data["bd"]),
            valid_as_of=int(data["va"]),
            system_as_of=str(data["sa"]),
            ordered_ids_digest=str(data["od"]),
            offset=int(data["o"]),
        )
    except (KeyError, TypeError, ValueError):
        raise EngramError(ErrorCode.STALE_PAGE) from None

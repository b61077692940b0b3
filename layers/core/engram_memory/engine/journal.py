"""The per-scope, hash-chained journal with dense cursors (CONTRACT.md §4)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, Final

from engram_memory.contract.canonical import GENESIS_HASH, digest
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import JournalEvent, JournalHead, Store
from engram_memory.engine.records import decode, encode

EMPTY_HEAD = JournalHead(cursor=0, event_hash=GENESIS_HASH)
# Who made a terminal transition and why, beside its digests (``build_event``'s ``why``): the
# principal that committed it (``by``), the agent's ``reason_ref`` or the operator's ``reason``,
# and who approved an agent's (``approved_by``: ``engine.gate.approver_label``).
WHY_FIELDS: Final = frozenset({"by", "reason_ref", "reason", "approved_by"})
_VERIFY_BATCH = 500


def build_event(
    head: JournalHead,
    *,
    operation: str,
    target: str,
    at_ms: int,
    digests: Mapping[str, str],
    why: Mapping[str, str] | None = None,
) -> tuple[JournalEvent, str]:
    """The next event after ``head``; returns it with its ``event_id``.

    Events hold ids and digests only, never content: the journal can be shown to an operator
    without revealing a pending candidate. ``why``: what the operator reads beside them for a
    terminal transition (``WHY_FIELDS``: who, the agent's ``reason_ref`` — an opaque reference
    the contract bounds — or the operator's reason, and who approved); an event without them
    (written before them, or another operation) has none.
    """
    cursor = head.cursor + 1
    unknown = set(why or {}) - WHY_FIELDS
    if unknown:
        raise ValueError(f"not a journal event's reason field: {sorted(unknown)}")
    body: dict[str, Any] = {
        **(why or {}),
        "schema": 1,
        "cursor": str(cursor),
        "previous_event_hash": head.event_hash,
        "operation": operation,
        "target": target,
        "at": format_instant(at_ms),
        "digests": dict(digests),
    }
    event_hash = digest("journal-event", body)
    return JournalEvent(cursor=cursor, event_hash=event_hash, body=encode(body)), event_id_for(
        event_hash
    )


def event_id_for(event_hash: str) -> str:
    raw = bytes.fromhex(event_hash.removeprefix("sha256:"))[:20]
    return "evt_" + base64.b32encode(raw).decode("ascii").lower()


def verify_journal(store: Store, scope: Scope) -> JournalHead:
    """Walk the whole journal of ``scope``: dense cursors and an unbroken hash chain.

    Raises ``CURSOR_GAP`` on a missing cursor and ``JOURNAL_CORRUPT`` on a broken chain or an
    event whose body does not hash to its recorded hash.
    """
    previous = EMPTY_HEAD
    while True:
        batch = store.events(scope, previous.cursor, _VERIFY_BATCH)
        if not batch:
            break
        for event in batch:
            if event.cursor != previous.cursor + 1:
                raise EngramError(ErrorCode.CURSOR_GAP)
            body = decode(event.body)
            if (
                body.get("cursor") != str(event.cursor)
                or body.get("previous_event_hash") != previous.event_hash
                or digest("journal-event", body) != event.event_hash
            ):
                raise EngramError(ErrorCode.JOURNAL_CORRUPT)
            previous = JournalHead(event.cursor, event.event_hash)
    if store.head(scope) != previous:
        raise EngramError(ErrorCode.CURSOR_GAP)
    return previous

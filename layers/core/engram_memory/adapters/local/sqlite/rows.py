"""How the port's rows are kept in SQLite columns, and read back.

The engine and the wire see digests as ``sha256:<64 hex>`` text and journal bodies and ledger
outputs as the bytes the engine wrote; the store keeps the digests of ``DIGEST_COLUMNS`` as their
32 bytes (``digest_in``) and the bodies and outputs packed (``contract.packing``).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final

from engram_memory.contract.packing import unpack
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import CandidateRow, RecordRow

log = logging.getLogger(__name__)

# The columns that hold digests as their 32 bytes since store format 2 (``schema``).
DIGEST_COLUMNS: Final = {
    "journal_heads": ("event_hash",),
    "journal_events": ("event_hash",),
    "ledger": ("intent_hash",),
    "candidates": ("payload_digest", "record_digest"),
    "records": ("record_digest", "payload_digest"),
    "tombstones": ("payload_digest",),
}

# The columns a row is read from, in the order ``candidate_row`` and ``record_row`` take them.
CANDIDATE_COLUMNS: Final = (
    "candidate_id, principal, state, payload_digest, record_digest, record_id, capture_cursor, "
    "key_ref, sealed, policy_version, created_at_ms, held"
)
RECORD_COLUMNS: Final = (
    "record_id, state, record_digest, payload_digest, candidate_id, valid_from_ms, valid_to_ms, "
    "expires_at_ms, accepted_cursor, body"
)


def _select(columns: str, table: str, id_column: str, *, page: bool) -> str:
    """A row of ``table`` by its id, or (``page``) a page of its rows in one state or any
    (``state`` None) after an id: one constant statement per table and purpose."""
    scoped = f"SELECT {columns} FROM {table} WHERE tenant_id = ? AND workspace_id = ? "  # noqa: S608
    if not page:
        return scoped + f"AND {id_column} = ?"
    return scoped + f"AND (? IS NULL OR state = ?) AND {id_column} > ? ORDER BY {id_column} LIMIT ?"


CANDIDATE_BY_ID: Final = _select(CANDIDATE_COLUMNS, "candidates", "candidate_id", page=False)
RECORD_BY_ID: Final = _select(RECORD_COLUMNS, "records", "record_id", page=False)
CANDIDATES_PAGE: Final = _select(CANDIDATE_COLUMNS, "candidates", "candidate_id", page=True)
RECORDS_PAGE: Final = _select(RECORD_COLUMNS, "records", "record_id", page=True)


def as_bytes(value: Any) -> bytes:
    # A blob edited outside the engine may come back as TEXT; integrity checks still need bytes.
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


_DIGEST_PREFIX: Final = "sha256:"


def digest_in(digest: str) -> bytes | str:
    """A digest as the store keeps it: the 32 bytes of a ``sha256:<64 hex>`` (71 bytes of text
    in every row and index that holds it); anything else as the text it is."""
    if len(digest) == 71 and digest.startswith(_DIGEST_PREFIX):
        try:
            raw = bytes.fromhex(digest[7:])
        except ValueError:
            return digest
        if raw.hex() == digest[7:]:  # lowercase only: the text must come back exactly
            return raw
    return digest


def digest_out(value: Any) -> str:
    """The wire form of a stored digest (``digest_in`` undone)."""
    if isinstance(value, bytes) and len(value) == 32:
        return _DIGEST_PREFIX + value.hex()
    return value if isinstance(value, str) else as_bytes(value).decode("utf-8", "replace")


def candidate_row(row: tuple[Any, ...]) -> CandidateRow:
    (candidate_id, principal, state, payload_digest, record_digest, *rest) = row
    return CandidateRow(
        candidate_id,
        principal,
        state,
        digest_out(payload_digest),
        digest_out(record_digest),
        *rest,
    )


def scope_key(scope: Scope) -> tuple[str, str]:
    return scope.tenant_id, scope.workspace_id


def stored(row: CandidateRow | RecordRow, table: str) -> tuple[Any, ...]:
    """The row's values in its table's column order (the dataclass's field order is the
    table's; ``RecordRow.body_read`` says how a row was read and is not stored), the digests of
    ``DIGEST_COLUMNS`` as the store keeps them."""
    digests = DIGEST_COLUMNS[table]
    values = (
        (f.name, getattr(row, f.name)) for f in dataclasses.fields(row) if f.name != "body_read"
    )
    return tuple(digest_in(value) if name in digests else value for name, value in values)


def unpacked(value: Any) -> bytes:
    """A journal body or ledger output as the engine wrote it (the store keeps them packed:
    ``contract.packing``; rows written before packing are returned as they are)."""
    try:
        return unpack(as_bytes(value))
    except ValueError as exc:
        # Undecodable is damaged: the journal's verification then fails on its hash, as it would
        # on any other damaged body, instead of the read failing here.
        log.warning("a packed journal or ledger value could not be unpacked: %s", exc)
        return as_bytes(value)


def record_row(row: tuple[Any, ...]) -> RecordRow:
    (
        record_id,
        state,
        record_digest,
        payload_digest,
        candidate_id,
        valid_from,
        valid_to,
        expires_at,
        accepted_cursor,
        body,
    ) = row
    return RecordRow(
        record_id=record_id,
        state=state,
        record_digest=digest_out(record_digest),
        payload_digest=digest_out(payload_digest),
        candidate_id=candidate_id,
        valid_from_ms=valid_from,
        valid_to_ms=valid_to,
        expires_at_ms=expires_at,
        accepted_cursor=accepted_cursor,
        body=None if body is None else as_bytes(body),
    )

"""The tables of ``engram.db``, and the migrations that bring an older store to this layout."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Final

from engram_memory.adapters.local.sqlite import near_bands
from engram_memory.adapters.local.sqlite.connections import scrub_wal
from engram_memory.adapters.local.sqlite.rows import DIGEST_COLUMNS, as_bytes, digest_in
from engram_memory.adapters.local.transactions import immediate
from engram_memory.adapters.record_sealing import BODY_FORMAT
from engram_memory.contract.packing import is_packed, pack
from engram_memory.engine.context import Scope

log = logging.getLogger(__name__)

# A rowid table, not WITHOUT ROWID: a WITHOUT ROWID row is a b-tree key, kept on its page only up
# to about a quarter of the page (~1,000 bytes at 4 KiB) with the rest on an overflow page of its
# own, so every record of ~1-2 KB took two pages (3.1 KB on disk for 1.0 KB of row). A rowid
# table keeps rows of up to a page on the page, several to a page; the unique key is an index of
# the short ids beside it.
_RECORDS_TABLE: Final = """CREATE TABLE IF NOT EXISTS {name} (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, record_id TEXT NOT NULL,
    state TEXT NOT NULL, record_digest TEXT NOT NULL, payload_digest TEXT NOT NULL,
    candidate_id TEXT NOT NULL, valid_from_ms INTEGER NOT NULL, valid_to_ms INTEGER,
    expires_at_ms INTEGER, accepted_cursor INTEGER NOT NULL, body BLOB, lex_rowid INTEGER,
    UNIQUE (tenant_id, workspace_id, record_id));"""
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS journal_heads (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL,
    cursor INTEGER NOT NULL, event_hash TEXT NOT NULL,
    PRIMARY KEY (tenant_id, workspace_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_events (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, cursor INTEGER NOT NULL,
    event_hash TEXT NOT NULL, body BLOB NOT NULL,
    PRIMARY KEY (tenant_id, workspace_id, cursor)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, principal TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, tool TEXT NOT NULL, target TEXT,
    intent_hash TEXT NOT NULL, output BLOB NOT NULL, cursor INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, workspace_id, principal, idempotency_key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS candidates (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, candidate_id TEXT NOT NULL,
    principal TEXT NOT NULL, state TEXT NOT NULL, payload_digest TEXT NOT NULL,
    record_digest TEXT NOT NULL, record_id TEXT NOT NULL, capture_cursor INTEGER NOT NULL,
    key_ref TEXT NOT NULL, sealed BLOB NOT NULL, policy_version TEXT NOT NULL,
    created_at_ms INTEGER NOT NULL, held TEXT,
    PRIMARY KEY (tenant_id, workspace_id, candidate_id)) WITHOUT ROWID;
{records}
CREATE TABLE IF NOT EXISTS tombstones (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, payload_digest TEXT NOT NULL,
    record_id TEXT NOT NULL, cursor INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, workspace_id, payload_digest, record_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS used_approvals (
    approval_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL,
    cursor INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS used_nonces (
    nonce TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL,
    expires_at_ms INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    item_id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant_id TEXT NOT NULL,
    workspace_id TEXT NOT NULL, target TEXT NOT NULL, surface TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS store_meta (
    key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS revocations (
    tenant_id TEXT NOT NULL, kind TEXT NOT NULL, value TEXT NOT NULL,
    revoked_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, kind, value)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS vector_generations (
    table_name TEXT PRIMARY KEY, generation INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS lexical_tables (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, table_name TEXT NOT NULL UNIQUE,
    PRIMARY KEY (tenant_id, workspace_id)) WITHOUT ROWID;
""".format(records=_RECORDS_TABLE.format(name="records"))

# The layout of engram.db. 1 (no ``store_format`` in store_meta): records WITHOUT ROWID, journal
# bodies and ledger outputs as plain JSON, digests as text. 2: records a rowid table, journal
# bodies and ledger outputs packed (``contract.packing``), the digests of ``rows.DIGEST_COLUMNS``
# as their 32 bytes (``rows.digest_in``; the engine and the wire see the text). Opening a store
# of format 1 migrates it in place.
STORE_FORMAT: Final = 2


def create_or_migrate(conn: sqlite3.Connection) -> None:
    """The tables, made when missing, of this ``STORE_FORMAT`` (an older store migrated)."""
    conn.executescript(_SCHEMA)
    _add_columns(conn)
    for (lexical_table,) in conn.execute("SELECT table_name FROM lexical_tables").fetchall():
        # A scope from before the near-duplicate sketches: its table, filled when the store is
        # re-projected (``projections.staleness``).
        near_bands.create(conn, lexical_table)
    _migrate(conn)


def _add_columns(conn: sqlite3.Connection) -> None:
    """Columns added to a table after its store format: nullable, so an ``ALTER TABLE`` adds
    them without rewriting a row. ``candidates.held`` (a policy's hold, issue 35)."""
    if "held" in {row[1] for row in conn.execute("PRAGMA table_info(candidates)")}:
        return
    with immediate(conn):  # another process opening the same file may have added it
        if "held" not in {row[1] for row in conn.execute("PRAGMA table_info(candidates)")}:
            conn.execute("ALTER TABLE candidates ADD COLUMN held TEXT")


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring a store of an older ``STORE_FORMAT`` to this one, in one transaction (another
    process opening the same file at the same time waits, then finds it done), then vacuum
    the pages the old layout freed out of the file.

    Format 1 to 2: the records move into the rowid table, the journal bodies and ledger
    outputs are packed, the digests become bytes. Record bodies stay as they are (sealed: packing them would mean
    opening and re-sealing each one; an old body is read as it is, new ones are packed).
    """
    row = conn.execute("SELECT value FROM store_meta WHERE key = 'store_format'").fetchone()
    if row is not None and int(row[0]) >= STORE_FORMAT:
        return
    with immediate(conn):
        found = _format(conn)
        if found < STORE_FORMAT:
            _migrate_from_1(conn)
        if found <= STORE_FORMAT:
            conn.execute(
                "INSERT INTO store_meta VALUES ('store_format', ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(STORE_FORMAT),),
            )
    if found < STORE_FORMAT:
        log.info("migrated engram.db from store format %d to %d", found, STORE_FORMAT)
        try:
            conn.execute("VACUUM")
        except sqlite3.Error:
            # Another process reading: the freed pages (zeroed by secure_delete) stay on the
            # free list and are reused by later writes; the migration itself is done.
            log.warning("could not vacuum engram.db after its migration")
        scrub_wal(conn)


def _format(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT value FROM store_meta WHERE key = 'store_format'").fetchone()
    if row is not None:
        return int(row[0])
    # No format recorded: a new store (nothing written yet) is born in this one.
    has_rows = conn.execute("SELECT 1 FROM journal_heads LIMIT 1").fetchone() is not None
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'records'"
    ).fetchone()
    return 1 if has_rows or "WITHOUT ROWID" in str(sql).upper() else STORE_FORMAT


def _migrate_from_1(conn: sqlite3.Connection) -> None:
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'records'"
    ).fetchone()
    if "WITHOUT ROWID" in str(sql).upper():
        conn.execute(_RECORDS_TABLE.format(name="records_format_2"))
        conn.execute("INSERT INTO records_format_2 SELECT * FROM records")
        conn.execute("DROP TABLE records")
        conn.execute("ALTER TABLE records_format_2 RENAME TO records")
    conn.create_function(
        "engram_digest_in",
        1,
        lambda value: digest_in(value) if isinstance(value, str) else value,
        deterministic=True,
    )
    for table, columns in DIGEST_COLUMNS.items():
        assignments = ", ".join(f"{column} = engram_digest_in({column})" for column in columns)
        conn.execute(f"UPDATE {table} SET {assignments}")  # noqa: S608 - our names
    for table, column, key in (
        ("journal_events", "body", "tenant_id, workspace_id, cursor"),
        ("ledger", "output", "tenant_id, workspace_id, principal, idempotency_key"),
    ):
        where = " AND ".join(f"{name} = ?" for name in key.split(", "))
        rows = conn.execute(f"SELECT {column}, {key} FROM {table}").fetchall()  # noqa: S608
        conn.executemany(
            f"UPDATE {table} SET {column} = ? WHERE {where}",  # noqa: S608 - our names
            [
                (pack(as_bytes(value)), *rest)
                for value, *rest in rows
                if not is_packed(as_bytes(value))
            ],
        )


def seal_plaintext_bodies(
    conn: sqlite3.Connection, seal: Callable[[Scope, str, bytes], bytes]
) -> int:
    """Seal the record bodies a database from before sealed bodies holds in plaintext (the
    migration, run when the data directory is opened); return how many.

    Each body is replaced in place (``secure_delete`` zeroes the old cells) and the WAL is
    scrubbed afterwards, so the plaintext is gone from ``engram.db`` and its -wal. The lexical
    projection keeps its terms (it is derived, live data, never backed up); backups taken
    before the migration still hold the plaintext and should be replaced by a new one.
    """
    legacy = conn.execute(
        "SELECT tenant_id, workspace_id, record_id, body FROM records "
        "WHERE body IS NOT NULL AND substr(body, 1, 4) != ?",
        (BODY_FORMAT,),
    ).fetchall()
    if not legacy:
        return 0
    sealed = [
        (seal(Scope(t, w), record_id, as_bytes(body)), t, w, record_id)
        for t, w, record_id, body in legacy
    ]
    with immediate(conn):
        conn.executemany(
            "UPDATE records SET body = ? WHERE tenant_id = ? AND workspace_id = ? "
            "AND record_id = ?",
            sealed,
        )
    scrub_wal(conn)
    log.info("sealed the plaintext bodies of a database from before sealed bodies")
    return len(sealed)

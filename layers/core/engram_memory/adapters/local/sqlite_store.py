"""The embedded canonical store: one SQLite database in WAL mode.

One transaction per mutation covers the journal, the ledger, candidate control rows, records,
the tombstone index, used approvals, the outbox and the FTS5 lexical projection, so a mutation
is either wholly there or not at all. Each scope's lexical projection is its own FTS5 table:
a query can only ever read its own scope's rows, never scans another's, and BM25 statistics
(document counts, lengths, term frequencies) are exactly those of the scope.

With a semantic channel, each scope also has a vector table beside its FTS5 table
(``vec_<scope hash>``: record id → float32 little-endian vector). It is written and deleted by
the same projection change, in the same transaction, so a forgotten record's vector goes with
its lexical projection. ``nearest`` is exact (dot products of unit vectors = cosine similarity)
over an in-memory matrix of the scope's vectors (``vector_matrix``), reloaded when the table's
generation, bumped in the transaction of every vector write or delete, moved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sqlite3
import sys
import threading
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar

from engram_memory.adapters.local import lexical_topk
from engram_memory.adapters.local.transactions import immediate
from engram_memory.adapters.local.vector_matrix import VectorMatrices
from engram_memory.adapters.record_sealing import BODY_FORMAT
from engram_memory.contract.canonical import GENESIS_HASH
from engram_memory.contract.packing import is_packed, pack, unpack
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    CandidateRow,
    ChangeSet,
    CommitConflict,
    CommitOutcomeUnknown,
    IndexHit,
    IndexUnavailable,
    JournalEvent,
    JournalHead,
    LedgerEntry,
    OutboxItem,
    ProjectionChange,
    ProjectionDoc,
    RecordRow,
    StateTransition,
    StoreUnavailable,
)

FaultHook = Callable[[str], None]
log = logging.getLogger(__name__)


class _TableFinder(Protocol):
    def __call__(self, conn: sqlite3.Connection, scope: Scope, *, create: bool) -> str | None: ...


T = TypeVar("T")

_FIELDS: Final = tuple(lexical.FIELD_WEIGHTS)
# FTS5 column per weighted field ("primary" is an SQL keyword, hence the prefix).
_COLUMNS: Final = tuple(f"f_{name}" for name in _FIELDS)
_BM25_ARGS: Final = ", ".join(["0.0", *(repr(w) for w in lexical.FIELD_WEIGHTS.values())])

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
# bodies and ledger outputs packed (``contract.packing``), the digests of ``_DIGEST_COLUMNS`` as
# their 32 bytes (``_digest_in``; the engine and the wire see the text). Opening a store of
# format 1 migrates it in place.
STORE_FORMAT: Final = 2
_DIGEST_COLUMNS: Final = {
    "journal_heads": ("event_hash",),
    "journal_events": ("event_hash",),
    "ledger": ("intent_hash",),
    "candidates": ("payload_digest", "record_digest"),
    "records": ("record_digest", "payload_digest"),
    "tombstones": ("payload_digest",),
}

_CANDIDATE_COLUMNS: Final = (
    "candidate_id, principal, state, payload_digest, record_digest, record_id, capture_cursor, "
    "key_ref, sealed, policy_version, created_at_ms, held"
)
_RECORD_COLUMNS: Final = (
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


_CANDIDATE_BY_ID: Final = _select(_CANDIDATE_COLUMNS, "candidates", "candidate_id", page=False)
_RECORD_BY_ID: Final = _select(_RECORD_COLUMNS, "records", "record_id", page=False)
_CANDIDATES_PAGE: Final = _select(_CANDIDATE_COLUMNS, "candidates", "candidate_id", page=True)
_RECORDS_PAGE: Final = _select(_RECORD_COLUMNS, "records", "record_id", page=True)


def _as_bytes(value: Any) -> bytes:
    # A blob edited outside the engine may come back as TEXT; integrity checks still need bytes.
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


_DIGEST_PREFIX: Final = "sha256:"


def _digest_in(digest: str) -> bytes | str:
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


def _digest_out(value: Any) -> str:
    """The wire form of a stored digest (``_digest_in`` undone)."""
    if isinstance(value, bytes) and len(value) == 32:
        return _DIGEST_PREFIX + value.hex()
    return value if isinstance(value, str) else _as_bytes(value).decode("utf-8", "replace")


def _candidate_row(row: tuple[Any, ...]) -> CandidateRow:
    (candidate_id, principal, state, payload_digest, record_digest, *rest) = row
    return CandidateRow(
        candidate_id,
        principal,
        state,
        _digest_out(payload_digest),
        _digest_out(record_digest),
        *rest,
    )


@dataclass(frozen=True, slots=True)
class _RowTable:
    """How a commit writes one kind of row: ``insert`` a new one (``taken``: the conflict when
    its key already is), ``move`` one from a state to the next, dropping its heavy column when
    the commit says so (the statements' second parameter)."""

    name: str
    insert: str
    taken: Literal["ledger", "state"]
    move: str


_CANDIDATES: Final = _RowTable(
    "candidates",
    "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "ledger",
    # A candidate leaving ``pending`` (admitted, rejected, withdrawn) is never opened again and
    # its key's destruction is queued in this same commit: its ciphertext is dead weight (2-3 KB
    # a record), dropped here and zeroed by secure_delete. Its hold, if a policy held it, ends.
    "UPDATE candidates SET state = ?, held = NULL, sealed = CASE WHEN ? THEN X'' ELSE sealed END "
    "WHERE tenant_id = ? AND workspace_id = ? AND candidate_id = ? AND state = ?",
)
# An admission policy's hold (``ChangeSet.hold``): the candidate must still be pending.
_HOLD: Final = (
    "UPDATE candidates SET held = ? "
    "WHERE tenant_id = ? AND workspace_id = ? AND candidate_id = ? AND state = 'pending'"
)
_HELD: Final = (
    "SELECT 1 FROM candidates WHERE tenant_id = ? AND workspace_id = ? AND candidate_id = ? "
    "AND held IS NOT NULL"
)
_RECORDS: Final = _RowTable(
    "records",
    "INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
    "state",
    # Forget shreds the body in the commit that tombstones the record.
    "UPDATE records SET state = ?, body = CASE WHEN ? THEN NULL ELSE body END "
    "WHERE tenant_id = ? AND workspace_id = ? AND record_id = ? AND state = ?",
)


def _scope_key(scope: Scope) -> tuple[str, str]:
    return scope.tenant_id, scope.workspace_id


def _stored(row: CandidateRow | RecordRow, table: str) -> tuple[Any, ...]:
    """The row's values in its table's column order (the dataclass's field order is the
    table's; ``RecordRow.body_read`` says how a row was read and is not stored), the digests of
    ``_DIGEST_COLUMNS`` as the store keeps them."""
    digests = _DIGEST_COLUMNS[table]
    values = (
        (f.name, getattr(row, f.name)) for f in dataclasses.fields(row) if f.name != "body_read"
    )
    return tuple(_digest_in(value) if name in digests else value for name, value in values)


def _insert_or_conflict(
    conn: sqlite3.Connection,
    sql: str,
    values: tuple[Any, ...],
    conflict: Literal["ledger", "state", "approval"],
) -> None:
    # A key already taken is another commit having won the race: the engine retries or answers.
    try:
        conn.execute(sql, values)
    except sqlite3.IntegrityError:
        raise CommitConflict(conflict) from None


def _update_one(conn: sqlite3.Connection, sql: str, values: tuple[Any, ...]) -> None:
    # A transition's ``from_state`` no longer holding means another commit moved the row first.
    if conn.execute(sql, values).rowcount != 1:
        raise CommitConflict("state")


def _unpacked(value: Any) -> bytes:
    """A journal body or ledger output as the engine wrote it (the store keeps them packed:
    ``contract.packing``; rows written before packing are returned as they are)."""
    try:
        return unpack(_as_bytes(value))
    except ValueError as exc:
        # Undecodable is damaged: the journal's verification then fails on its hash, as it would
        # on any other damaged body, instead of the read failing here.
        log.warning("a packed journal or ledger value could not be unpacked: %s", exc)
        return _as_bytes(value)


def _record_row(row: tuple[Any, ...]) -> RecordRow:
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
        record_digest=_digest_out(record_digest),
        payload_digest=_digest_out(payload_digest),
        candidate_id=candidate_id,
        valid_from_ms=valid_from,
        valid_to_ms=valid_to,
        expires_at_ms=expires_at,
        accepted_cursor=accepted_cursor,
        body=None if body is None else _as_bytes(body),
    )


def lexical_table_name(scope: Scope) -> str:
    scope_hash = hashlib.sha256(f"{scope.tenant_id}\x00{scope.workspace_id}".encode()).hexdigest()
    return "lex_" + scope_hash[:32]


def vector_table_name(scope: Scope) -> str:
    return "vec_" + lexical_table_name(scope)[4:]


def _pack(vector: Sequence[float]) -> bytes:
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpack(blob: bytes) -> array[float]:
    vector = array("f")
    vector.frombytes(blob)
    if sys.byteorder == "big":
        vector.byteswap()
    return vector


DEFAULT_POOL_SIZE: Final = 8
# Each pooled connection's page cache, in KiB. SQLite's default (2 MiB) per connection filled
# slowly over hours of serving (8 connections: 16 MiB) and bought little: in WAL mode a
# connection drops its whole cache whenever another one has committed, so under mixed traffic
# the caches were mostly refilled, and the churn of their pages fragmented malloc's heap (issue
# 13's soak: RSS grew with the calls). A read that misses goes to the operating system's cache.
PAGE_CACHE_KIB: Final = 512
# How far past the depth a lexical query ranks by score alone (``_top_by_score``).
_TIE_SLACK: Final = 64


def _drops_projection(change: ProjectionChange | None) -> bool:
    return change is not None and change.delete_record_id is not None


class _ConnectionPool:
    """SQLite connections checked out for one operation and then returned.

    At most ``size`` connections are open at once, however many threads call (the server's
    worker threads come and go: connections kept per thread leaked one per thread, with its file
    handles and page cache). A caller finding all of them in use waits up to ``wait_s`` for one.
    A thread already holding a connection gets the same one back, so nested use never waits on
    itself. ``close`` closes the idle connections now and those in use when they come back.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], size: int, wait_s: float) -> None:
        if size < 1:
            raise ValueError("the pool needs at least one connection")
        self._connect = connect
        self._size = size
        self._wait_s = wait_s
        self._idle: list[sqlite3.Connection] = []
        self._open = 0
        self._generation = 0  # bumped by close(): connections of an older one are not kept
        self._available = threading.Condition()
        self._held = threading.local()

    @property
    def open_count(self) -> int:
        with self._available:
            return self._open

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        held: sqlite3.Connection | None = getattr(self._held, "conn", None)
        if held is not None:
            yield held
            return
        conn, generation = self._check_out()
        self._held.conn = conn
        try:
            yield conn
        finally:
            self._held.conn = None
            self._check_in(conn, generation)

    def _check_out(self) -> tuple[sqlite3.Connection, int]:
        with self._available:
            if not self._available.wait_for(
                lambda: self._idle or self._open < self._size, timeout=self._wait_s
            ):
                raise StoreUnavailable("no sqlite connection became free in time")
            if self._idle:
                return self._idle.pop(), self._generation
            self._open += 1
            generation = self._generation
        try:
            return self._connect(), generation
        except BaseException:
            with self._available:
                self._open -= 1
                self._available.notify()
            raise

    def _check_in(self, conn: sqlite3.Connection, generation: int) -> None:
        keep = True
        if conn.in_transaction:  # a failure left it mid-transaction: never hand that on
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                keep = False
        with self._available:
            if keep and generation == self._generation:
                self._idle.append(conn)
                self._available.notify()
                return
            self._open -= 1
            self._available.notify()
        conn.close()

    def close(self) -> None:
        with self._available:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._generation += 1
            self._available.notify_all()
        for conn in idle:
            conn.close()


_LEDGER_AT: Final = (
    "SELECT principal, idempotency_key, tool, target, intent_hash, output, cursor FROM ledger"
    " WHERE tenant_id = ? AND workspace_id = ? AND cursor IN"
)


class SqliteStore:
    """The ``Store`` port on SQLite. Thread-safe: each operation checks a connection out of a
    bounded pool (``pool_size``) and returns it; writers are serialized by ``BEGIN IMMEDIATE``.

    ``fault_hook`` is a test seam: it is called with the name of each step of a commit
    (``begin``, ``head``, ``ledger``, ``event``, ``candidate``, ``record``, ``tombstone``,
    ``projection``, ``approval``, ``outbox``, ``commit``, ``after_commit``) and may raise
    ``sqlite3.Error`` to inject a failure there.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        fault_hook: FaultHook | None = None,
        busy_timeout_ms: int = 10_000,
        pool_size: int = DEFAULT_POOL_SIZE,
    ):
        self._path = str(path)
        if self._path != ":memory:" and not os.path.exists(self._path):
            # Owner-only from the first byte: SQLite gives its -wal/-shm files the same mode.
            os.close(os.open(self._path, os.O_CREAT | os.O_WRONLY, 0o600))
        self._fault_hook = fault_hook
        self._busy_timeout_ms = busy_timeout_ms
        self._pool = _ConnectionPool(self._connect, pool_size, busy_timeout_ms / 1000)
        self._matrices = VectorMatrices()
        with self._guard(), self._pool.connection() as conn:
            conn.executescript(_SCHEMA)
            self._add_columns(conn)
            self._migrate(conn)

    @staticmethod
    def _add_columns(conn: sqlite3.Connection) -> None:
        """Columns added to a table after its store format: nullable, so an ``ALTER TABLE`` adds
        them without rewriting a row. ``candidates.held`` (a policy's hold, issue 35)."""
        if "held" in {row[1] for row in conn.execute("PRAGMA table_info(candidates)")}:
            return
        with immediate(conn):  # another process opening the same file may have added it
            if "held" not in {row[1] for row in conn.execute("PRAGMA table_info(candidates)")}:
                conn.execute("ALTER TABLE candidates ADD COLUMN held TEXT")

    def _migrate(self, conn: sqlite3.Connection) -> None:
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
            found = self._format(conn)
            if found < STORE_FORMAT:
                self._migrate_from_1(conn)
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
            self._scrub_wal(conn)

    @staticmethod
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

    @staticmethod
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
            lambda value: _digest_in(value) if isinstance(value, str) else value,
            deterministic=True,
        )
        for table, columns in _DIGEST_COLUMNS.items():
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
                    (pack(_as_bytes(value)), *rest)
                    for value, *rest in rows
                    if not is_packed(_as_bytes(value))
                ],
            )

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA secure_delete = ON")  # shredded bodies are overwritten on disk
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")  # negative: KiB, not pages
        except BaseException:
            conn.close()
            raise
        return conn

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreUnavailable("sqlite store error") from exc

    def close(self) -> None:
        """Checkpoint and truncate the WAL, then close every pooled connection.

        The store stays usable: later calls open new connections.
        """
        try:
            with self._pool.connection() as conn:
                self._scrub_wal(conn)
        except (sqlite3.Error, StoreUnavailable):
            log.warning("could not truncate the WAL on close")
        self._pool.close()

    def open_connections(self) -> int:
        """How many SQLite connections the store holds open now (idle and in use)."""
        return self._pool.open_count

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        self._fault_hook = hook

    def _fault(self, step: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(step)

    # -- reads -----------------------------------------------------------------------------------

    def head(self, scope: Scope) -> JournalHead:
        with self._guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT cursor, event_hash FROM journal_heads WHERE tenant_id = ? AND workspace_id = ?",
                (scope.tenant_id, scope.workspace_id),
            ).fetchone()
        return JournalHead(row[0], _digest_out(row[1])) if row else JournalHead(0, GENESIS_HASH)

    def ledger_get(self, scope: Scope, principal: str, idempotency_key: str) -> LedgerEntry | None:
        rows = self._fetch(
            "SELECT principal, idempotency_key, tool, target, intent_hash, output, cursor FROM ledger "
            "WHERE tenant_id = ? AND workspace_id = ? AND principal = ? AND idempotency_key = ?",
            (*_scope_key(scope), principal, idempotency_key),
        )
        if not rows:
            return None
        principal, key, tool, target, intent_hash, output, cursor = rows[0]
        return LedgerEntry(
            principal, key, tool, target, _digest_out(intent_hash), _unpacked(output), cursor
        )

    def ledger_at(self, scope: Scope, cursors: Sequence[int]) -> dict[int, LedgerEntry]:
        """The ledger entries committed with these journal cursors (``ports.LedgerByCursor``)."""
        wanted = sorted(set(cursors))
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))
        query = f"{_LEDGER_AT} ({marks})"
        rows = self._fetch(query, (*_scope_key(scope), *wanted))
        return {
            cursor: LedgerEntry(
                principal, key, tool, target, _digest_out(intent_hash), _unpacked(output), cursor
            )
            for principal, key, tool, target, intent_hash, output, cursor in rows
        }

    def candidate_get(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        rows = self._fetch(_CANDIDATE_BY_ID, (*_scope_key(scope), candidate_id))
        return _candidate_row(rows[0]) if rows else None

    def record_get(self, scope: Scope, record_id: str) -> RecordRow | None:
        rows = self._fetch(_RECORD_BY_ID, (*_scope_key(scope), record_id))
        return _record_row(rows[0]) if rows else None

    def _fetch(self, sql: str, parameters: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with self._guard(), self._pool.connection() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(sql, parameters).fetchall()
        return rows

    def records_get(
        self, scope: Scope, record_ids: Sequence[str], *, bodies: bool = True
    ) -> dict[str, RecordRow]:
        # Every row comes with its body (``bodies`` is a hint): reading it in the same local
        # query costs less than a second query for the page's bodies would.
        found: dict[str, RecordRow] = {}
        ids = list(dict.fromkeys(record_ids))
        if not ids:
            return found
        with self._guard(), self._pool.connection() as conn:
            # One SQL text whatever the number of ids (a JSON array in one parameter): an IN list
            # of n placeholders is another statement for every n, and each pooled connection's
            # statement cache kept up to 128 of those large one-off statements, so the server's
            # memory grew with the sizes of the result sets it had seen (the soak's RSS growth).
            rows = conn.execute(
                f"SELECT {_RECORD_COLUMNS} FROM records "  # noqa: S608 - constant column list
                "WHERE tenant_id = ? AND workspace_id = ? "
                "AND record_id IN (SELECT value FROM json_each(?))",
                (scope.tenant_id, scope.workspace_id, json.dumps(ids)),
            ).fetchall()
        for row in rows:
            found[row[0]] = _record_row(row)
        return found

    def payload_tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        with self._guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM tombstones WHERE tenant_id = ? AND workspace_id = ? AND payload_digest = ? LIMIT 1",
                (scope.tenant_id, scope.workspace_id, _digest_in(payload_digest)),
            ).fetchone()
        return row is not None

    def events(self, scope: Scope, after_cursor: int, limit: int) -> list[JournalEvent]:
        rows = self._fetch(
            "SELECT cursor, event_hash, body FROM journal_events "
            "WHERE tenant_id = ? AND workspace_id = ? AND cursor > ? ORDER BY cursor LIMIT ?",
            (*_scope_key(scope), after_cursor, limit),
        )
        return [
            JournalEvent(cursor, _digest_out(event_hash), _unpacked(body))
            for cursor, event_hash, body in rows
        ]

    def spend_approval(self, scope: Scope, approval_id: str) -> bool:
        # cursor 0: no journal event spent it (a commit records its event's cursor)
        with self._guard(), self._pool.connection() as conn:
            inserted = conn.execute(
                "INSERT OR IGNORE INTO used_approvals VALUES (?, ?, ?, 0)",
                (approval_id, *_scope_key(scope)),
            ).rowcount
        return inserted == 1

    def claim_nonce(self, scope: Scope, nonce: str, expires_at_ms: int) -> bool:
        with self._guard(), self._pool.connection() as conn:
            inserted = conn.execute(
                "INSERT OR IGNORE INTO used_nonces VALUES (?, ?, ?, ?)",
                (nonce, scope.tenant_id, scope.workspace_id, expires_at_ms),
            ).rowcount
        return inserted == 1

    def outbox_pending(self, limit: int) -> list[OutboxItem]:
        with self._guard(), self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT item_id, kind, tenant_id, workspace_id, target, surface FROM outbox ORDER BY item_id LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            OutboxItem(i, k, Scope(t, w), target, surface) for i, k, t, w, target, surface in rows
        ]

    def outbox_pending_in(self, scope: Scope, kind: str | None, limit: int) -> list[OutboxItem]:
        query = (
            "SELECT item_id, kind, tenant_id, workspace_id, target, surface FROM outbox "
            "WHERE tenant_id = ? AND workspace_id = ? AND (? IS NULL OR kind = ?) "
            "ORDER BY item_id LIMIT ?"
        )
        with self._guard(), self._pool.connection() as conn:
            rows = conn.execute(
                query, (scope.tenant_id, scope.workspace_id, kind, kind, limit)
            ).fetchall()
        return [
            OutboxItem(i, k, Scope(t, w), target, surface) for i, k, t, w, target, surface in rows
        ]

    def outbox_done(self, item: OutboxItem) -> None:
        with self._guard(), self._pool.connection() as conn:
            # Not synced on its own: the next synced commit (the WAL is one file, synced whole)
            # makes it durable. A power cut before that only leaves the item to be done again,
            # and every outbox item is idempotent; the fsync it saved was one in four per write.
            conn.execute("PRAGMA synchronous = NORMAL")
            try:
                conn.execute("DELETE FROM outbox WHERE item_id = ?", (item.item_id,))
            finally:
                conn.execute("PRAGMA synchronous = FULL")

    def outbox_has(self, scope: Scope, kind: str, target: str) -> bool:
        with self._guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM outbox WHERE tenant_id = ? AND workspace_id = ? AND kind = ? AND target = ? LIMIT 1",
                (scope.tenant_id, scope.workspace_id, kind, target),
            ).fetchone()
        return row is not None

    # -- the operations plane (operators only) ---------------------------------------------------

    def scopes(self) -> list[Scope]:
        with self._guard(), self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT tenant_id, workspace_id FROM journal_heads ORDER BY tenant_id, workspace_id"
            ).fetchall()
        return [Scope(tenant_id, workspace_id) for tenant_id, workspace_id in rows]

    def candidates_list(
        self, scope: Scope, state: str | None, after: str, limit: int
    ) -> list[CandidateRow]:
        listed = self._fetch(_CANDIDATES_PAGE, (*_scope_key(scope), state, state, after, limit))
        return [_candidate_row(row) for row in listed]

    def records_list(
        self, scope: Scope, state: str | None, after: str, limit: int
    ) -> list[RecordRow]:
        listed = self._fetch(_RECORDS_PAGE, (*_scope_key(scope), state, state, after, limit))
        return [_record_row(row) for row in listed]

    def state_counts(self, scope: Scope) -> dict[str, int]:
        where = "WHERE tenant_id = ? AND workspace_id = ?"
        counts: dict[str, int] = {}
        with self._guard(), self._pool.connection() as conn:
            for prefix, table, column in (
                ("candidate", "candidates", "state"),
                ("record", "records", "state"),
                ("outbox", "outbox", "kind"),
            ):
                for value, count in conn.execute(
                    f"SELECT {column}, COUNT(*) FROM {table} {where} GROUP BY {column}",  # noqa: S608
                    (scope.tenant_id, scope.workspace_id),
                ):
                    counts[f"{prefix}:{value}"] = int(count)
        return counts

    def revoke_credentials(self, tenant_id: str, kind: str, value: str, at_ms: int) -> None:
        with self._guard(), self._pool.connection() as conn:
            conn.execute(
                "INSERT INTO revocations VALUES (?, ?, ?, ?) ON CONFLICT (tenant_id, kind, value) "
                "DO UPDATE SET revoked_at_ms = MAX(revoked_at_ms, excluded.revoked_at_ms)",
                (tenant_id, kind, value, at_ms),
            )

    def credential_revoked(
        self, tenant_id: str, token_id: str | None, principal: str, issued_at_ms: int
    ) -> bool:
        with self._guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM revocations WHERE tenant_id = ? AND ("
                "(kind = 'token' AND value = ?) OR "
                "(kind = 'principal' AND value = ? AND revoked_at_ms >= ?)) LIMIT 1",
                (tenant_id, token_id, principal, issued_at_ms),
            ).fetchone()
        return row is not None

    def meta_get(self, key: str) -> str | None:
        """A value of the store's own bookkeeping (``store_meta``), or None."""
        with self._guard(), self._pool.connection() as conn:
            row = conn.execute("SELECT value FROM store_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def meta_set(self, key: str, value: str) -> None:
        with self._guard(), self._pool.connection() as conn:
            conn.execute(
                "INSERT INTO store_meta VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def backup_to(self, target: Path) -> None:
        """A consistent copy of the canonical store at ``target`` (which must not exist), made
        with SQLite's online backup API beside live traffic, without its projections: the
        per-scope FTS5 and vector tables are dropped from the copy (they are derived data, rebuilt
        on restore), the copy's projection outbox items with them, and the copy is vacuumed so no
        page of theirs survives in the file."""
        target = Path(target)
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        copy = sqlite3.connect(str(target), isolation_level=None)
        try:
            with self._guard(), self._pool.connection() as conn:
                conn.backup(copy)
            copy.execute("PRAGMA journal_mode = DELETE")
            copy.execute("PRAGMA secure_delete = ON")
            for (lexical_table,) in copy.execute(
                "SELECT table_name FROM lexical_tables"
            ).fetchall():
                copy.execute(f"DROP TABLE IF EXISTS {lexical_table}")
                copy.execute(f"DROP TABLE IF EXISTS vec_{lexical_table[4:]}")
            copy.execute("DELETE FROM lexical_tables")
            copy.execute("UPDATE records SET lex_rowid = NULL WHERE lex_rowid IS NOT NULL")
            copy.execute(
                "DELETE FROM outbox WHERE kind IN ('upsert_projection', 'drop_projection')"
            )
            copy.execute("DELETE FROM store_meta WHERE key = 'lexical_version'")
            copy.execute("VACUUM")
        except sqlite3.Error as exc:
            copy.close()
            target.unlink(missing_ok=True)
            raise StoreUnavailable("the backup could not be written") from exc
        copy.close()

    # -- the commit ----------------------------------------------------------------------------

    def commit(self, changes: ChangeSet) -> None:
        committed = False
        try:
            with self._pool.connection() as conn:
                self._fault("begin")
                conn.execute("BEGIN IMMEDIATE")
                try:
                    self._apply(conn, changes)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                try:
                    self._fault("commit")
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    # A failed COMMIT (I/O error, timeout) may or may not have reached the disk.
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise CommitOutcomeUnknown("commit outcome unknown") from exc
                committed = True
                self._fault("after_commit")
                if changes.shred_record_body or _drops_projection(changes.projection):
                    self._scrub_wal(conn)
        except (CommitConflict, CommitOutcomeUnknown):
            raise
        except sqlite3.Error as exc:
            if committed:
                raise CommitOutcomeUnknown("failure after commit") from exc
            raise StoreUnavailable("sqlite store error") from exc

    def _apply(self, conn: sqlite3.Connection, changes: ChangeSet) -> None:
        # The steps run in this order, each after its fault point, so a fault injected at any one
        # leaves the steps before it written and rolled back together.
        self._check_head(conn, changes)
        self._insert_ledger(conn, changes)
        if changes.event is not None:
            self._fault("event")
            self._append_event(conn, changes.scope, changes.event)
        moved = changes.candidate_transition
        if changes.new_candidate is not None or moved is not None or changes.hold is not None:
            self._fault("candidate")
            self._hold_conditions(conn, changes)
            leaves_pending = moved is not None and moved.to_state != "pending"
            self._apply_row(
                conn, changes.scope, _CANDIDATES, changes.new_candidate, moved, drop=leaves_pending
            )
        if changes.new_record is not None or changes.record_transition is not None:
            self._fault("record")
            self._apply_row(
                conn,
                changes.scope,
                _RECORDS,
                changes.new_record,
                changes.record_transition,
                drop=changes.shred_record_body,
            )
        if changes.tombstone_payload_digest is not None and changes.record_transition is not None:
            self._fault("tombstone")
            self._insert_tombstone(
                conn,
                changes,
                changes.tombstone_payload_digest,
                changes.record_transition.target_id,
            )
        if changes.projection is not None:
            self._fault("projection")
            self._project(conn, changes.scope, changes.projection)
        if changes.approval_id is not None:
            self._fault("approval")
            self._spend_approval(conn, changes)
        if changes.outbox:
            self._fault("outbox")
            self._enqueue(conn, changes.outbox)

    def _check_head(self, conn: sqlite3.Connection, changes: ChangeSet) -> None:
        self._fault("head")
        if changes.expected_head is None:
            return  # no event: nothing to fence (a policy's hold)
        row = conn.execute(
            "SELECT cursor, event_hash FROM journal_heads WHERE tenant_id = ? AND workspace_id = ?",
            (changes.scope.tenant_id, changes.scope.workspace_id),
        ).fetchone()
        current = JournalHead(row[0], _digest_out(row[1])) if row else JournalHead(0, GENESIS_HASH)
        if current != changes.expected_head:
            raise CommitConflict("head")

    def _insert_ledger(self, conn: sqlite3.Connection, changes: ChangeSet) -> None:
        self._fault("ledger")
        entry = changes.ledger
        _insert_or_conflict(
            conn,
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *_scope_key(changes.scope),
                entry.principal,
                entry.idempotency_key,
                entry.tool,
                entry.target,
                _digest_in(entry.intent_hash),
                pack(entry.output),
                entry.cursor,
            ),
            "ledger",
        )

    @staticmethod
    def _append_event(conn: sqlite3.Connection, scope: Scope, event: JournalEvent) -> None:
        t, w = _scope_key(scope)
        conn.execute(
            "INSERT INTO journal_events VALUES (?, ?, ?, ?, ?)",
            (t, w, event.cursor, _digest_in(event.event_hash), pack(event.body)),
        )
        conn.execute(
            "INSERT INTO journal_heads VALUES (?, ?, ?, ?) ON CONFLICT (tenant_id, workspace_id) "
            "DO UPDATE SET cursor = excluded.cursor, event_hash = excluded.event_hash",
            (t, w, event.cursor, _digest_in(event.event_hash)),
        )

    @staticmethod
    def _apply_row(
        conn: sqlite3.Connection,
        scope: Scope,
        table: _RowTable,
        new: CandidateRow | RecordRow | None,
        move: StateTransition | None,
        *,
        drop: bool,
    ) -> None:
        t, w = _scope_key(scope)
        if new is not None:
            _insert_or_conflict(conn, table.insert, (t, w, *_stored(new, table.name)), table.taken)
        if move is not None:
            _update_one(
                conn, table.move, (move.to_state, drop, t, w, move.target_id, move.from_state)
            )

    @staticmethod
    def _hold_conditions(conn: sqlite3.Connection, changes: ChangeSet) -> None:
        """A policy's hold marks its pending candidate; a policy's decision (``unless_held``)
        is refused on a held one. Either way a candidate that moved is ``CommitConflict``."""
        t, w = _scope_key(changes.scope)
        moved, hold = changes.candidate_transition, changes.hold
        policy_decision = moved if changes.unless_held else None
        if (
            policy_decision is not None
            and conn.execute(_HELD, (t, w, policy_decision.target_id)).fetchone()
        ):
            raise CommitConflict("state")
        if hold is not None:
            _update_one(conn, _HOLD, (hold.decision_receipt_digest, t, w, hold.candidate_id))

    @staticmethod
    def _insert_tombstone(
        conn: sqlite3.Connection, changes: ChangeSet, payload_digest: str, record_id: str
    ) -> None:
        conn.execute(
            "INSERT OR IGNORE INTO tombstones VALUES (?, ?, ?, ?, ?)",
            (
                *_scope_key(changes.scope),
                _digest_in(payload_digest),
                record_id,
                changes.event.cursor if changes.event else 0,
            ),
        )

    @staticmethod
    def _spend_approval(conn: sqlite3.Connection, changes: ChangeSet) -> None:
        _insert_or_conflict(
            conn,
            "INSERT INTO used_approvals VALUES (?, ?, ?, ?)",
            (
                changes.approval_id,
                *_scope_key(changes.scope),
                changes.event.cursor if changes.event else 0,
            ),
            "approval",
        )

    @staticmethod
    def _enqueue(conn: sqlite3.Connection, items: Sequence[OutboxItem]) -> None:
        conn.executemany(
            "INSERT OR IGNORE INTO outbox VALUES (?, ?, ?, ?, ?, ?)",
            [(i.item_id, i.kind, *_scope_key(i.scope), i.target, i.surface) for i in items],
        )

    # -- the lexical projection (same database, same transaction) ------------------------------

    def _lexical_table(self, conn: sqlite3.Connection, scope: Scope, *, create: bool) -> str | None:
        row = conn.execute(
            "SELECT table_name FROM lexical_tables WHERE tenant_id = ? AND workspace_id = ?",
            (scope.tenant_id, scope.workspace_id),
        ).fetchone()
        if row is not None:
            return str(row[0])
        if not create:
            return None
        name = lexical_table_name(scope)
        columns = ", ".join(["record_id UNINDEXED", *_COLUMNS])
        conn.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {name} USING fts5({columns}, "
            "tokenize = 'unicode61 remove_diacritics 0')"
        )
        conn.execute(
            "INSERT INTO lexical_tables VALUES (?, ?, ?)",
            (scope.tenant_id, scope.workspace_id, name),
        )
        return name

    def _project(self, conn: sqlite3.Connection, scope: Scope, change: ProjectionChange) -> None:
        t, w = scope.tenant_id, scope.workspace_id
        if change.upsert is not None:
            doc = change.upsert
            table = self._lexical_table(conn, scope, create=True)
            self._unproject(conn, scope, doc.record_id)
            cursor = conn.execute(
                f"INSERT INTO {table} (record_id, {', '.join(_COLUMNS)}) "  # noqa: S608 - internal name
                f"VALUES (?, {', '.join('?' * len(_FIELDS))})",
                (doc.record_id, *(doc.fields.get(name, "") for name in _FIELDS)),
            )
            conn.execute(
                "UPDATE records SET lex_rowid = ? WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
                (cursor.lastrowid, t, w, doc.record_id),
            )
            if doc.vector is not None:
                vectors = self._vector_table(conn, scope, create=True)
                conn.execute(
                    f"INSERT INTO {vectors} VALUES (?, ?)",  # noqa: S608 - internal name
                    (doc.record_id, _pack(doc.vector)),
                )
                self._vectors_changed(conn, vector_table_name(scope))
        if change.delete_record_id is not None:
            self._unproject(conn, scope, change.delete_record_id)
            table = self._lexical_table(conn, scope, create=False)
            if table is not None:
                # FTS5 only marks a deleted row's terms as deleted in its index segments; merging
                # the scope's segments into one rewrites them without the row's terms, and
                # secure_delete zeroes the pages of the old segments.
                conn.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")  # noqa: S608

    def _vector_table(self, conn: sqlite3.Connection, scope: Scope, *, create: bool) -> str | None:
        name = vector_table_name(scope)
        if create:
            conn.execute(
                # A rowid table, like records: a 1.5 KB vector in a WITHOUT ROWID row is a b-tree
                # key and spills past ~1,000 bytes onto an overflow page of its own (4 KiB a
                # vector); a rowid row keeps it on the page. Tables made before stay as they
                # are (same columns, same statements); a restore rebuilds them in this layout.
                f"CREATE TABLE IF NOT EXISTS {name} "
                "(record_id TEXT NOT NULL UNIQUE, vector BLOB NOT NULL)"
            )
            return name
        row = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return name if row is not None else None

    def _unproject(self, conn: sqlite3.Connection, scope: Scope, record_id: str) -> None:
        vectors = self._vector_table(conn, scope, create=False)
        if vectors is not None:
            deleted = conn.execute(
                f"DELETE FROM {vectors} WHERE record_id = ?",  # noqa: S608
                (record_id,),
            ).rowcount
            if deleted:
                self._vectors_changed(conn, vectors)
        row = conn.execute(
            "SELECT lex_rowid FROM records WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
            (scope.tenant_id, scope.workspace_id, record_id),
        ).fetchone()
        if row is None or row[0] is None:
            return
        table = self._lexical_table(conn, scope, create=False)
        if table is not None:
            conn.execute(f"DELETE FROM {table} WHERE rowid = ?", (row[0],))  # noqa: S608
        conn.execute(
            "UPDATE records SET lex_rowid = NULL WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
            (scope.tenant_id, scope.workspace_id, record_id),
        )

    def lexical_search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        if not terms:
            return []
        if depth <= 0:
            return []
        with self._guard(), self._pool.connection() as conn:
            table = self._lexical_table(conn, scope, create=False)
            if table is None:
                return []
            conn.execute("BEGIN")  # every query reads one snapshot
            try:
                return self._top_by_score(conn, table, terms, depth)
            finally:
                conn.execute("COMMIT")

    @staticmethod
    def _top_by_score(
        conn: sqlite3.Connection, table: str, terms: Sequence[str], depth: int
    ) -> list[IndexHit]:
        """The ``depth`` best matches by score, ties by ``record_id``: exactly what ``ORDER BY
        score DESC, record_id ASC LIMIT depth`` returns, without reading every match's
        ``record_id`` (half the query's time at 10k records) nor, on a large store, scoring every
        match (``lexical_topk``).

        The matches are ranked by score alone, ``_TIE_SLACK`` past the depth; when the last one
        scores below the depth-th, every match tied with the depth-th is among them, so ordering
        just these by ``(score, record_id)`` is exact. Otherwise (a tie wider than the slack) the
        plain query runs.
        """
        scored = lexical_topk.ranked(conn, table, _BM25_ARGS, terms, depth, depth + _TIE_SLACK)
        if len(scored) == depth + _TIE_SLACK and scored[-1][1] >= scored[depth - 1][1]:
            match = lexical_topk.or_match(terms)
            rows = conn.execute(
                f"SELECT record_id, -bm25({table}, {_BM25_ARGS}) AS score FROM {table} "  # noqa: S608
                f"WHERE {table} MATCH ? ORDER BY score DESC, record_id ASC LIMIT ?",
                (match, depth),
            ).fetchall()
            return [IndexHit(str(record_id), float(score)) for record_id, score in rows]
        # One statement text whatever the count (a text per count would fill each connection's
        # statement cache with one-off statements: tests/integration/test_store_statement_cache).
        ids: dict[int, str] = dict(
            conn.execute(
                f"SELECT rowid, record_id FROM {table} "  # noqa: S608 - the table name is ours
                "WHERE rowid IN (SELECT value FROM json_each(?))",
                (json.dumps([rowid for rowid, _ in scored]),),
            ).fetchall()
        )
        hits = [IndexHit(str(ids[rowid]), float(score)) for rowid, score in scored]
        hits.sort(key=lambda hit: (-hit.score, hit.record_id))
        return hits[:depth]

    def vector_nearest(self, scope: Scope, vector: Sequence[float], depth: int) -> list[IndexHit]:
        if depth <= 0:
            return []
        found = self._with_matrix(
            scope,
            lambda table, generation, load: self._matrices.nearest(
                table, generation, load, vector, depth
            ),
        )
        return found or []

    def vector_similarities(
        self, scope: Scope, vector: Sequence[float], record_ids: Sequence[str]
    ) -> dict[str, float]:
        if not record_ids:
            return {}
        found = self._with_matrix(
            scope,
            lambda table, generation, load: self._matrices.similarities(
                table, generation, load, vector, record_ids
            ),
        )
        return found or {}

    def vector_score_at(self, scope: Scope, vector: Sequence[float], rank: int) -> float | None:
        return self._with_matrix(
            scope,
            lambda table, generation, load: self._matrices.score_at(
                table, generation, load, vector, rank
            ),
        )

    def _with_matrix(
        self,
        scope: Scope,
        use: Callable[[str, int, Callable[[], list[tuple[str, bytes]]]], T],
    ) -> T | None:
        """``use(table, generation, load)`` on the scope's vector table in one read snapshot
        (the generation and the rows it counts); None when the scope has no vector table."""
        with self._guard(), self._pool.connection() as conn:
            table = self._vector_table(conn, scope, create=False)
            if table is None:
                return None

            def load() -> list[tuple[str, bytes]]:
                rows = conn.execute(f"SELECT record_id, vector FROM {table}").fetchall()  # noqa: S608
                return [(str(record_id), _as_bytes(blob)) for record_id, blob in rows]

            conn.execute("BEGIN")
            try:
                row = conn.execute(
                    "SELECT generation FROM vector_generations WHERE table_name = ?", (table,)
                ).fetchone()
                return use(table, row[0] if row else 0, load)
            finally:
                conn.execute("COMMIT")

    @staticmethod
    def _vectors_changed(conn: sqlite3.Connection, table: str) -> None:
        conn.execute(
            "INSERT INTO vector_generations VALUES (?, 1) ON CONFLICT (table_name) "
            "DO UPDATE SET generation = generation + 1",
            (table,),
        )

    def vector_contains(self, scope: Scope, record_id: str) -> bool:
        return self._projected(self._vector_table, scope, record_id)

    def lexical_apply(self, scope: Scope, change: ProjectionChange) -> None:
        with self._guard(), self._pool.connection() as conn:
            with immediate(conn):
                self._project(conn, scope, change)
            if _drops_projection(change):
                self._scrub_wal(conn)

    def _scrub_wal(self, conn: sqlite3.Connection) -> None:
        """Copy the WAL into the database and truncate it to zero bytes.

        The WAL keeps earlier images of every page a transaction wrote, so a forgotten record's
        body and index terms would stay readable in ``engram.db-wal`` until later writes recycle
        it. Called after a commit that shredded something: ``secure_delete`` has already zeroed
        the freed cells and pages in the new images; the checkpoint writes those over the old
        ones in the database file, and the truncation drops the old images. It waits (busy
        timeout) for readers still on an older snapshot; when it cannot finish it is logged and
        the next shredding commit or ``close`` finishes it.
        """
        try:
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            busy = 1
        if busy:
            log.warning("could not truncate the WAL after a shredding commit; retried later")

    def lexical_contains(self, scope: Scope, record_id: str) -> bool:
        return self._projected(self._lexical_table, scope, record_id)

    def _projected(self, find: _TableFinder, scope: Scope, record_id: str) -> bool:
        """Whether the scope's projection table ``find`` names holds a row for ``record_id``."""
        with self._guard(), self._pool.connection() as conn:
            table = find(conn, scope, create=False)
            if table is None:
                return False
            row = conn.execute(
                f"SELECT 1 FROM {table} WHERE record_id = ? LIMIT 1",  # noqa: S608
                (record_id,),
            ).fetchone()
        return row is not None

    # -- keeping projections current across analyzer and embedder changes -----------------------

    def refresh_projections(
        self,
        lexical_version: str,
        fields_of: Callable[[Scope, str, bytes], Mapping[str, str] | None],
        vector_of: Callable[[Scope, str, bytes], tuple[float, ...] | None] | None = None,
        *,
        vector_model: str | None = None,
        legacy_vector_model: str | None = None,
    ) -> int:
        """Re-project the records whose projection is stale; return how many were re-projected.

        Every projected record when the lexical analyzer's version differs from the one this
        database was indexed with (a database from before versions were recorded counts as
        stale); with ``vector_of`` (a semantic host), every projected record without a vector,
        and every projected record when ``vector_model`` (the embedder's ``model_id``) differs
        from the model the stored vectors were made by (``legacy_vector_model`` for a database
        from before that was recorded): vectors of two models never meet in one search.
        A record's vector is kept when only its lexical fields are rebuilt. Each record is
        re-projected in its own transaction, from the record body in the canonical store (the
        callbacks open it; ``fields_of`` answers None for a body that can no longer be opened,
        whose projection is then dropped).
        """
        projected, stale_lexical, stale_vectors = self._staleness(
            lexical_version, vector_model if vector_of is not None else None, legacy_vector_model
        )
        done = 0
        for tenant_id, workspace_id, record_id, raw in projected:
            if not stale_lexical and vector_of is None:
                break
            scope, body = Scope(tenant_id, workspace_id), _as_bytes(raw)
            vector = None if stale_vectors else self.vector_get(scope, record_id)
            if vector is None and vector_of is not None:
                vector = vector_of(scope, record_id, body)
            elif not stale_lexical:
                continue
            fields = fields_of(scope, record_id, body)
            if fields is None:
                self.lexical_apply(scope, ProjectionChange(delete_record_id=record_id))
                continue
            doc = ProjectionDoc(record_id, fields, vector)
            self.lexical_apply(scope, ProjectionChange(upsert=doc))
            done += 1
        self.meta_set("lexical_version", lexical_version)
        if vector_of is not None and vector_model is not None:
            self.meta_set("vector_model", vector_model)
        return done

    def _staleness(
        self, lexical_version: str, vector_model: str | None, legacy_vector_model: str | None
    ) -> tuple[list[tuple[Any, ...]], bool, bool]:
        """The projected records, whether their lexical fields are stale, and whether their
        vectors are (``vector_model`` None: the host has no semantic channel)."""
        with self._guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT value FROM store_meta WHERE key = 'lexical_version'"
            ).fetchone()
            projected = conn.execute(
                "SELECT tenant_id, workspace_id, record_id, body FROM records "
                "WHERE lex_rowid IS NOT NULL AND body IS NOT NULL ORDER BY tenant_id, "
                "workspace_id, record_id"
            ).fetchall()
            model_row = conn.execute(
                "SELECT value FROM store_meta WHERE key = 'vector_model'"
            ).fetchone()
        stale_lexical = (row is None and bool(projected)) or (
            row is not None and row[0] != lexical_version
        )
        vectors_by = legacy_vector_model if model_row is None else model_row[0]
        stale_vectors = vector_model is not None and vectors_by != vector_model
        return projected, stale_lexical, stale_vectors

    def seal_plaintext_bodies(self, seal: Callable[[Scope, str, bytes], bytes]) -> int:
        """Seal the record bodies a database from before sealed bodies holds in plaintext (the
        migration, run when the data directory is opened); return how many.

        Each body is replaced in place (``secure_delete`` zeroes the old cells) and the WAL is
        scrubbed afterwards, so the plaintext is gone from ``engram.db`` and its -wal. The lexical
        projection keeps its terms (it is derived, live data, never backed up); backups taken
        before the migration still hold the plaintext and should be replaced by a new one.
        """
        with self._guard(), self._pool.connection() as conn:
            legacy = conn.execute(
                "SELECT tenant_id, workspace_id, record_id, body FROM records "
                "WHERE body IS NOT NULL AND substr(body, 1, 4) != ?",
                (BODY_FORMAT,),
            ).fetchall()
            if not legacy:
                return 0
            sealed = [
                (seal(Scope(t, w), record_id, _as_bytes(body)), t, w, record_id)
                for t, w, record_id, body in legacy
            ]
            with immediate(conn):
                conn.executemany(
                    "UPDATE records SET body = ? WHERE tenant_id = ? AND workspace_id = ? "
                    "AND record_id = ?",
                    sealed,
                )
            self._scrub_wal(conn)
        log.info("sealed the plaintext bodies of a database from before sealed bodies")
        return len(sealed)

    def vector_get(self, scope: Scope, record_id: str) -> tuple[float, ...] | None:
        with self._guard(), self._pool.connection() as conn:
            table = self._vector_table(conn, scope, create=False)
            row = (
                conn.execute(
                    f"SELECT vector FROM {table} WHERE record_id = ?",  # noqa: S608
                    (record_id,),
                ).fetchone()
                if table is not None
                else None
            )
        return None if row is None else tuple(_unpack(_as_bytes(row[0])))

    # -- inspection for operators and tests ------------------------------------------------------

    def table_snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table (including the FTS5 projections), for fault-injection tests."""
        snapshot: dict[str, list[tuple[Any, ...]]] = {}
        with self._guard(), self._pool.connection() as conn:
            names = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table') AND name NOT LIKE 'sqlite_%' "
                    "AND name NOT LIKE '%_data' AND name NOT LIKE '%_idx' AND name NOT LIKE '%_docsize' "
                    "AND name NOT LIKE '%_config' AND name NOT LIKE '%_content' ORDER BY name"
                )
            ]
            for name in names:
                snapshot[name] = sorted(
                    conn.execute(f"SELECT * FROM {name}").fetchall(),  # noqa: S608
                    key=repr,
                )
        return snapshot


class _StoreSurface:
    """A projection surface inside the store: applied in the store's own commit."""

    name: str
    maintained_by_store: Final = True

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def _asked(self, ask: Callable[[], T]) -> T:
        """The store's answer; the store being unavailable is this index being unavailable."""
        try:
            return ask()
        except StoreUnavailable as exc:
            raise IndexUnavailable(f"{self.name} index unavailable") from exc

    def apply(self, scope: Scope, change: ProjectionChange) -> None:
        self._asked(lambda: self._store.lexical_apply(scope, change))


class SqliteLexicalIndex(_StoreSurface):
    """The ``LexicalIndex`` port over the store's per-scope FTS5 tables."""

    name: Final = "lexical"
    scoring_formula_ref: Final = lexical.SCORING_FORMULA_REF  # FTS5 bm25() with column weights

    def search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        return self._asked(lambda: self._store.lexical_search(scope, terms, depth))

    def contains(self, scope: Scope, record_id: str) -> bool:
        return self._store.lexical_contains(scope, record_id)


class SqliteVectorIndex(_StoreSurface):
    """The ``VectorIndex`` port over the store's per-scope vector tables (exact cosine scan)."""

    name: Final = "semantic"
    scoring_formula_ref: Final = "cosine:exact-scan,float32"
    vector_formula_ref: Final = scoring_formula_ref

    def nearest(self, scope: Scope, vector: Sequence[float], depth: int) -> list[IndexHit]:
        return self._asked(lambda: self._store.vector_nearest(scope, vector, depth))

    def score_at(self, scope: Scope, vector: Sequence[float], rank: int) -> float | None:
        return self._asked(lambda: self._store.vector_score_at(scope, vector, rank))

    def similarities(
        self, scope: Scope, vector: Sequence[float], record_ids: Sequence[str]
    ) -> dict[str, float]:
        return self._asked(lambda: self._store.vector_similarities(scope, vector, record_ids))

    def contains(self, scope: Scope, record_id: str) -> bool:
        return self._store.vector_contains(scope, record_id)

    def has_vector(self, scope: Scope, record_id: str) -> bool:
        return self._store.vector_contains(scope, record_id)


CommitStep = Literal[
    "begin",
    "head",
    "ledger",
    "event",
    "candidate",
    "record",
    "tombstone",
    "projection",
    "approval",
    "outbox",
    "commit",
    "after_commit",
]

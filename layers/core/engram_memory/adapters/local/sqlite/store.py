"""The ``Store`` port on SQLite: the canonical reads and the operators' plane, composing the
pool (``connections``), the tables (``schema``), the commit (``commit``), the projections
(``projections``, ``fulltext``, ``vectors``) and the backup (``backup``)."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

from engram_memory.adapters.local import wal_space
from engram_memory.adapters.local.sqlite import (
    backup,
    fulltext,
    near_bands,
    projections,
    schema,
    vectors,
)
from engram_memory.adapters.local.sqlite.commit import FaultHook, commit_changes
from engram_memory.adapters.local.sqlite.connections import (
    DEFAULT_POOL_SIZE,
    ConnectionPool,
    connect,
    guard,
    scrub_wal,
)
from engram_memory.adapters.local.sqlite.rows import (
    CANDIDATE_BY_ID,
    CANDIDATES_PAGE,
    RECORD_BY_ID,
    RECORD_COLUMNS,
    RECORDS_PAGE,
    as_bytes,
    candidate_row,
    digest_in,
    digest_out,
    record_row,
    scope_key,
    unpacked,
)
from engram_memory.adapters.local.sqlite.vector_matrix import VectorMatrices
from engram_memory.adapters.local.transactions import immediate
from engram_memory.contract.canonical import GENESIS_HASH
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    CandidateRow,
    ChangeSet,
    IndexHit,
    JournalEvent,
    JournalHead,
    LedgerEntry,
    OutboxItem,
    ProjectionChange,
    ProjectionDoc,
    RecordRow,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

_LEDGER_AT: Final = (
    "SELECT principal, idempotency_key, tool, target, intent_hash, output, cursor FROM ledger"
    " WHERE tenant_id = ? AND workspace_id = ? AND cursor IN"
)


class SqliteStore:
    """The ``Store`` port on SQLite. Thread-safe: each operation checks a connection out of a
    bounded pool (``pool_size``) and returns it; writers are serialized by ``BEGIN IMMEDIATE``.

    ``fault_hook`` is a test seam: it is called with the name of each step of a commit
    (``commit.CommitStep``) and may raise ``sqlite3.Error`` to inject a failure there.
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
        self._pool = ConnectionPool(
            partial(connect, self._path, busy_timeout_ms), pool_size, busy_timeout_ms / 1000
        )
        self._matrices = VectorMatrices()
        with guard(), self._pool.connection() as conn:
            schema.create_or_migrate(conn)
            # The -wal an open starts from (empty) is overwritten from here on, not grown.
            wal_space.reserve(conn)

    # -- connections ---------------------------------------------------------------------------

    def close(self) -> None:
        """Checkpoint and truncate the WAL, then close every pooled connection.

        The store stays usable: later calls open new connections.
        """
        try:
            with self._pool.connection() as conn:
                scrub_wal(conn, reserve_room=False)
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
        with guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT cursor, event_hash FROM journal_heads WHERE tenant_id = ? AND workspace_id = ?",
                (scope.tenant_id, scope.workspace_id),
            ).fetchone()
        return JournalHead(row[0], digest_out(row[1])) if row else JournalHead(0, GENESIS_HASH)

    def ledger_get(self, scope: Scope, principal: str, idempotency_key: str) -> LedgerEntry | None:
        rows = self._fetch(
            "SELECT principal, idempotency_key, tool, target, intent_hash, output, cursor FROM ledger "
            "WHERE tenant_id = ? AND workspace_id = ? AND principal = ? AND idempotency_key = ?",
            (*scope_key(scope), principal, idempotency_key),
        )
        if not rows:
            return None
        principal, key, tool, target, intent_hash, output, cursor = rows[0]
        return LedgerEntry(
            principal, key, tool, target, digest_out(intent_hash), unpacked(output), cursor
        )

    def ledger_at(self, scope: Scope, cursors: Sequence[int]) -> dict[int, LedgerEntry]:
        """The ledger entries committed with these journal cursors (``ports.LedgerByCursor``)."""
        wanted = sorted(set(cursors))
        if not wanted:
            return {}
        marks = ", ".join("?" * len(wanted))
        query = f"{_LEDGER_AT} ({marks})"
        rows = self._fetch(query, (*scope_key(scope), *wanted))
        return {
            cursor: LedgerEntry(
                principal, key, tool, target, digest_out(intent_hash), unpacked(output), cursor
            )
            for principal, key, tool, target, intent_hash, output, cursor in rows
        }

    def candidate_get(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        rows = self._fetch(CANDIDATE_BY_ID, (*scope_key(scope), candidate_id))
        return candidate_row(rows[0]) if rows else None

    def record_get(self, scope: Scope, record_id: str) -> RecordRow | None:
        rows = self._fetch(RECORD_BY_ID, (*scope_key(scope), record_id))
        return record_row(rows[0]) if rows else None

    def _fetch(self, sql: str, parameters: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with guard(), self._pool.connection() as conn:
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
        with guard(), self._pool.connection() as conn:
            # One SQL text whatever the number of ids (a JSON array in one parameter): an IN list
            # of n placeholders is another statement for every n, and each pooled connection's
            # statement cache kept up to 128 of those large one-off statements, so the server's
            # memory grew with the sizes of the result sets it had seen (the soak's RSS growth).
            rows = conn.execute(
                f"SELECT {RECORD_COLUMNS} FROM records "  # noqa: S608 - constant column list
                "WHERE tenant_id = ? AND workspace_id = ? "
                "AND record_id IN (SELECT value FROM json_each(?))",
                (scope.tenant_id, scope.workspace_id, json.dumps(ids)),
            ).fetchall()
        for row in rows:
            found[row[0]] = record_row(row)
        return found

    def payload_tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        with guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM tombstones WHERE tenant_id = ? AND workspace_id = ? AND payload_digest = ? LIMIT 1",
                (scope.tenant_id, scope.workspace_id, digest_in(payload_digest)),
            ).fetchone()
        return row is not None

    def events(self, scope: Scope, after_cursor: int, limit: int) -> list[JournalEvent]:
        rows = self._fetch(
            "SELECT cursor, event_hash, body FROM journal_events "
            "WHERE tenant_id = ? AND workspace_id = ? AND cursor > ? ORDER BY cursor LIMIT ?",
            (*scope_key(scope), after_cursor, limit),
        )
        return [
            JournalEvent(cursor, digest_out(event_hash), unpacked(body))
            for cursor, event_hash, body in rows
        ]

    def spend_approval(self, scope: Scope, approval_id: str) -> bool:
        # cursor 0: no journal event spent it (a commit records its event's cursor)
        with guard(), self._pool.connection() as conn:
            inserted = conn.execute(
                "INSERT OR IGNORE INTO used_approvals VALUES (?, ?, ?, 0)",
                (approval_id, *scope_key(scope)),
            ).rowcount
        return inserted == 1

    def claim_nonce(self, scope: Scope, nonce: str, expires_at_ms: int) -> bool:
        with guard(), self._pool.connection() as conn:
            inserted = conn.execute(
                "INSERT OR IGNORE INTO used_nonces VALUES (?, ?, ?, ?)",
                (nonce, scope.tenant_id, scope.workspace_id, expires_at_ms),
            ).rowcount
        return inserted == 1

    def outbox_pending(self, limit: int) -> list[OutboxItem]:
        with guard(), self._pool.connection() as conn:
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
        with guard(), self._pool.connection() as conn:
            rows = conn.execute(
                query, (scope.tenant_id, scope.workspace_id, kind, kind, limit)
            ).fetchall()
        return [
            OutboxItem(i, k, Scope(t, w), target, surface) for i, k, t, w, target, surface in rows
        ]

    def outbox_done(self, item: OutboxItem) -> None:
        self.outbox_done_all((item,))

    def outbox_done_all(self, items: Sequence[OutboxItem]) -> None:
        if not items:
            return
        with guard(), self._pool.connection() as conn:
            # Not synced on its own: the next synced commit (the WAL is one file, synced whole)
            # makes it durable. A power cut before that only leaves the items to be done again,
            # and every outbox item is idempotent; the fsync it saved was one in four per write.
            conn.execute("PRAGMA synchronous = NORMAL")
            try:
                if len(items) == 1:
                    conn.execute("DELETE FROM outbox WHERE item_id = ?", (items[0].item_id,))
                else:  # one transaction: the WAL takes each page once, not once an item
                    with immediate(conn):
                        conn.executemany(
                            "DELETE FROM outbox WHERE item_id = ?", [(i.item_id,) for i in items]
                        )
            finally:
                conn.execute("PRAGMA synchronous = FULL")

    def outbox_holds(self, item: OutboxItem) -> bool:
        # The primary key: ``outbox_has`` reads every row of the scope's kind to match a target.
        with guard(), self._pool.connection() as conn:
            row = conn.execute("SELECT 1 FROM outbox WHERE item_id = ?", (item.item_id,)).fetchone()
        return row is not None

    def outbox_has(self, scope: Scope, kind: str, target: str) -> bool:
        with guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM outbox WHERE tenant_id = ? AND workspace_id = ? AND kind = ? AND target = ? LIMIT 1",
                (scope.tenant_id, scope.workspace_id, kind, target),
            ).fetchone()
        return row is not None

    # -- the operations plane (operators only) ---------------------------------------------------

    def scopes(self) -> list[Scope]:
        with guard(), self._pool.connection() as conn:
            rows = conn.execute(
                "SELECT tenant_id, workspace_id FROM journal_heads ORDER BY tenant_id, workspace_id"
            ).fetchall()
        return [Scope(tenant_id, workspace_id) for tenant_id, workspace_id in rows]

    def candidates_list(
        self, scope: Scope, state: str | None, after: str, limit: int
    ) -> list[CandidateRow]:
        listed = self._fetch(CANDIDATES_PAGE, (*scope_key(scope), state, state, after, limit))
        return [candidate_row(row) for row in listed]

    def records_list(
        self, scope: Scope, state: str | None, after: str, limit: int
    ) -> list[RecordRow]:
        listed = self._fetch(RECORDS_PAGE, (*scope_key(scope), state, state, after, limit))
        return [record_row(row) for row in listed]

    def state_counts(self, scope: Scope) -> dict[str, int]:
        where = "WHERE tenant_id = ? AND workspace_id = ?"
        counts: dict[str, int] = {}
        with guard(), self._pool.connection() as conn:
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

    def revoke_credentials(self, tenant_id: str, kind: str, value: str, at_ms: int) -> int:
        with guard(), self._pool.connection() as conn:
            row = conn.execute(
                "INSERT INTO revocations VALUES (?, ?, ?, ?) ON CONFLICT (tenant_id, kind, value) "
                "DO UPDATE SET revoked_at_ms = CASE WHEN kind = 'principal' "
                "THEN MAX(revoked_at_ms, excluded.revoked_at_ms) ELSE revoked_at_ms END "
                "RETURNING revoked_at_ms",
                (tenant_id, kind, value, at_ms),
            ).fetchone()
        return int(row[0])

    def credential_revoked(
        self, tenant_id: str, token_id: str | None, principal: str, issued_at_ms: int
    ) -> bool:
        with guard(), self._pool.connection() as conn:
            row = conn.execute(
                "SELECT 1 FROM revocations WHERE tenant_id = ? AND ("
                "(kind = 'token' AND value = ?) OR "
                "(kind = 'principal' AND value = ? AND revoked_at_ms >= ?)) LIMIT 1",
                (tenant_id, token_id, principal, issued_at_ms),
            ).fetchone()
        return row is not None

    def meta_get(self, key: str) -> str | None:
        """A value of the store's own bookkeeping (``store_meta``), or None."""
        with guard(), self._pool.connection() as conn:
            row = conn.execute("SELECT value FROM store_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def meta_set(self, key: str, value: str) -> None:
        with guard(), self._pool.connection() as conn:
            conn.execute(
                "INSERT INTO store_meta VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def backup_to(self, target: Path) -> None:
        """A copy of the canonical store without its projections (``backup.backup_to``)."""
        backup.backup_to(self._pool, target)

    # -- the commit ----------------------------------------------------------------------------

    def commit(self, changes: ChangeSet) -> None:
        commit_changes(self._pool, changes, self._fault)

    # -- the projections (same database, same transaction) -------------------------------------

    def lexical_apply(self, scope: Scope, change: ProjectionChange) -> None:
        with guard(), self._pool.connection() as conn:
            with immediate(conn):
                projections.project(conn, scope, change)
            if projections.drops_projection(change):
                scrub_wal(conn)

    def lexical_search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        if not terms:
            return []
        if depth <= 0:
            return []
        with guard(), self._pool.connection() as conn:
            return fulltext.search(conn, scope, terms, depth)

    def near_duplicates(self, scope: Scope, text: str, depth: int) -> list[IndexHit]:
        if depth <= 0:
            return []
        with guard(), self._pool.connection() as conn:
            table = fulltext.lexical_table(conn, scope, create=False)
            if table is None:
                return []
            found = near_bands.alike(conn, scope, table, text, depth)
        return [IndexHit(record_id, share) for record_id, share in found]

    def lexical_contains(self, scope: Scope, record_id: str) -> bool:
        with guard(), self._pool.connection() as conn:
            return projections.projected(conn, fulltext.lexical_table, scope, record_id)

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
        with guard(), self._pool.connection() as conn:
            return vectors.with_matrix(conn, scope, use)

    def vector_contains(self, scope: Scope, record_id: str) -> bool:
        with guard(), self._pool.connection() as conn:
            return projections.projected(conn, vectors.vector_table, scope, record_id)

    def vector_get(self, scope: Scope, record_id: str) -> tuple[float, ...] | None:
        with guard(), self._pool.connection() as conn:
            return vectors.get(conn, scope, record_id)

    # -- keeping projections current across analyzer and embedder changes -----------------------

    def refresh_projections(
        self,
        lexical_version: str,
        lexical_of: Callable[[Scope, str, bytes], tuple[Mapping[str, str], str] | None],
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
        callbacks open it; ``lexical_of``, the record's lexical fields and its text for the
        near-duplicate sketch, answers None for a body that can no longer be opened,
        whose projection is then dropped).
        """
        with guard(), self._pool.connection() as conn:
            projected, stale_lexical, stale_vectors = projections.staleness(
                conn,
                lexical_version,
                vector_model if vector_of is not None else None,
                legacy_vector_model,
            )
        done = 0
        for tenant_id, workspace_id, record_id, raw in projected:
            if not stale_lexical and vector_of is None:
                break
            scope, body = Scope(tenant_id, workspace_id), as_bytes(raw)
            vector = None if stale_vectors else self.vector_get(scope, record_id)
            if vector is None and vector_of is not None:
                vector = vector_of(scope, record_id, body)
            elif not stale_lexical:
                continue
            lexical = lexical_of(scope, record_id, body)
            if lexical is None:
                self.lexical_apply(scope, ProjectionChange(delete_record_id=record_id))
                continue
            fields, text = lexical
            doc = ProjectionDoc(record_id, fields, vector, text)
            self.lexical_apply(scope, ProjectionChange(upsert=doc))
            done += 1
        self.meta_set("lexical_version", lexical_version)
        self.meta_set("near_bands", near_bands.VERSION)
        if vector_of is not None and vector_model is not None:
            self.meta_set("vector_model", vector_model)
        return done

    def seal_plaintext_bodies(self, seal: Callable[[Scope, str, bytes], bytes]) -> int:
        """``schema.seal_plaintext_bodies``: the migration of a database from before sealed
        bodies, run when the data directory is opened."""
        with guard(), self._pool.connection() as conn:
            return schema.seal_plaintext_bodies(conn, seal)

    # -- inspection for operators and tests ------------------------------------------------------

    def table_snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table (including the FTS5 projections), for fault-injection tests."""
        snapshot: dict[str, list[tuple[Any, ...]]] = {}
        with guard(), self._pool.connection() as conn:
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

"""The embedded ``RecordKeys``: per-record keys in the key file, beside the candidate keys.

Two tables of the key file (``keys/candidate-keys.db``, never backed up) hold them:
``scope_keys`` (each scope's key, wrapped under the master key) and ``record_keys`` (each
record's key, wrapped under its scope's key). A scope key is unwrapped once per process and
cached (``ScopeKeys``); opening a body is one read of the key file and two AES-GCM operations.

Writes follow the key file's discipline (WAL, ``synchronous=FULL``, ``secure_delete``): a key
made at capture (``prepare``) is not written on its own but in the same commit as the
candidate's key (``LocalVault.seal`` calls ``write_prepared``), so a capture-and-admission pair
costs no extra fsync; ``destroy`` deletes and checkpoints so the deletion is durable and the
key's bytes are gone from the file and its -wal when it returns (``key_durability.py``).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from collections.abc import Callable, Mapping
from typing import Final, Protocol, TypeVar

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.adapters.local.key_durability import delete_and_scrub
from engram_memory.adapters.record_sealing import (
    KEY_BYTES,
    ScopeKeys,
    unwrap_scope_key,
    wrap_scope_key,
)
from engram_memory.engine.context import Scope

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS scope_keys (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, wrapped BLOB NOT NULL,
    PRIMARY KEY (tenant_id, workspace_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS record_keys (
    tenant_id TEXT NOT NULL, workspace_id TEXT NOT NULL, record_id TEXT NOT NULL,
    wrapped BLOB NOT NULL,
    PRIMARY KEY (tenant_id, workspace_id, record_id)) WITHOUT ROWID;
"""

_T = TypeVar("_T")


class Runner(Protocol):
    """The vault's serialized access to the key file (``LocalVault._run``)."""

    def __call__(self, action: str, operation: Callable[[sqlite3.Connection], _T]) -> _T: ...


class LocalRecordKeys:
    """``RecordKeys`` over the vault's key file (``run`` is the vault's serialized access to it;
    ``master_key`` wraps the scope keys)."""

    def __init__(self, run: Runner, master_key: bytes) -> None:
        self._run = run
        self._master = AESGCM(master_key)
        self._scope_keys = ScopeKeys(self._load_scope_key)
        self._prepared: dict[tuple[Scope, str], bytes] = {}
        self._prepared_lock = threading.Lock()

    # -- RecordKeys ----------------------------------------------------------------------------

    def prepare(self, scope: Scope, record_id: str) -> None:
        _, wrapped = self._scope_keys.new_record_key(scope, record_id)
        with self._prepared_lock:
            self._prepared[(scope, record_id)] = wrapped

    def seal(self, scope: Scope, record_id: str, plaintext: bytes) -> bytes:
        wrapped = self._stored(scope, [record_id]).get(record_id)
        if wrapped is None:
            with self._prepared_lock:
                wrapped = self._prepared.get((scope, record_id))
            if wrapped is None:
                _, wrapped = self._scope_keys.new_record_key(scope, record_id)
            self._write(scope, record_id, wrapped)
            # Another process may have written the record's key first: seal under the stored one.
            wrapped = self._stored(scope, [record_id])[record_id]
        return self._scope_keys.seal_body(scope, record_id, wrapped, plaintext)

    def open_many(self, scope: Scope, sealed: Mapping[str, bytes]) -> dict[str, bytes]:
        return self._scope_keys.open_bodies(scope, self._stored(scope, list(sealed)), sealed)

    def destroy(self, scope: Scope, record_id: str) -> None:
        with self._prepared_lock:
            self._prepared.pop((scope, record_id), None)

        self._run(
            "destroy record key",
            lambda conn: delete_and_scrub(
                conn,
                "DELETE FROM record_keys WHERE tenant_id = ? AND workspace_id = ? AND record_id = ?",
                (scope.tenant_id, scope.workspace_id, record_id),
            ),
        )

    def key_exists(self, scope: Scope, record_id: str) -> bool:
        return record_id in self._stored(scope, [record_id])

    # -- the vault's side ----------------------------------------------------------------------

    def write_prepared(self, conn: sqlite3.Connection) -> None:
        """Write the keys ``prepare`` made, inside the caller's transaction of the key file."""
        with self._prepared_lock:
            prepared, self._prepared = self._prepared, {}
        conn.executemany(
            "INSERT OR IGNORE INTO record_keys VALUES (?, ?, ?, ?)",
            [
                (scope.tenant_id, scope.workspace_id, record_id, wrapped)
                for (scope, record_id), wrapped in prepared.items()
            ],
        )

    def rewrap_scope_keys(self, conn: sqlite3.Connection, new_master: AESGCM) -> int:
        """Re-wrap every scope key under ``new_master`` in the caller's transaction (a master
        key rotation); the record keys under them are untouched. Returns how many."""
        rows = conn.execute("SELECT tenant_id, workspace_id, wrapped FROM scope_keys").fetchall()
        for tenant_id, workspace_id, wrapped in rows:
            scope = Scope(tenant_id, workspace_id)
            scope_key = unwrap_scope_key(self._master, scope, bytes(wrapped))
            conn.execute(
                "UPDATE scope_keys SET wrapped = ? WHERE tenant_id = ? AND workspace_id = ?",
                (wrap_scope_key(new_master, scope, scope_key), tenant_id, workspace_id),
            )
        return len(rows)

    # -- internals -----------------------------------------------------------------------------

    def _stored(self, scope: Scope, record_ids: list[str]) -> dict[str, bytes]:
        rows = self._run(
            "read record keys",
            lambda conn: conn.execute(
                "SELECT record_id, wrapped FROM record_keys WHERE tenant_id = ? "
                "AND workspace_id = ? AND record_id IN (SELECT value FROM json_each(?))",
                (scope.tenant_id, scope.workspace_id, json.dumps(record_ids)),
            ).fetchall(),
        )
        return {str(record_id): bytes(wrapped) for record_id, wrapped in rows}

    def _write(self, scope: Scope, record_id: str, wrapped: bytes) -> None:
        self._run(
            "write record key",
            lambda conn: conn.execute(
                "INSERT OR IGNORE INTO record_keys VALUES (?, ?, ?, ?)",
                (scope.tenant_id, scope.workspace_id, record_id, wrapped),
            ),
        )

    def _load_scope_key(self, scope: Scope) -> bytes:
        fresh = wrap_scope_key(self._master, scope, secrets.token_bytes(KEY_BYTES))

        def made_or_stored(conn: sqlite3.Connection) -> bytes:
            conn.execute(
                "INSERT OR IGNORE INTO scope_keys VALUES (?, ?, ?)",
                (scope.tenant_id, scope.workspace_id, fresh),
            )
            (wrapped,) = conn.execute(
                "SELECT wrapped FROM scope_keys WHERE tenant_id = ? AND workspace_id = ?",
                (scope.tenant_id, scope.workspace_id),
            ).fetchone()
            return bytes(wrapped)

        return unwrap_scope_key(self._master, scope, self._run("scope key", made_or_stored))

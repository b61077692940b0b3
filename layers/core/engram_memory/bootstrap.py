"""The composition root of the embedded default: everything wired from a data directory.

Layout of the data directory (owner-only permissions):

- ``engram.db``                 canonical store (journal, ledger, candidates, records, FTS5)
- ``audit.log``                 one JSON line per call: ids, outcome codes, digests — no content
- ``keys/master.key``           local master key wrapping the per-candidate data keys
- ``keys/candidate-keys.db``    wrapped per-candidate data keys (never part of a backup)
- ``keys/cursor.key``           authenticates search page cursors

Backups copy ``engram.db`` only, so destroying a candidate key shreds every copy of its blob.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .adapters.local.audit import JsonlAuditLog
from .adapters.local.clock import SystemClock
from .adapters.local.confirmation import AskHuman, InProcessConfirmations
from .adapters.local.sqlite_store import SqliteLexicalIndex, SqliteStore
from .adapters.local.vault import LocalVault, load_or_create_master_key
from .engine.ports import AdmissionPolicy, AuditSink, Clock, ConfirmationWorkflow
from .engine.service import Engine, EngineSettings
from .policy.builtin import BuiltinAdmissionPolicy

DATABASE_FILE = "engram.db"
AUDIT_FILE = "audit.log"
KEYS_DIR = "keys"


@dataclass
class EmbeddedHost:
    """A wired embedded engine and the adapters it owns."""

    data_dir: Path
    engine: Engine
    store: SqliteStore
    vault: LocalVault
    audit: AuditSink
    closers: list[object] = field(default_factory=list)

    def close(self) -> None:
        self.store.close()
        self.vault.close()


def prepare_data_dir(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (data_dir / KEYS_DIR).mkdir(mode=0o700, exist_ok=True)
    os.chmod(data_dir, 0o700)
    os.chmod(data_dir / KEYS_DIR, 0o700)


def open_embedded(
    data_dir: Path,
    *,
    policy: AdmissionPolicy | None = None,
    ask_human: AskHuman | None = None,
    confirmations: ConfirmationWorkflow | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    store: SqliteStore | None = None,
) -> EmbeddedHost:
    """Open (creating if needed) the embedded engine in ``data_dir``."""
    prepare_data_dir(data_dir)
    clock = clock or SystemClock()
    keys = data_dir / KEYS_DIR
    store = store or SqliteStore(data_dir / DATABASE_FILE)
    vault = LocalVault(keys / "candidate-keys.db", load_or_create_master_key(keys / "master.key"))
    audit = audit or JsonlAuditLog(data_dir / AUDIT_FILE)
    engine = Engine(
        store=store,
        vault=vault,
        lexical_index=SqliteLexicalIndex(store),
        admission_policy=policy or BuiltinAdmissionPolicy(),
        confirmations=confirmations or InProcessConfirmations(ask_human, clock),
        clock=clock,
        audit=audit,
        settings=EngineSettings(cursor_key=load_or_create_master_key(keys / "cursor.key")),
    )
    return EmbeddedHost(data_dir=data_dir, engine=engine, store=store, vault=vault, audit=audit)

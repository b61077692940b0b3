"""The composition root of the embedded default: everything wired from a data directory.

Layout of the data directory (owner-only permissions):

- ``engram.db``                 canonical store (journal, ledger, candidates, records, FTS5)
- ``audit.log``                 one JSON line per call: ids, outcome codes, digests — no content
- ``keys/master.key``           local master key wrapping the per-candidate data keys
- ``keys/candidate-keys.db``    wrapped per-candidate data keys (never part of a backup)
- ``keys/cursor.key``           authenticates search page cursors
- ``keys/issuer-ed25519.pem``   the local host's token issuer key (Ed25519, PKCS#8 PEM)
- ``host.json``                 the host configuration (resource, tenant, admission, retention)

Backups copy ``engram.db`` only, so destroying a candidate key shreds every copy of its blob.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import ValidationError

from .engine.ports import (
    AdmissionPolicy,
    AuditSink,
    Clock,
    ConfirmationWorkflow,
    Embedder,
    EmbedderUnavailable,
)
from .host.config import (
    HostConfig,
    HostConfigError,
    describe_validation_error,
    host_config_path,
    load_host_config,
    save_host_config,
)
from .host.tokens import issuer_key_path, load_or_create_issuer_key

if TYPE_CHECKING:  # the engine and its adapters (the encryption SDK) load in open_embedded
    from .adapters.local.confirmation import AskHuman
    from .adapters.local.sqlite_store import SqliteStore
    from .adapters.local.vault import LocalVault
    from .engine.service import Engine

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
    config: HostConfig = field(default_factory=HostConfig)

    def close(self) -> None:
        self.store.close()
        self.vault.close()


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data and keys directories (0700). An existing directory is only ever made
    stricter (group and other bits dropped), never writable: a read-only one is refused."""
    for directory in (data_dir, data_dir / KEYS_DIR):
        if directory.is_dir() and not os.stat(directory).st_mode & stat.S_IWUSR:
            raise PermissionError(
                errno.EACCES,
                "the data directory is read-only: make it writable (chmod u+w)"
                " or choose another with --data-dir",
                str(directory),
            )
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (data_dir / KEYS_DIR).mkdir(mode=0o700, exist_ok=True)
    for directory in (data_dir, data_dir / KEYS_DIR):
        mode = stat.S_IMODE(os.stat(directory).st_mode)
        if mode & 0o077:
            os.chmod(directory, mode & 0o700)


def open_embedded(
    data_dir: Path,
    *,
    policy: AdmissionPolicy | None = None,
    ask_human: AskHuman | None = None,
    confirmations: ConfirmationWorkflow | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    store: SqliteStore | None = None,
    config: HostConfig | None = None,
    embedder: Embedder | None = None,
    semantic_mode: Literal["hybrid", "semantic_only"] = "hybrid",
) -> EmbeddedHost:
    """Open (creating if needed) the embedded engine in ``data_dir``.

    The host configuration is ``config`` when given, else ``<data_dir>/host.json`` (defaults when
    the file is missing; ``HostConfigError`` when it is invalid). The admission policy is
    ``policy`` when given, else the one the host configuration describes.

    The semantic channel is on with ``embedder``, or when the configuration says
    ``search.semantic = "local"`` (the local embedder; ``HostConfigError`` when the semantic
    extra is not installed). Vectors live beside the FTS5 tables in ``engram.db``.
    """
    from .adapters.local.audit import JsonlAuditLog
    from .adapters.local.clock import SystemClock
    from .adapters.local.confirmation import InProcessConfirmations
    from .adapters.local.sqlite_store import SqliteLexicalIndex, SqliteStore, SqliteVectorIndex
    from .adapters.local.vault import LocalVault, load_or_create_master_key
    from .engine.service import Engine, EngineSettings

    config = config if config is not None else load_host_config(data_dir)
    policy = policy if policy is not None else config.admission_policy()
    if embedder is None and config.search.semantic == "local":
        embedder = _local_embedder()
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
        admission_policy=policy,
        confirmations=confirmations or InProcessConfirmations(ask_human, clock),
        clock=clock,
        audit=audit,
        settings=EngineSettings(
            cursor_key=load_or_create_master_key(keys / "cursor.key"),
            fusion=config.search.fusion,
            semantic_mode=semantic_mode,
        ),
        embedder=embedder,
        vector_index=SqliteVectorIndex(store) if embedder is not None else None,
    )
    _refresh_projections(store, embedder)
    return EmbeddedHost(
        data_dir=data_dir, engine=engine, store=store, vault=vault, audit=audit, config=config
    )


def _refresh_projections(store: SqliteStore, embedder: Embedder | None) -> None:
    """Re-index what an analyzer change or a newly enabled embedder made stale (usually nothing:
    a check of one row). The records' bodies in the store are the source."""
    from .engine import lexical, semantic
    from .engine.records import decode

    def fields_of(body: bytes) -> Mapping[str, str]:
        return lexical.projection_fields(decode(body))

    def vector_of(body: bytes) -> tuple[float, ...] | None:
        assert embedder is not None
        try:
            return semantic.record_vector(embedder, decode(body))
        except EmbedderUnavailable:
            return None

    store.refresh_projections(
        lexical.PROFILE_CONFIG_DIGEST, fields_of, vector_of if embedder is not None else None
    )


def _local_embedder() -> Embedder:
    from .adapters.local.embedder import SemanticExtraMissing, load_local_embedder

    try:
        return load_local_embedder()
    except SemanticExtraMissing as error:
        raise HostConfigError(f"search.semantic is 'local' but {error}") from None


def init_data_dir(data_dir: Path, *, resource: str | None = None) -> HostConfig:
    """Create everything the embedded host needs in ``data_dir``; idempotent.

    The data and keys directories (0700), the master, cursor and issuer keys, the SQLite database,
    the key table, the audit log and ``host.json`` (0600). An existing ``host.json`` is kept;
    ``resource`` replaces its ``resource`` (the audience of every token). Existing keys are never
    replaced. Raises ``HostConfigError`` for an invalid ``host.json`` or ``resource``, before
    anything is created.
    """
    config = init_host_files(data_dir, resource=resource)
    open_embedded(data_dir, config=config).close()
    return config


def init_host_files(data_dir: Path, *, resource: str | None = None) -> HostConfig:
    """What ``init_data_dir`` creates before it opens the host: the data and keys directories,
    ``host.json`` and the issuer key. The first ``open_embedded`` creates the rest (database, key
    table, master and cursor keys, audit log), so a caller about to open the host anyway
    (``open_server``) opens it once instead of opening it here too."""
    data_dir = Path(data_dir)
    path = host_config_path(data_dir)
    config = load_host_config(data_dir)
    changed = not path.exists()
    if resource is not None and resource != config.resource:
        try:
            config = HostConfig.model_validate({**config.model_dump(), "resource": resource})
        except ValidationError as error:
            raise HostConfigError(
                f"invalid --resource: {describe_validation_error(error)}"
            ) from None
        changed = True
    prepare_data_dir(data_dir)
    if changed:
        save_host_config(data_dir, config)
    load_or_create_issuer_key(issuer_key_path(data_dir))
    return config

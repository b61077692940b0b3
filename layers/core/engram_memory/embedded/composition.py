"""The composition root of the embedded default: everything wired from a data directory.

The data directory's files are named in ``data_dir.py``.

Backups copy ``engram.db`` only, so destroying a candidate key shreds every copy of its blob.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from engram_memory.binding.host_config import (
    EmbeddingModelConfig,
    HostConfig,
    describe_validation_error,
)
from engram_memory.embedded.data_dir import (
    AUDIT_FILE,
    CANDIDATE_KEYS_FILE,
    CURSOR_KEY_FILE,
    DATABASE_FILE,
    ISSUER_KEY_FILE,
    KEYS_DIR,
    MASTER_KEY_FILE,
    host_config_path,
    key_path,
)
from engram_memory.embedded.errors import DataDirectoryRefused, HostConfigError
from engram_memory.embedded.host_file import load_host_config, save_host_config
from engram_memory.embedded.issuer_keys import load_or_create_issuer_key
from engram_memory.engine.ports import (
    AdmissionPolicy,
    AuditSink,
    Clock,
    Embedder,
    EmbedderUnavailable,
    RecordKeys,
)
from engram_memory.operator_plane.commands import command_name

if TYPE_CHECKING:  # the engine and its adapters (the encryption SDK) load in open_embedded
    from engram_memory.adapters.local.sqlite.store import SqliteStore
    from engram_memory.adapters.local.vault import LocalVault
    from engram_memory.embedded.in_process import AskHuman
    from engram_memory.engine.context import Scope, TrustedContext
    from engram_memory.engine.service import Engine

# The key store a database with memories cannot do without: the master key and the wrapped
# candidate keys (pending candidates open with them only). Regenerating them silently would
# strand what the database holds (and a new issuer key beside them would void every token).
_REQUIRED_KEYS = (MASTER_KEY_FILE, CANDIDATE_KEYS_FILE)


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
    ask_human: AskHuman | None = None

    def call(self, tool: str, arguments: Any, ctx: TrustedContext) -> dict[str, Any]:
        """One tool call in this process, asking ``ask_human`` when it needs an approval."""
        from engram_memory.embedded.in_process import ask_approval, call_in_process

        obtain = ask_approval(self.ask_human, self.engine.clock) if self.ask_human else None
        return call_in_process(self.engine, tool, arguments, ctx, obtain)

    def close(self) -> None:
        # the audit lines that rode in this process's commits, synced and out of the outbox
        self.engine.settle_audit(sync=True)
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


def holds_memories(data_dir: Path) -> bool:
    """Whether ``data_dir``'s database has written anything (a journal event in any scope).

    Read-only: a database that does not exist, or an empty one, holds nothing; one that cannot
    be read counts as holding memories (refusing is the safe side)."""
    database = Path(data_dir) / DATABASE_FILE
    if not database.is_file() or database.stat().st_size == 0:
        return False
    # Without a WAL file (closed cleanly: checkpointed) the database file is the whole truth and
    # ``immutable`` reads it without creating -wal/-shm files; with one, a read-only open.
    wal = database.with_name(database.name + "-wal")
    options = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(f"{database.resolve().as_uri()}?{options}", uri=True)
    except sqlite3.Error:
        return True
    try:
        return conn.execute("SELECT 1 FROM journal_heads LIMIT 1").fetchone() is not None
    except sqlite3.OperationalError as error:
        return "no such table" not in str(error)
    except sqlite3.Error:
        return True
    finally:
        conn.close()


def missing_keys(data_dir: Path) -> list[str]:
    """The key files of ``_REQUIRED_KEYS`` absent from ``<data_dir>/keys``."""
    keys = Path(data_dir) / KEYS_DIR
    return [name for name in _REQUIRED_KEYS if not (keys / name).is_file()]


def check_key_store(data_dir: Path) -> None:
    """Refuse (``DataDirectoryRefused``) a data directory that holds memories without its key
    store, before anything is created: the state after restoring only ``engram.db``, or after
    ``keys/`` was deleted. New keys would open none of its pending candidates and verify none of
    its tokens, so nothing is regenerated."""
    missing = missing_keys(data_dir)
    if missing and holds_memories(data_dir):
        keys = Path(data_dir) / KEYS_DIR
        raise DataDirectoryRefused(
            f"the data directory {data_dir} holds memories but its key store is missing"
            f" ({', '.join(missing)} not in {keys}): it was deleted, or only the database was"
            " restored. Nothing was created. Put the original keys/ folder back (keys are never"
            " part of a backup); to start afresh instead, move the data directory aside."
        )


def require_initialised(data_dir: Path) -> None:
    """Refuse (``DataDirectoryRefused``) anything but an initialised data directory with its key
    store: the operations plane (``verify``, ``admin``) reads and decides, it never creates."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir() or not (data_dir / DATABASE_FILE).is_file():
        raise DataDirectoryRefused(
            f"no Engram Memory data directory at {data_dir} (nothing was created);"
            f" check --data-dir, or run `{command_name()} init --data-dir {data_dir}` for a new one"
        )
    check_key_store(data_dir)
    missing = missing_keys(data_dir)
    if missing:
        raise DataDirectoryRefused(
            f"the key store of {data_dir} is incomplete ({', '.join(missing)} missing);"
            " nothing was created."
            f" Put the original keys/ folder back, or run `{command_name()} init --data-dir"
            f" {data_dir}` if this data directory never held memories"
        )


def open_existing(data_dir: Path, **options: Any) -> EmbeddedHost:
    """``open_embedded`` on an initialised data directory only (see ``require_initialised``)."""
    require_initialised(data_dir)
    return open_embedded(data_dir, **options)


def open_embedded(
    data_dir: Path,
    *,
    policy: AdmissionPolicy | None = None,
    ask_human: AskHuman | None = None,
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
    from engram_memory.adapters.clock import SystemClock
    from engram_memory.adapters.local.audit import JsonlAuditLog
    from engram_memory.adapters.local.sqlite.store import SqliteStore

    check_key_store(data_dir)
    config = config if config is not None else load_host_config(data_dir)
    if embedder is None and config.search.semantic == "local":
        embedder = _local_embedder(data_dir, config.search.embedding_model)
    prepare_data_dir(data_dir)
    store = store or SqliteStore(data_dir / DATABASE_FILE)
    vault = _open_vault(data_dir / KEYS_DIR)
    audit = audit or JsonlAuditLog(data_dir / AUDIT_FILE)
    engine = _engine(
        data_dir,
        config,
        store,
        vault,
        policy=policy if policy is not None else config.admission_policy(),
        clock=clock or SystemClock(),
        audit=audit,
        embedder=embedder,
        semantic_mode=semantic_mode,
    )
    _check_key_store_belongs(data_dir, store, vault)
    # A data directory from before sealed bodies: seal its plaintext bodies now (migration).
    store.seal_plaintext_bodies(vault.record_keys.seal)
    _refresh_projections(store, vault.record_keys, embedder)
    return EmbeddedHost(
        data_dir=data_dir,
        engine=engine,
        store=store,
        vault=vault,
        audit=audit,
        config=config,
        ask_human=ask_human,
    )


def _open_vault(keys: Path) -> LocalVault:
    """The candidate and record key store, finishing a master-key rotation left half done."""
    from engram_memory.adapters.local.vault import (
        LocalVault,
        finish_master_rotation,
        load_or_create_master_key,
        next_master_key_path,
    )
    from engram_memory.embedded.data_dir_lease import owned

    if next_master_key_path(keys / MASTER_KEY_FILE).exists():
        # Only the data directory's owner finishes a rotation: in another process (a reader
        # beside a rotation under way) the staged key is the rotation's, not a remnant to drop.
        with owned(keys.parent, "a start finishing a key rotation") as mine:
            if mine:
                finish_master_rotation(keys / CANDIDATE_KEYS_FILE, keys / MASTER_KEY_FILE)
    return LocalVault(keys / CANDIDATE_KEYS_FILE, load_or_create_master_key(keys / MASTER_KEY_FILE))


def _engine(
    data_dir: Path,
    config: HostConfig,
    store: SqliteStore,
    vault: LocalVault,
    *,
    policy: AdmissionPolicy,
    clock: Clock,
    audit: AuditSink,
    embedder: Embedder | None,
    semantic_mode: Literal["hybrid", "semantic_only"],
) -> Engine:
    from engram_memory.adapters.local.sqlite.indexes import SqliteLexicalIndex, SqliteVectorIndex
    from engram_memory.adapters.local.vault import load_or_create_master_key
    from engram_memory.engine.service import Engine, EngineSettings

    return Engine(
        store=store,
        vault=vault,
        record_keys=vault.record_keys,
        lexical_index=SqliteLexicalIndex(store),
        admission_policy=policy,
        clock=clock,
        audit=audit,
        settings=EngineSettings(
            cursor_key=load_or_create_master_key(data_dir / KEYS_DIR / CURSOR_KEY_FILE),
            fusion=config.search.fusion,
            semantic_mode=semantic_mode,
            time_aware=config.search.time_aware,
        ),
        embedder=embedder,
        vector_index=SqliteVectorIndex(store) if embedder is not None else None,
    )


KEY_STORE_META = "key_store_id"


def _check_key_store_belongs(data_dir: Path, store: SqliteStore, vault: LocalVault) -> None:
    """The database records the identity of the key store it was written with; a database
    beside another key store (keys/ from another data directory, or regenerated) is refused
    rather than used with keys that open none of its candidates."""
    ours = vault.key_store_id()
    recorded = store.meta_get(KEY_STORE_META)
    if recorded == ours:
        return
    if recorded is None or not store.scopes():  # nothing written under another key store yet
        store.meta_set(KEY_STORE_META, ours)
    else:
        store.close()
        vault.close()
        raise DataDirectoryRefused(
            f"the key store in {Path(data_dir) / KEYS_DIR} does not belong to the database"
            f" {Path(data_dir) / DATABASE_FILE} (it was written with key store {recorded}, these"
            f" keys are {ours}); nothing was changed. Put that database's own keys/ folder back"
        )


def _refresh_projections(
    store: SqliteStore, record_keys: RecordKeys, embedder: Embedder | None
) -> None:
    """Re-index what an analyzer change or a newly enabled embedder made stale (usually nothing:
    a check of one row). The records' sealed bodies in the store are the source; a record whose
    key is destroyed is not re-indexed."""
    from engram_memory.engine import lexical, semantic
    from engram_memory.engine.records import decode, record_text

    def opened(scope: Scope, record_id: str, body: bytes) -> Any:
        plaintext = record_keys.open_many(scope, {record_id: body}).get(record_id)
        return None if plaintext is None else decode(plaintext)

    def lexical_of(
        scope: Scope, record_id: str, body: bytes
    ) -> tuple[Mapping[str, str], str] | None:
        record = opened(scope, record_id, body)
        return None if record is None else (lexical.projection_fields(record), record_text(record))

    def vector_of(scope: Scope, record_id: str, body: bytes) -> tuple[float, ...] | None:
        assert embedder is not None
        record = opened(scope, record_id, body)
        try:
            return None if record is None else semantic.record_vector(embedder, record)
        except EmbedderUnavailable:
            return None

    if embedder is None:
        store.refresh_projections(lexical.PROFILE_CONFIG_DIGEST, lexical_of)
        return
    from engram_memory.adapters.embedder import MODEL_ID

    # A data directory from before the model was recorded has the shipped model's vectors.
    store.refresh_projections(
        lexical.PROFILE_CONFIG_DIGEST,
        lexical_of,
        vector_of,
        vector_model=embedder.model_id,
        legacy_vector_model=MODEL_ID,
    )


def _local_embedder(data_dir: Path, model: EmbeddingModelConfig | None) -> Embedder:
    from engram_memory.adapters.embedder import (
        EmbeddingModelError,
        OnnxSentenceEmbedder,
        SemanticExtraMissing,
        load_local_embedder,
    )

    try:
        if model is None:
            return load_local_embedder()
        return OnnxSentenceEmbedder(Path(data_dir) / model.path, sha256=model.sha256)
    except SemanticExtraMissing as error:
        raise HostConfigError(f"search.semantic is 'local' but {error}") from None
    except EmbeddingModelError as error:
        raise HostConfigError(f"search.embedding_model: {error}") from None


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
    check_key_store(data_dir)
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
    load_or_create_issuer_key(key_path(data_dir, ISSUER_KEY_FILE))
    return config

"""Backup and restore of the embedded default (CONTRACT.md §1: the operations plane).

A backup is a consistent online copy of ``engram.db`` made with SQLite's backup API, without the
projections (derived data) and, as ever, without ``keys/``: the key store stays on the host.
Candidates and record bodies are sealed under keys that live only there, so a candidate withdrawn
or rejected, or a record forgotten, after the backup was taken stays unreadable in every copy.

A restore checks the backup before it touches anything (``BACKUP_INVALID``: not an Engram
database, a broken hash chain or cursor gap in any scope's journal, a record body that fails
authentication or does not hash to its digest), refuses a target data directory that already
holds memories or whose key store is not the backup's own (``RESTORE_REFUSED``), then puts the
database in place and rebuilds every scope's projections from the records whose keys still
exist: a record forgotten since the backup is neither readable nor searchable in the restored
copy. ``new_keys`` restores onto a fresh key store instead, deliberately: the journal and the
records' digests come back, but no body and no pending candidate can be opened again.

Both are all or nothing under a kill at any step (``operator_plane/crash_points.py`` names the
steps): each works on a hidden file and gives it its final name last.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram_memory.adapters.local.private_files import fsync_dir
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.adapters.local.vault import LocalVault, load_or_create_master_key
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.contract.types import format_instant
from engram_memory.embedded.composition import (
    KEY_STORE_META,
    holds_memories,
    init_data_dir,
    missing_keys,
    open_embedded,
    open_existing,
    prepare_data_dir,
)
from engram_memory.embedded.data_dir import (
    BACKUP_SUFFIX,
    CANDIDATE_KEYS_FILE,
    DATABASE_FILE,
    KEYS_DIR,
    MASTER_KEY_FILE,
    host_config_path,
)
from engram_memory.embedded.host_file import host_config_of, host_config_text, save_host_config
from engram_memory.engine.context import Scope
from engram_memory.engine.journal import verify_journal
from engram_memory.engine.ports import (
    RecordKeys,
    StoreUnavailable,
)
from engram_memory.operator_plane.auditing import audited
from engram_memory.operator_plane.backup_checks import OperationRefused, check_record_bodies
from engram_memory.operator_plane.crash_points import crash_point
from engram_memory.operator_plane.repair import reindex
from engram_memory.operator_plane.text import progress

__all__ = ["OperationRefused", "backup", "backups_listed", "restore", "verify_backup"]

_PAGE = 500
# The data directory's host.json travels in the backup (its admission policy, token lifetime,
# resource and tenant are not derivable from the database), as this store_meta row.
HOST_CONFIG_META = "host_config"
# What the operator does about keys/ before a restore (docs/operating.md, "Backup and restore"):
# the live key store, moved, never a copy kept aside (it would hold keys destroyed since).
_MOVE_KEYS = (
    "move the live keys/ folder of the data directory the backup was taken from there"
    " (keys are never in a backup; never restore beside a copy of keys/ kept aside:"
    " it would bring back what was forgotten)"
)


@dataclass(frozen=True, slots=True)
class _Checked:
    scopes: dict[str, int]
    records: int
    key_store_id: str | None
    without_key: int  # records whose body's key is gone (forgotten since, or other keys)


def backup(data_dir: Path, target: Path, operator: str) -> dict[str, Any]:
    """Write a backup of ``data_dir`` to ``target`` (a new file), check it as a restore would,
    and return what it holds. Audited as ``admin.backup``.

    The copy is made and checked under a hidden name beside ``target`` and linked into place
    only then: a backup stopped at any point leaves no file at ``target``, or a whole one."""
    target = Path(target)
    if target.exists():
        raise OperationRefused(ErrorCode.BACKUP_INVALID, f"{target} already exists")
    for stale in target.parent.glob(f".{target.name}.partial-*"):
        stale.unlink(missing_ok=True)  # left by a backup to this name that was killed
    host = open_existing(data_dir)
    try:
        scope = Scope(host.config.tenant_id, "*")

        def run(_call: Any) -> dict[str, Any]:
            staged = target.with_name(f".{target.name}.partial-{secrets.token_hex(6)}")
            try:
                checked = _staged_backup(
                    host.store, host.vault.record_keys, staged, host_config_text(host.config)
                )
                _link_into_place(staged, target)
            finally:
                _unlink_database(staged)
            return {
                "backup": str(target.resolve()),
                "bytes": target.stat().st_size,
                "journal_heads": checked.scopes,
                "records": checked.records,
                "key_store_id": checked.key_store_id,
                "keys_included": False,
                "projections_included": False,
                "host_config_included": True,
            }

        return audited(host.engine, scope, operator, "backup", target.name, run)
    finally:
        host.close()


def verify_backup(data_dir: Path, backup_file: Path, operator: str) -> dict[str, Any]:
    """Check ``backup_file`` as a restore would (``_check``, with ``data_dir``'s key store),
    restoring nothing: on a hidden copy, since opening a database as a store changes its file.
    Audited as ``admin.backup_verify``; a failed check raises ``OperationRefused``."""
    host = open_existing(data_dir)
    try:

        def run(_call: Any) -> dict[str, Any]:
            staged = backup_file.with_name(f".{backup_file.name}.verify-{secrets.token_hex(6)}")
            try:
                _copy(backup_file, staged)
                checked = _check(staged, host.vault.record_keys)
            finally:
                _unlink_database(staged)
            return {
                "backup": backup_file.name,
                "journal_heads": checked.scopes,
                "records": checked.records,
                "records_without_key": checked.without_key,
                "key_store_id": checked.key_store_id,
            }

        scope = Scope(host.config.tenant_id, "*")
        return audited(host.engine, scope, operator, "backup_verify", backup_file.name, run)
    finally:
        host.close()


def backups_listed(folder: Path) -> list[dict[str, Any]]:
    """The backups in ``folder``, newest first: name, size, time, and what each one's own
    tables say (key store id, journal heads), read only; ``None`` for a file that is not one."""
    found = sorted(folder.glob(f"*{BACKUP_SUFFIX}"), key=lambda path: path.name, reverse=True)
    return [
        {
            "name": path.name,
            "bytes": path.stat().st_size,
            "modified_at": format_instant(int(path.stat().st_mtime * 1000)),
            **_own_metadata(path),
        }
        for path in found
    ]


def _own_metadata(path: Path) -> dict[str, Any]:
    try:
        probe = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            meta = probe.execute(
                "SELECT value FROM store_meta WHERE key = ?", (KEY_STORE_META,)
            ).fetchone()
            heads = probe.execute(
                "SELECT tenant_id, workspace_id, cursor FROM journal_heads ORDER BY 1, 2"
            ).fetchall()
        finally:
            probe.close()
    except sqlite3.Error:
        return {"key_store_id": None, "journal_heads": None}
    return {
        "key_store_id": meta[0] if meta else None,
        "journal_heads": {f"{tenant}/{workspace}": cursor for tenant, workspace, cursor in heads},
    }


def _staged_backup(
    store: SqliteStore, record_keys: RecordKeys, staged: Path, host_config: str
) -> _Checked:
    """The online copy at ``staged`` with ``host_config`` (``host.json``'s text), checked as a
    restore would check it, self-contained."""
    try:
        store.backup_to(staged)
    except StoreUnavailable:
        raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
    _meta_set(staged, HOST_CONFIG_META, host_config)
    crash_point("backup.copied")
    checked = _check(staged, record_keys)
    _rollback_journal(staged)
    fsync_dir(staged)
    crash_point("backup.checked")
    return checked


def _link_into_place(staged: Path, target: Path) -> None:
    """Give the whole backup its name (a link never replaces a file made meanwhile)."""
    try:
        os.link(staged, target)
    except FileExistsError:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, f"{target} already exists") from None
    fsync_dir(target.parent)
    crash_point("backup.in_place")


def _check(database: Path, record_keys: RecordKeys | None) -> _Checked:
    """Check a backup file: an Engram database whose every journal verifies and whose every
    record body, opened with ``record_keys``, hashes to its digest (a body whose key is gone, or
    every body without a key store, is counted, not checked). Raises
    ``OperationRefused(BACKUP_INVALID)``."""
    try:
        with database.open("rb") as handle:
            if handle.read(16) != b"SQLite format 3\x00":
                raise OperationRefused(ErrorCode.BACKUP_INVALID, "not an SQLite database")
        probe = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
        try:
            (verdict,) = probe.execute("PRAGMA integrity_check").fetchone()
            tables = {name for (name,) in probe.execute("SELECT name FROM sqlite_master")}
        finally:
            probe.close()
    except (OSError, sqlite3.Error):
        raise OperationRefused(ErrorCode.BACKUP_INVALID, "unreadable database") from None
    if verdict != "ok" or not {"journal_heads", "journal_events", "records"} <= tables:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, "not an intact Engram Memory database")
    store = SqliteStore(database)
    try:
        heads: dict[str, int] = {}
        records = without_key = 0
        for scope in store.scopes():
            try:
                heads[f"{scope.tenant_id}/{scope.workspace_id}"] = verify_journal(
                    store, scope
                ).cursor
            except EngramError as error:
                raise OperationRefused(
                    ErrorCode.BACKUP_INVALID,
                    f"the journal of {scope.tenant_id}/{scope.workspace_id} fails its check"
                    f" ({error.code.value})",
                ) from None
            counted, unopened = _check_records(store, scope, record_keys)
            records += counted
            without_key += unopened
        return _Checked(heads, records, store.meta_get(KEY_STORE_META), without_key)
    except StoreUnavailable:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, "unreadable database") from None
    finally:
        store.close()


def _check_records(
    store: SqliteStore, scope: Scope, record_keys: RecordKeys | None
) -> tuple[int, int]:
    """(records checked, records whose body could not be opened for want of its key)."""
    checked = without_key = 0
    after = ""
    while rows := store.records_list(scope, None, after, _PAGE):
        checked += len(rows)
        bodies = {r.record_id: (r.body, r.record_digest) for r in rows if r.body is not None}
        without_key += check_record_bodies(scope, bodies, record_keys)
        after = rows[-1].record_id
        progress(checked, None, f"records checked in {scope.workspace_id}")
    return checked, without_key


def _target_refusal(data_dir: Path, *, new_keys: bool) -> list[str]:
    """Refuse a target that holds memories, or whose key store is partial or (without
    ``new_keys``) absent; answer the key files missing (all of them: a new key store)."""
    if holds_memories(data_dir):
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED,
            f"{data_dir} already holds memories; restore into an empty data directory",
        )
    missing = missing_keys(data_dir)
    if missing and len(missing) < 2:
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED,
            f"the key store in {data_dir / KEYS_DIR} is incomplete ({', '.join(missing)} missing)",
        )
    if missing and not new_keys:
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED,
            f"no key store in {data_dir / KEYS_DIR}: {_MOVE_KEYS} first,"
            " or pass --new-keys to restore onto new keys"
            " (no record body and no pending candidate will open)",
        )
    return missing


def restore(
    backup_file: Path, data_dir: Path, operator: str, *, new_keys: bool = False
) -> dict[str, Any]:
    """Restore ``backup_file`` into ``data_dir`` (see the module docstring); return a report.

    Raises ``OperationRefused`` (``BACKUP_INVALID`` or ``RESTORE_REFUSED``) before anything in
    ``data_dir`` changes. The database is copied, checked and projected under a hidden name and
    renamed into place last: a restore stopped at any point leaves the target as it was (run it
    again) or restored whole."""
    backup_file, data_dir = Path(backup_file), Path(data_dir)
    if not backup_file.is_file():
        raise OperationRefused(ErrorCode.BACKUP_INVALID, f"no backup file at {backup_file}")
    missing = _target_refusal(data_dir, new_keys=new_keys)
    created = not data_dir.exists()
    configured = host_config_path(data_dir).exists()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    for stale in data_dir.glob(f".{DATABASE_FILE}.restore-*"):
        stale.unlink(missing_ok=True)  # left by a restore that was killed
    staged = data_dir / f".{DATABASE_FILE}.restore-{secrets.token_hex(6)}"
    try:
        _copy(backup_file, staged)
        crash_point("restore.copied")
        checked = _check(staged, None)
        carried = _carried_config(staged, data_dir, write=not configured)
        if missing:
            init_data_dir(data_dir)  # the new key store (no memories yet: allowed)
        checked, fresh = _checked_beside_keys(staged, data_dir, checked, new_keys=new_keys)
        crash_point("restore.checked")
        report = _projected(data_dir, staged, checked, new_keys=fresh)
        crash_point("restore.projected")
        prepare_data_dir(data_dir)
        for suffix in ("-wal", "-shm"):
            (data_dir / f"{DATABASE_FILE}{suffix}").unlink(missing_ok=True)
        os.replace(staged, data_dir / DATABASE_FILE)
        fsync_dir(data_dir)
        crash_point("restore.in_place")
    except BaseException:
        _unlink_database(staged)
        if not configured:
            host_config_path(data_dir).unlink(missing_ok=True)
        if created and not any(data_dir.iterdir()):
            data_dir.rmdir()  # refused before anything was made: leave no trace
        raise
    _audit_restore(data_dir, operator)
    return {**report, "host_config": carried}


def _carried_config(staged: Path, data_dir: Path, *, write: bool) -> str:
    """Put the backup's ``host.json`` in ``data_dir`` when it has none (``write``); what
    became of it, for the report."""
    store = SqliteStore(staged)
    try:
        text = store.meta_get(HOST_CONFIG_META)
    finally:
        store.close()
    if text is None:
        return "not in the backup (taken before backups carried it): defaults"
    config = host_config_of(text, "the backup")
    if not write:
        return f"kept the target's {host_config_path(data_dir)} (the backup's is not applied)"
    save_host_config(data_dir, config)
    return f"restored from the backup to {host_config_path(data_dir)}"


def _checked_beside_keys(
    staged: Path, data_dir: Path, checked: _Checked, *, new_keys: bool
) -> tuple[_Checked, bool]:
    """The staged backup checked with the target's key store, which must be the backup's own
    (or, with ``new_keys``, one holding no key yet: made by ``init`` or a restore stopped
    half-way); the database then records it. Also answers whether the key store is new."""
    vault = _vault(data_dir)
    try:
        ours = vault.key_store_id()
        fresh = new_keys and not vault.holds_keys()
        if not fresh and checked.key_store_id != ours:
            raise OperationRefused(
                ErrorCode.RESTORE_REFUSED,
                f"the key store in {data_dir / KEYS_DIR} ({ours}) is not the backup's"
                f" ({checked.key_store_id}); {_MOVE_KEYS}",
            )
        # The bodies, opened with the backup's own key store: intact, and how many are
        # forgotten since (their keys destroyed).
        checked = _check(staged, vault.record_keys)
    finally:
        vault.close()
    _meta_set(staged, KEY_STORE_META, ours)
    return checked, fresh


def _rollback_journal(database: Path) -> None:
    """Leave a backup file self-contained: no WAL mode (the check opened it as a store)."""
    conn = sqlite3.connect(str(database))
    try:
        conn.execute("PRAGMA journal_mode = DELETE")
    finally:
        conn.close()


def _copy(source: Path, target: Path) -> None:
    fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    try:
        reader = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
        writer = sqlite3.connect(str(target))
        try:
            reader.backup(writer)
        finally:
            reader.close()
            writer.close()
    except sqlite3.Error:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, "unreadable database") from None


def _vault(data_dir: Path) -> LocalVault:
    keys = data_dir / KEYS_DIR
    return LocalVault(keys / CANDIDATE_KEYS_FILE, load_or_create_master_key(keys / MASTER_KEY_FILE))


def _meta_set(staged: Path, key: str, value: str) -> None:
    store = SqliteStore(staged)
    try:
        store.meta_set(key, value)
    finally:
        store.close()


def _projected(
    data_dir: Path, staged: Path, checked: _Checked, *, new_keys: bool
) -> dict[str, Any]:
    """Rebuild the staged database's projections (the records whose keys exist) before it is
    put in place, so the restored directory is searchable from its first open; the report."""
    host = open_embedded(data_dir, store=SqliteStore(staged))
    try:
        indexed = 0
        unopenable = 0
        for done, name in enumerate(checked.scopes):
            progress(done, len(checked.scopes), "workspaces re-indexed")
            tenant_id, _, workspace_id = name.partition("/")
            scope = Scope(tenant_id, workspace_id)
            indexed += reindex(host.engine, scope).indexed
            after = ""
            while rows := host.store.candidates_list(scope, "pending", after, _PAGE):
                unopenable += sum(1 for row in rows if not host.vault.key_exists(row.key_ref))
                after = rows[-1].candidate_id
    finally:
        host.close()  # checkpoints the staged database's WAL into it
    _rollback_journal(staged)
    fsync_dir(staged)
    return {
        "restored": str((data_dir / DATABASE_FILE).resolve()),
        "journal_heads": checked.scopes,
        "records": checked.records,
        # Forgotten after the backup was taken (their keys are destroyed): they stay
        # forgotten, neither readable nor searchable.
        "records_without_key": checked.without_key,
        "projected": indexed,
        "new_key_store": new_keys,
        "pending_candidates_without_key": unopenable,
    }


def _audit_restore(data_dir: Path, operator: str) -> None:
    host = open_embedded(data_dir)
    try:
        audited(
            host.engine,
            Scope(host.config.tenant_id, "*"),
            operator,
            "restore",
            None,
            lambda _call: None,
        )
    finally:
        host.close()


def _unlink_database(path: Path) -> None:
    """Remove a staged database and whatever SQLite kept beside it."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)

"""The embedded vault: per-candidate data keys in a separate SQLite key file.

Each sealed candidate gets its own random 256-bit data key. The payload is encrypted with the AWS
Encryption SDK (the data key as a raw AES wrapping key, ``sealing.py``; committing algorithm suite
without signatures, an encryption
context binding tenant, workspace and candidate). The data key itself is stored only in the key
file, wrapped under the master key with AES-256-GCM. Destroying the key row crypto-shreds the
blob: the ciphertext, including any copy in a backup of the main database, can never be opened
again. The key file is opened with ``secure_delete`` and checkpointed after every destroy so a
destroyed key's bytes are overwritten in the file and gone from its -wal, and it must never be
included in backups.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.adapters.local import wal_space
from engram_memory.adapters.local.key_durability import commit_synced_once, delete_and_scrub
from engram_memory.adapters.local.private_files import fsync_dir, make_private_dirs, write_all
from engram_memory.adapters.local.record_keys import SCHEMA as RECORD_KEYS_SCHEMA
from engram_memory.adapters.local.record_keys import LocalRecordKeys
from engram_memory.adapters.local.transactions import immediate
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    KeyDestroyed,
    SealedBlob,
    SealIntegrityError,
    VaultUnavailable,
)

__all__ = [
    "LocalVault",
    "finish_master_rotation",
    "load_or_create_master_key",
    "master_fingerprint",
    "next_master_key_path",
]


_KEY_BYTES: Final = 32
_NONCE_BYTES: Final = 12
_WRAP_AAD_PREFIX: Final = b"engram-memory/data-key/v1\x00"
_BUSY_TIMEOUT_S: Final = 5.0
_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS data_keys (
    key_ref TEXT PRIMARY KEY NOT NULL,
    nonce BLOB NOT NULL,
    wrapped BLOB NOT NULL,
    created_at_ms INTEGER NOT NULL
)
"""
# The key store's identity: a random id, made once, that the database it serves records too, so
# a database restored beside a key store that is not its own is refused (RESTORE_REFUSED).
_IDENTITY_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS key_store (
    name TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
)
"""

_T = TypeVar("_T")


class LocalVault:
    """A ``Vault`` whose wrapped data keys live in a private SQLite file apart from the main db.

    Safe to share between threads. ``keys_path`` is created with mode 0600 (its missing parent
    directories with 0700); ``master_key`` is the 32-byte key that wraps every data key (see
    ``load_or_create_master_key``).
    """

    def __init__(self, keys_path: Path, master_key: bytes) -> None:
        if len(master_key) != _KEY_BYTES:
            raise ValueError(f"the master key must be {_KEY_BYTES} bytes")
        self._path = Path(keys_path)
        self._wrapper = AESGCM(master_key)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = self._connect()
        # Record bodies' keys: the same key file, another key class (see record_keys.py).
        self.record_keys = LocalRecordKeys(self._run, master_key)

    # ----------------------------------------------------------------------------------------
    # Vault port
    # ----------------------------------------------------------------------------------------

    def seal(self, scope: Scope, candidate_id: str, plaintext: bytes) -> SealedBlob:
        """Encrypt ``plaintext`` under a fresh data key bound to ``scope`` and ``candidate_id``.

        Raises ``VaultUnavailable`` when the candidate cannot be sealed (the key file cannot be
        written, or encryption failed); nothing usable is left behind.
        """
        data_key = secrets.token_bytes(_KEY_BYTES)
        key_ref = "key_" + secrets.token_hex(16)
        nonce = secrets.token_bytes(_NONCE_BYTES)
        wrapped = self._wrapper.encrypt(nonce, data_key, _wrap_aad(key_ref, scope, candidate_id))
        from engram_memory.adapters.sealing import seal_sealed_blob

        sealed = seal_sealed_blob(
            self._esdk, "local", scope, candidate_id, key_ref, data_key, plaintext
        )
        # The key row is written after encryption succeeded so a failed seal leaves no orphan key,
        # and with the record keys made meanwhile (``LocalRecordKeys.prepare``): one commit.
        created_at_ms = time.time_ns() // 1_000_000

        def write_keys(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO data_keys (key_ref, nonce, wrapped, created_at_ms)"
                " VALUES (?, ?, ?, ?)",
                (key_ref, nonce, wrapped, created_at_ms),
            )
            self.record_keys.write_prepared(conn)

        # Durable on return after one sync of the -wal (key_durability.py).
        self._run("seal", lambda conn: commit_synced_once(conn, self._path, write_keys))
        return sealed

    def open(self, scope: Scope, candidate_id: str, blob: SealedBlob) -> bytes:
        """Decrypt ``blob``, which must have been sealed for this ``scope`` and ``candidate_id``.

        Raises ``KeyDestroyed`` when its data key is gone, ``SealIntegrityError`` when the blob or
        the key fails authentication or belongs to another context, ``VaultUnavailable`` when the
        key file cannot be read.
        """
        row = self._run(
            "open",
            lambda conn: conn.execute(
                "SELECT nonce, wrapped FROM data_keys WHERE key_ref = ?", (blob.key_ref,)
            ).fetchone(),
        )
        if row is None:
            raise KeyDestroyed(f"data key {blob.key_ref} no longer exists")
        nonce, wrapped = row
        try:
            data_key = self._wrapper.decrypt(
                nonce, wrapped, _wrap_aad(blob.key_ref, scope, candidate_id)
            )
        except (InvalidTag, ValueError, TypeError) as exc:
            raise SealIntegrityError(
                f"data key {blob.key_ref} does not belong to this candidate"
            ) from exc
        from engram_memory.adapters.sealing import open_sealed_blob

        return open_sealed_blob(self._esdk, scope, candidate_id, blob, data_key)

    @functools.cached_property
    def _esdk(self) -> Any:
        """The Encryption SDK's client, made at the first seal or open rather than when the vault
        opens: importing the SDK is ~0.4 s of CPU, which a server's start, and a server that only
        searches and reads records (their bodies are AES-GCM under record keys), never need."""
        import aws_encryption_sdk

        # One data key per message, so a message carrying more is malformed by construction.
        return aws_encryption_sdk.EncryptionSDKClient(
            commitment_policy=aws_encryption_sdk.CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT,
            max_encrypted_data_keys=1,
        )

    def destroy(self, key_ref: str) -> None:
        """Durably delete the data key; idempotent (destroying a missing key is not an error).

        Returns once the key's bytes are gone from the key file and its -wal; raises
        ``VaultUnavailable`` when the -wal could not be truncated (a reader of an older snapshot
        in another process): the deletion is then durable but not yet scrubbed, and a retry
        finishes it.
        """
        # Durable and scrubbed in the checkpoint's two syncs (key_durability.py says why that is safe).
        self._run(
            "destroy",
            lambda conn: delete_and_scrub(
                conn, "DELETE FROM data_keys WHERE key_ref = ?", (key_ref,)
            ),
        )

    def key_store_id(self) -> str:
        """This key store's identity (``ks_`` + 32 hex), made on first use and never changed."""

        def identity(conn: sqlite3.Connection) -> str:
            conn.execute(
                "INSERT OR IGNORE INTO key_store VALUES ('id', ?)", ("ks_" + secrets.token_hex(16),)
            )
            (value,) = conn.execute("SELECT value FROM key_store WHERE name = 'id'").fetchone()
            return str(value)

        return self._run("key_store_id", identity)

    def rewrap(
        self, new_master_key: bytes, bindings: Mapping[str, tuple[Scope, str]]
    ) -> tuple[int, int]:
        """Re-wrap every data key under ``new_master_key`` in one transaction of the key file,
        recording the new master key's fingerprint in it (``finish_master_rotation`` reads it to
        finish a rotation that stopped before the new key file was put in place).

        ``bindings`` maps each ``key_ref`` to the scope and candidate its wrapping is bound to
        (the candidates of the main database). Returns ``(rewrapped, unbound)``: keys bound to
        no known candidate cannot be unwrapped and are left as they are (they open nothing).
        Afterwards this vault still holds the old master key: open a new one."""
        if len(new_master_key) != _KEY_BYTES:
            raise ValueError(f"the master key must be {_KEY_BYTES} bytes")
        rewrapper = AESGCM(new_master_key)

        def run(conn: sqlite3.Connection) -> tuple[int, int]:
            with immediate(conn):
                rows = conn.execute("SELECT key_ref, nonce, wrapped FROM data_keys").fetchall()
                done = unbound = 0
                for key_ref, nonce, wrapped in rows:
                    binding = bindings.get(key_ref)
                    if binding is None:
                        unbound += 1
                        continue
                    aad = _wrap_aad(key_ref, binding[0], binding[1])
                    data_key = self._wrapper.decrypt(nonce, wrapped, aad)
                    fresh = secrets.token_bytes(_NONCE_BYTES)
                    conn.execute(
                        "UPDATE data_keys SET nonce = ?, wrapped = ? WHERE key_ref = ?",
                        (fresh, rewrapper.encrypt(fresh, data_key, aad), key_ref),
                    )
                    done += 1
                self.record_keys.rewrap_scope_keys(conn, rewrapper)
                conn.execute(
                    "INSERT INTO key_store VALUES ('master_fingerprint', ?) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (master_fingerprint(new_master_key),),
                )
            return done, unbound

        try:
            return self._run("rewrap", run)
        except InvalidTag as exc:
            raise SealIntegrityError("a data key does not open under the master key") from exc

    def holds_keys(self) -> bool:
        """Whether any key (a candidate's, a record's or a scope's) was ever made and is held:
        a key store without one protects nothing yet."""
        row = self._run(
            "holds_keys",
            lambda conn: conn.execute(
                "SELECT EXISTS (SELECT 1 FROM data_keys) OR EXISTS (SELECT 1 FROM record_keys)"
                " OR EXISTS (SELECT 1 FROM scope_keys)"
            ).fetchone(),
        )
        return bool(row[0])

    def key_exists(self, key_ref: str) -> bool:
        """Whether the data key ``key_ref`` is still held."""
        row = self._run(
            "key_exists",
            lambda conn: conn.execute(
                "SELECT 1 FROM data_keys WHERE key_ref = ?", (key_ref,)
            ).fetchone(),
        )
        return row is not None

    # ----------------------------------------------------------------------------------------
    # Lifecycle
    # ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the key file; idempotent. Later calls raise ``VaultUnavailable``."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    def __enter__(self) -> LocalVault:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------
    # Internals
    # ----------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            make_private_dirs(self._path.parent)
            _create_private_file(self._path)
        except OSError as exc:
            raise VaultUnavailable("the local vault key file cannot be created") from exc
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=_BUSY_TIMEOUT_S,
                isolation_level=None,  # autocommit: every statement is its own durable commit
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise VaultUnavailable("the local vault key file cannot be opened") from exc
        try:
            # WAL, as the store: a key written at capture costs one append and one fsync of the
            # -wal file (synchronous=FULL, so a committed key survives a power cut), where a
            # rollback journal cost three fsyncs and a file deletion. The -wal keeps images of
            # the pages a destroy changed, so ``destroy`` checkpoints and truncates it before it
            # returns: secure_delete has zeroed the key's bytes in the new page images, the
            # checkpoint writes them over the database file, the truncation drops the old images.
            (journal_mode,) = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            (secure_delete,) = conn.execute("PRAGMA secure_delete=ON").fetchone()
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(_SCHEMA)
            conn.execute(_IDENTITY_SCHEMA)
            conn.executescript(RECORD_KEYS_SCHEMA)
            # The -wal an open starts from (empty) is overwritten from here on, not grown.
            wal_space.reserve(conn)
        except sqlite3.Error as exc:
            conn.close()
            raise VaultUnavailable("the local vault key file cannot be opened") from exc
        if str(journal_mode).lower() != "wal" or secure_delete != 1:
            conn.close()
            raise VaultUnavailable("the local vault key file cannot guarantee key deletion")
        return conn

    def _run(self, action: str, operation: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock:
            if self._conn is None:
                raise VaultUnavailable("the local vault is closed")
            try:
                return operation(self._conn)
            except sqlite3.Error as exc:
                raise VaultUnavailable(f"the local vault key file failed during {action}") from exc


def master_fingerprint(master_key: bytes) -> str:
    """A fingerprint naming a master key (a hash of 256 random bits reveals nothing of them)."""
    return hashlib.sha256(b"engram-memory/master-fingerprint\x00" + master_key).hexdigest()[:32]


def next_master_key_path(path: Path) -> Path:
    """Where a rotation stages the new master key until the key file is re-wrapped."""
    return Path(path).with_name(Path(path).name + ".next")


def finish_master_rotation(keys_path: Path, master_path: Path) -> None:
    """Complete or undo a master-key rotation that stopped half-way (see ``LocalVault.rewrap``):
    the staged new key replaces the old one if the key file was re-wrapped under it, and is
    discarded otherwise. Nothing happens when no rotation is staged."""
    staged = next_master_key_path(master_path)
    if not staged.exists():
        return
    conn = sqlite3.connect(keys_path)
    try:
        row = conn.execute(
            "SELECT value FROM key_store WHERE name = 'master_fingerprint'"
        ).fetchone()
    except sqlite3.OperationalError:
        row = None
    finally:
        conn.close()
    if row is not None and row[0] == master_fingerprint(_read_master_key(staged)):
        os.replace(staged, master_path)
    else:
        staged.unlink()
    fsync_dir(Path(master_path).parent)


def load_or_create_master_key(path: Path) -> bytes:
    """Return the 32-byte master key stored at ``path``, creating it if missing.

    A new key file is written atomically with mode 0600 (missing parent directories with 0700),
    so concurrent callers all end up with the same key. Raises ``ValueError`` when the existing
    file does not hold exactly 32 bytes.
    """
    path = Path(path)
    try:
        return _read_master_key(path)
    except FileNotFoundError:
        pass
    make_private_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)
            write_all(fd, secrets.token_bytes(_KEY_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        # link() never replaces an existing file: if another process won the race, keep its key.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)
    return _read_master_key(path)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _wrap_aad(key_ref: str, scope: Scope, candidate_id: str) -> bytes:
    """Associated data binding a wrapped data key to its key_ref and candidate (length-prefixed)."""
    parts = [
        field.encode("utf-8")
        for field in (key_ref, scope.tenant_id, scope.workspace_id, candidate_id)
    ]
    return _WRAP_AAD_PREFIX + b"".join(len(p).to_bytes(4, "big") + p for p in parts)


def _read_master_key(path: Path) -> bytes:
    with open(path, "rb") as handle:
        key = handle.read(_KEY_BYTES + 1)
    if len(key) != _KEY_BYTES:
        raise ValueError(f"master key file {path} does not hold exactly {_KEY_BYTES} bytes")
    return key


def _create_private_file(path: Path) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)

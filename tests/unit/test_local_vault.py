"""The embedded vault: sealing, opening and crypto-shredding per-candidate data keys."""

from __future__ import annotations

import logging
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.adapters.local.vault import (
    LocalVault,
    _wrap_aad,
    load_or_create_master_key,
)
from engram_memory.adapters.sealing import KEY_NAMESPACE
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    KeyDestroyed,
    SealedBlob,
    SealIntegrityError,
    VaultUnavailable,
)

from engram_testing import decrypts_with, run_in_threads

SCOPE = Scope("tenant-a", "workspace-1")
SECRET = b"the launch code is swordfish-7731"


@pytest.fixture
def master_key(tmp_path: Path) -> bytes:
    return load_or_create_master_key(tmp_path / "secrets" / "master.key")


@pytest.fixture
def keys_path(tmp_path: Path) -> Path:
    return tmp_path / "vault" / "keys.sqlite3"


@pytest.fixture
def vault(keys_path: Path, master_key: bytes) -> Iterator[LocalVault]:
    local = LocalVault(keys_path, master_key)
    yield local
    local.close()


def _rows(keys_path: Path) -> dict[str, tuple[bytes, bytes]]:
    conn = sqlite3.connect(keys_path)
    try:
        rows = conn.execute("SELECT key_ref, nonce, wrapped FROM data_keys").fetchall()
    finally:
        conn.close()
    return {key_ref: (nonce, wrapped) for key_ref, nonce, wrapped in rows}


def _unwrap(master_key: bytes, key_ref: str, row: tuple[bytes, bytes], candidate: str) -> bytes:
    nonce, wrapped = row
    return AESGCM(master_key).decrypt(nonce, wrapped, _wrap_aad(key_ref, SCOPE, candidate))


def _decrypts_with(wrapping_key: bytes, key_name: str, ciphertext: bytes) -> bool:
    """Whether an attacker holding ``wrapping_key`` could decrypt ``ciphertext`` with the ESDK."""
    return decrypts_with(KEY_NAMESPACE, wrapping_key, key_name, ciphertext, SECRET)


def test_every_seal_uses_a_fresh_data_key(vault: LocalVault) -> None:
    first = vault.seal(SCOPE, "cand_1", SECRET)
    second = vault.seal(SCOPE, "cand_1", SECRET)

    assert first.key_ref != second.key_ref
    assert first.ciphertext != second.ciphertext


def test_the_ciphertext_does_not_contain_the_plaintext(vault: LocalVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    assert SECRET not in blob.ciphertext
    assert b"swordfish" not in blob.ciphertext


def test_a_blob_presented_under_another_key_ref_fails_integrity(vault: LocalVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    other = vault.seal(SCOPE, "cand_1", b"something else")

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", SealedBlob(other.key_ref, blob.ciphertext))


def test_a_destroyed_key_makes_the_blob_unopenable_by_the_vault(vault: LocalVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    vault.destroy(blob.key_ref)

    with pytest.raises(KeyDestroyed):
        vault.open(SCOPE, "cand_1", blob)


def test_no_key_the_system_still_holds_decrypts_a_shredded_blob(
    vault: LocalVault, keys_path: Path, master_key: bytes
) -> None:
    candidates = [f"cand_{i}" for i in range(5)]
    blobs = {c: vault.seal(SCOPE, c, SECRET) for c in candidates}
    victim = blobs["cand_2"]
    candidate_of = {blob.key_ref: c for c, blob in blobs.items()}
    # The harness must be able to break the blob while its key exists, or "all fail" proves nothing.
    victim_key = _unwrap(master_key, victim.key_ref, _rows(keys_path)[victim.key_ref], "cand_2")
    assert _decrypts_with(victim_key, victim.key_ref, victim.ciphertext)

    vault.destroy(victim.key_ref)

    remaining = _rows(keys_path)
    assert victim.key_ref not in remaining
    assert len(remaining) == len(candidates) - 1
    held_keys = [
        _unwrap(master_key, key_ref, row, candidate_of[key_ref])
        for key_ref, row in remaining.items()
    ]
    # The key name is set to the victim's key_ref so the keyring really attempts each key.
    for key in [*held_keys, master_key]:
        assert not _decrypts_with(key, victim.key_ref, victim.ciphertext)
    for candidate, blob in blobs.items():
        if blob is not victim:
            assert vault.open(SCOPE, candidate, blob) == SECRET


def test_destroy_is_idempotent(vault: LocalVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    vault.destroy(blob.key_ref)
    vault.destroy(blob.key_ref)
    vault.destroy("key_never_existed")

    assert not vault.key_exists(blob.key_ref)


def test_key_exists_reports_only_keys_still_held(vault: LocalVault) -> None:
    kept = vault.seal(SCOPE, "cand_1", SECRET)
    shredded = vault.seal(SCOPE, "cand_2", SECRET)

    vault.destroy(shredded.key_ref)

    assert vault.key_exists(kept.key_ref)
    assert not vault.key_exists(shredded.key_ref)
    assert not vault.key_exists("key_never_existed")


def test_the_key_file_is_private_and_separate_from_the_main_database(
    tmp_path: Path, master_key: bytes
) -> None:
    main_db = tmp_path / "data" / "engram.sqlite3"
    main_db.parent.mkdir()
    sqlite3.connect(main_db).close()
    keys_path = tmp_path / "data" / "keys" / "vault.sqlite3"

    with LocalVault(keys_path, master_key) as vault:
        vault.seal(SCOPE, "cand_1", SECRET)

    assert not keys_path.samefile(main_db)
    assert stat.S_IMODE(keys_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys_path.parent.stat().st_mode) == 0o700
    conn = sqlite3.connect(keys_path)
    try:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        conn.close()
    # the wrapped candidate keys, the store's id, the record keys and their scopes' keys
    assert sorted(tables) == [("data_keys",), ("key_store",), ("record_keys",), ("scope_keys",)]


def test_an_existing_key_file_is_narrowed_to_owner_only(keys_path: Path, master_key: bytes) -> None:
    keys_path.parent.mkdir()
    keys_path.touch(mode=0o644)
    keys_path.chmod(0o644)

    LocalVault(keys_path, master_key).close()

    assert stat.S_IMODE(keys_path.stat().st_mode) == 0o600


def test_destroy_overwrites_the_wrapped_key_bytes_in_the_key_file(
    vault: LocalVault, keys_path: Path
) -> None:
    blobs = [vault.seal(SCOPE, f"cand_{i}", SECRET) for i in range(40)]
    victim = blobs[17]
    rows = _rows(keys_path)
    victim_wrapped = rows[victim.key_ref][1]
    wal = keys_path.with_name(keys_path.name + "-wal")

    def on_disk() -> bytes:  # the key file and its write-ahead log: every byte SQLite wrote
        return keys_path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")

    assert victim_wrapped in on_disk()

    vault.destroy(victim.key_ref)

    after = on_disk()
    assert victim_wrapped not in after
    assert rows[victim.key_ref][0] + victim_wrapped not in after
    assert all(rows[b.key_ref][1] in after for b in blobs if b is not victim)
    assert not keys_path.with_name(keys_path.name + "-journal").exists()
    # Truncated, then room reserved for the next seals (wal_space): zeros, no page image.
    assert not wal.exists() or wal.read_bytes() == bytes(wal.stat().st_size)


def test_a_destroy_blocked_by_an_older_reader_deletes_then_scrubs_on_retry(
    vault: LocalVault, keys_path: Path
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    wrapped = _rows(keys_path)[blob.key_ref][1]
    wal = keys_path.with_name(keys_path.name + "-wal")
    reader = sqlite3.connect(keys_path, timeout=0.1)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM data_keys").fetchone() == (1,)  # a snapshot

    with pytest.raises(VaultUnavailable):  # the -wal cannot be truncated under the reader
        vault.destroy(blob.key_ref)

    assert vault.key_exists(blob.key_ref) is False  # deleted (and synced) all the same
    assert vault._run("t", lambda c: c.execute("PRAGMA synchronous").fetchone()) == (2,)
    reader.rollback()
    reader.close()
    vault.destroy(blob.key_ref)  # the outbox's retry finishes the scrub
    assert wrapped not in keys_path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda ct: bytes([ct[0] ^ 0x01]) + ct[1:],
        lambda ct: ct[:40] + bytes([ct[40] ^ 0x01]) + ct[41:],
        lambda ct: ct[:-60] + bytes([ct[-60] ^ 0x01]) + ct[-59:],
        lambda ct: ct[:-1] + bytes([ct[-1] ^ 0x01]),
        lambda ct: ct[: len(ct) // 2],
        lambda ct: ct + b"\x00",
        lambda ct: b"",
    ],
    ids=["version", "header", "body", "tail", "truncated", "trailing-byte", "empty"],
)
def test_a_corrupted_ciphertext_fails_integrity(
    vault: LocalVault, corrupt: Callable[[bytes], bytes]
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    damaged = SealedBlob(blob.key_ref, corrupt(blob.ciphertext))

    with pytest.raises(SealIntegrityError) as caught:
        vault.open(SCOPE, "cand_1", damaged)
    assert "swordfish" not in str(caught.value)


def test_a_tampered_wrapped_key_fails_integrity(vault: LocalVault, keys_path: Path) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    conn = sqlite3.connect(keys_path)
    try:
        conn.execute(
            "UPDATE data_keys SET wrapped = zeroblob(48) WHERE key_ref = ?", (blob.key_ref,)
        )
        conn.commit()
    finally:
        conn.close()

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", blob)


def test_a_vault_reopened_with_its_master_key_opens_earlier_blobs(
    keys_path: Path, master_key: bytes
) -> None:
    with LocalVault(keys_path, master_key) as first:
        blob = first.seal(SCOPE, "cand_1", SECRET)

    with LocalVault(keys_path, master_key) as second:
        assert second.open(SCOPE, "cand_1", blob) == SECRET


def test_a_vault_with_another_master_key_cannot_open_blobs(
    keys_path: Path, master_key: bytes
) -> None:
    with LocalVault(keys_path, master_key) as first:
        blob = first.seal(SCOPE, "cand_1", SECRET)

    with LocalVault(keys_path, bytes(32)) as impostor, pytest.raises(SealIntegrityError):
        impostor.open(SCOPE, "cand_1", blob)


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_a_master_key_of_the_wrong_size_is_refused_by_the_vault(keys_path: Path, size: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        LocalVault(keys_path, bytes(size))


def test_a_directory_in_place_of_the_key_file_makes_the_vault_unavailable(
    keys_path: Path, master_key: bytes
) -> None:
    keys_path.mkdir(parents=True)

    with pytest.raises(VaultUnavailable):
        LocalVault(keys_path, master_key)


def test_a_key_file_that_is_not_a_database_makes_the_vault_unavailable(
    keys_path: Path, master_key: bytes
) -> None:
    keys_path.parent.mkdir()
    keys_path.write_bytes(b"this is not a sqlite database, just some bytes" * 100)

    with pytest.raises(VaultUnavailable):
        LocalVault(keys_path, master_key)


def test_every_operation_on_a_closed_vault_is_unavailable(vault: LocalVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    vault.close()
    vault.close()

    with pytest.raises(VaultUnavailable):
        vault.seal(SCOPE, "cand_2", SECRET)
    _assert_unavailable(vault, blob)


def _assert_unavailable(vault: LocalVault, blob: SealedBlob) -> None:
    """Opening the blob, destroying its key and asking for it all answer ``VaultUnavailable``."""
    with pytest.raises(VaultUnavailable):
        vault.open(SCOPE, "cand_1", blob)
    with pytest.raises(VaultUnavailable):
        vault.destroy(blob.key_ref)
    with pytest.raises(VaultUnavailable):
        vault.key_exists(blob.key_ref)


def test_a_key_file_broken_underneath_the_vault_makes_operations_unavailable(
    vault: LocalVault, keys_path: Path
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    conn = sqlite3.connect(keys_path)
    try:
        conn.execute("DROP TABLE data_keys")
        conn.commit()
    finally:
        conn.close()

    with pytest.raises(VaultUnavailable) as caught:
        vault.seal(SCOPE, "cand_2", SECRET)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    assert "swordfish" not in str(caught.value)
    _assert_unavailable(vault, blob)


def test_failed_opens_log_no_errors_and_nothing_logs_the_plaintext(
    vault: LocalVault, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    assert vault.open(SCOPE, "cand_1", blob) == SECRET
    corrupted = SealedBlob(blob.key_ref, blob.ciphertext[:-1] + b"\x00")

    for scope, candidate_id, sealed in [
        (SCOPE, "cand_1", corrupted),
        (SCOPE, "cand_1", SealedBlob(blob.key_ref, b"garbage")),
        (Scope("tenant-b", "workspace-1"), "cand_1", blob),
    ]:
        with pytest.raises(SealIntegrityError):
            vault.open(scope, candidate_id, sealed)

    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert all("swordfish" not in r.getMessage() for r in caplog.records)
    assert "swordfish" not in caplog.text


def test_concurrent_seals_from_eight_threads_all_round_trip(vault: LocalVault) -> None:
    barrier = threading.Barrier(8)
    sealed: dict[int, list[tuple[str, bytes, SealedBlob]]] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            barrier.wait()
            mine = []
            for i in range(10):
                candidate_id = f"cand_{n}_{i}"
                plaintext = f"payload {n}/{i}".encode()
                mine.append((candidate_id, plaintext, vault.seal(SCOPE, candidate_id, plaintext)))
                assert vault.open(SCOPE, candidate_id, mine[-1][2]) == plaintext
            sealed[n] = mine
        except BaseException as exc:
            errors.append(exc)

    run_in_threads(worker, 8)

    assert errors == []
    everything = [item for n in range(8) for item in sealed[n]]
    assert len({blob.key_ref for _, _, blob in everything}) == 80
    for candidate_id, plaintext, blob in everything:
        assert vault.open(SCOPE, candidate_id, blob) == plaintext


def test_the_master_key_file_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "fresh" / "nested" / "master.key"

    key = load_or_create_master_key(path)

    assert len(key) == 32
    assert path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["master.key"]


def test_the_master_key_is_reused_on_later_calls(tmp_path: Path) -> None:
    path = tmp_path / "master.key"

    first = load_or_create_master_key(path)
    second = load_or_create_master_key(path)

    assert first == second
    assert load_or_create_master_key(tmp_path / "other.key") != first


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_a_master_key_file_of_the_wrong_size_is_refused(tmp_path: Path, size: int) -> None:
    path = tmp_path / "master.key"
    path.write_bytes(b"k" * size)

    with pytest.raises(ValueError, match="32 bytes"):
        load_or_create_master_key(path)
    assert path.read_bytes() == b"k" * size


def test_concurrent_master_key_creation_yields_one_key(tmp_path: Path) -> None:
    path = tmp_path / "race" / "master.key"
    barrier = threading.Barrier(8)
    keys: list[bytes] = []

    def worker() -> None:
        barrier.wait()
        keys.append(load_or_create_master_key(path))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(keys) == 8
    assert len(set(keys)) == 1
    assert [p.name for p in path.parent.iterdir()] == ["master.key"]


def test_a_records_key_is_written_with_its_candidates_key_not_at_admission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The write path pays no key-file commit of its own for sealed bodies: the record's key goes
    # into the key file in the capture's one commit, and admission only reads it.
    from engram_memory.adapters.local.record_keys import LocalRecordKeys

    from engram_testing import context, embedded_harness

    harness = embedded_harness(tmp_path)
    try:
        captured = harness.capture("The build cache lives on the lark-spindle volume.")
        candidate = harness.store.candidate_get(context().scope, captured["candidate_id"])
        assert harness.record_keys.key_exists(context().scope, candidate.record_id)

        def no_write(*_: object) -> None:
            raise AssertionError("admission wrote a record key")

        monkeypatch.setattr(LocalRecordKeys, "_write", no_write)
        outcome = harness.admit(captured["candidate_id"])["outcome"]
        assert outcome["status"] == "accepted" and outcome["record_id"] == candidate.record_id
    finally:
        harness.close()

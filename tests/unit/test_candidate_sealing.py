"""The candidate message (``adapters/sealing.py``): the ESDK's raw AES master key, interoperable
both ways with the MPL raw AES keyring that sealed candidates before, and the checks on opening."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import aws_encryption_sdk
import pytest
from aws_cryptographic_material_providers.mpl import AwsCryptographicMaterialProviders
from aws_encryption_sdk import Algorithm
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engram_memory.adapters import sealing
from engram_memory.adapters.local.vault import (
    LocalVault,
    _wrap_aad,
    load_or_create_master_key,
)
from engram_memory.adapters.sealing import KEY_NAMESPACE
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SealedBlob, SealIntegrityError

from engram_testing import esdk, raw_aes_keyring

SCOPE = Scope("tenant-a", "workspace-1")
CANDIDATE = "cand_1"
SECRET = b"the launch code is swordfish-7731"
CONTEXT = sealing.encryption_context(SCOPE, CANDIDATE)


@pytest.fixture
def master_key(tmp_path: Path) -> bytes:
    return load_or_create_master_key(tmp_path / "secrets" / "master.key")


@pytest.fixture
def vault(tmp_path: Path, master_key: bytes) -> Iterator[LocalVault]:
    local = LocalVault(tmp_path / "keys" / "candidate-keys.db", master_key)
    yield local
    local.close()


def _data_key(vault: LocalVault, master_key: bytes, key_ref: str) -> bytes:
    """The data key the vault holds for ``key_ref`` (what the key file and master key give)."""
    row = vault._run(
        "test",
        lambda conn: conn.execute(
            "SELECT nonce, wrapped FROM data_keys WHERE key_ref = ?", (key_ref,)
        ).fetchone(),
    )
    nonce, wrapped = row
    return AESGCM(master_key).decrypt(nonce, wrapped, _wrap_aad(key_ref, SCOPE, CANDIDATE))


def _keyring_message(
    key_ref: str,
    data_key: bytes,
    plaintext: bytes = SECRET,
    context: dict[str, str] = CONTEXT,
    algorithm: Algorithm = Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY,
) -> bytes:
    """A candidate message as the vault wrote it before: through the MPL raw AES keyring."""
    ciphertext, _ = esdk().encrypt(
        source=plaintext,
        keyring=raw_aes_keyring(KEY_NAMESPACE, key_ref, data_key),
        encryption_context=context,
        algorithm=algorithm,
    )
    assert isinstance(ciphertext, bytes)
    return ciphertext


def test_a_candidate_sealed_with_the_keyring_before_still_opens(
    vault: LocalVault, master_key: bytes
) -> None:
    key_ref = vault.seal(SCOPE, CANDIDATE, b"placeholder").key_ref
    old = _keyring_message(key_ref, _data_key(vault, master_key, key_ref))

    assert vault.open(SCOPE, CANDIDATE, SealedBlob(key_ref, old)) == SECRET


def test_a_candidate_sealed_now_opens_with_the_keyring(
    vault: LocalVault, master_key: bytes
) -> None:
    blob = vault.seal(SCOPE, CANDIDATE, SECRET)
    decryptor = esdk().stream(
        mode="decrypt-unsigned",
        source=io.BytesIO(blob.ciphertext),
        keyring=raw_aes_keyring(
            KEY_NAMESPACE, blob.key_ref, _data_key(vault, master_key, blob.key_ref)
        ),
        encryption_context=CONTEXT,
    )

    assert decryptor.read() == SECRET
    assert decryptor.header.encryption_context == CONTEXT
    assert decryptor.header.algorithm == Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY


def test_sealing_and_opening_need_no_material_providers_keyring(
    vault: LocalVault, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the candidate message went through the MPL keyring")

    monkeypatch.setattr(AwsCryptographicMaterialProviders, "create_raw_aes_keyring", refuse)
    blob = vault.seal(SCOPE, CANDIDATE, SECRET)

    assert vault.open(SCOPE, CANDIDATE, blob) == SECRET


@pytest.mark.parametrize(
    "algorithm",
    [
        Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY_ECDSA_P384,  # signed
        Algorithm.AES_256_GCM_IV12_TAG16_HKDF_SHA384_ECDSA_P384,  # signed, not committing
        Algorithm.AES_256_GCM_IV12_TAG16_HKDF_SHA256,  # not committing
    ],
    ids=["signing", "signing-uncommitted", "uncommitted"],
)
def test_a_message_of_another_suite_fails_integrity(
    vault: LocalVault, master_key: bytes, algorithm: Algorithm
) -> None:
    key_ref = vault.seal(SCOPE, CANDIDATE, b"placeholder").key_ref
    data_key = _data_key(vault, master_key, key_ref)
    permissive = aws_encryption_sdk.EncryptionSDKClient(
        commitment_policy=aws_encryption_sdk.CommitmentPolicy.FORBID_ENCRYPT_ALLOW_DECRYPT
        if algorithm.is_committing() is False
        else aws_encryption_sdk.CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT
    )
    message, _ = permissive.encrypt(
        source=SECRET,
        key_provider=sealing.candidate_key(key_ref, data_key),
        encryption_context=CONTEXT,
        algorithm=algorithm,
    )

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, CANDIDATE, SealedBlob(key_ref, message))


@pytest.mark.parametrize(
    "context",
    [
        {**CONTEXT, "engram:extra": "x"},
        {**CONTEXT, "engram:candidate": "cand_2"},
        {k: v for k, v in CONTEXT.items() if k != "engram:workspace"},
    ],
    ids=["extra-pair", "other-candidate", "missing-pair"],
)
def test_a_message_with_another_encryption_context_fails_integrity(
    vault: LocalVault, master_key: bytes, context: dict[str, str]
) -> None:
    key_ref = vault.seal(SCOPE, CANDIDATE, b"placeholder").key_ref
    message = _keyring_message(key_ref, _data_key(vault, master_key, key_ref), context=context)

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, CANDIDATE, SealedBlob(key_ref, message))


def test_decrypt_message_checks_the_required_pairs_for_a_master_key_too() -> None:
    data_key = bytes(range(32))
    message = sealing.seal_candidate(esdk(), "key_x", data_key, SECRET, CONTEXT)
    other = {**CONTEXT, "engram:tenant": "tenant-b"}

    with pytest.raises(SealIntegrityError):
        sealing.decrypt_message(esdk(), sealing.candidate_key("key_x", data_key), message, other)
    with pytest.raises(SealIntegrityError):
        sealing.decrypt_message(
            esdk(), raw_aes_keyring(KEY_NAMESPACE, "key_x", data_key), message, other
        )
    plaintext, context, _ = sealing.decrypt_message(
        esdk(), sealing.candidate_key("key_x", data_key), message, CONTEXT
    )
    assert (plaintext, context) == (SECRET, CONTEXT)


def test_a_message_under_another_key_name_fails_integrity() -> None:
    data_key = bytes(range(32))
    message = sealing.seal_candidate(esdk(), "key_x", data_key, SECRET, CONTEXT)

    with pytest.raises(SealIntegrityError):
        sealing.open_candidate(esdk(), "key_y", data_key, message, CONTEXT)
    with pytest.raises(SealIntegrityError):
        sealing.open_candidate(esdk(), "key_x", bytes(32), message, CONTEXT)

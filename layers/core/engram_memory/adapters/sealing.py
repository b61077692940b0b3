"""What both vaults share about a sealed candidate: the ESDK message format and how to open it.

The embedded vault and the KMS vault differ only in how the per-candidate data key is kept; the
sealed message itself (the data key as a raw AES wrapping key, committing suite without
signatures, an encryption context binding tenant, workspace and candidate) is the same, and so
are the checks made when opening it.

The candidate's message is made and opened with the ESDK's own raw AES master key
(``RawMasterKey``) rather than the Material Providers Library's raw AES keyring: the two write
the same message (same encrypted-data-key layout: namespace, key name, tag and IV lengths, IV;
same wrapping AAD, the serialized encryption context), so either opens the other's messages, but
the keyring goes through the MPL's generated (Dafny) code at ~1.3-3.9 ms per message where the
master key costs ~0.15-0.5 ms. Messages sealed with the keyring before still open
(``tests/unit/test_local_vault.py``). The MPL stays for the KMS keyring that wraps data keys in
the cloud.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Final

from aws_encryption_sdk import Algorithm
from aws_encryption_sdk.identifiers import EncryptionKeyType, WrappingAlgorithm
from aws_encryption_sdk.internal.crypto.wrapping_keys import WrappingKey
from aws_encryption_sdk.key_providers.base import MasterKeyProvider
from aws_encryption_sdk.key_providers.raw import RawMasterKey

from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SealedBlob, SealIntegrityError, VaultUnavailable

KEY_NAMESPACE: Final = "engram-memory/candidate"
"""Raw AES keyring namespace of every candidate data key (the key name is the ``key_ref``)."""


def encryption_context(scope: Scope, candidate_id: str) -> dict[str, str]:
    return {
        "engram:tenant": scope.tenant_id,
        "engram:workspace": scope.workspace_id,
        "engram:candidate": candidate_id,
    }


CANDIDATE_ALGORITHM: Final = Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY
"""The candidate message's suite: key commitment, no signature (the vault is the only writer)."""


def candidate_key(key_ref: str, data_key: bytes) -> RawMasterKey:
    """The candidate's data key as the raw AES wrapping key named ``key_ref`` in the namespace."""
    return RawMasterKey(
        provider_id=KEY_NAMESPACE,
        key_id=key_ref.encode("utf-8"),
        wrapping_key=WrappingKey(
            wrapping_algorithm=WrappingAlgorithm.AES_256_GCM_IV12_TAG16_NO_PADDING,
            wrapping_key=data_key,
            wrapping_key_type=EncryptionKeyType.SYMMETRIC,
        ),
    )


def seal_candidate(
    esdk: Any, key_ref: str, data_key: bytes, plaintext: bytes, context: Mapping[str, str]
) -> bytes:
    """The ESDK message of ``plaintext`` under the candidate's data key; the SDK's exceptions
    propagate (each vault maps them to ``VaultUnavailable``)."""
    ciphertext, _header = esdk.encrypt(
        source=plaintext,
        key_provider=candidate_key(key_ref, data_key),
        encryption_context=dict(context),
        algorithm=CANDIDATE_ALGORITHM,
    )
    if not isinstance(ciphertext, bytes):
        raise TypeError("the Encryption SDK returned no message")
    return ciphertext


def open_candidate(
    esdk: Any, key_ref: str, data_key: bytes, ciphertext: bytes, expected: Mapping[str, str]
) -> bytes:
    """The plaintext of a candidate message sealed for exactly ``expected`` under the candidate
    suite, or ``SealIntegrityError``."""
    plaintext, context, algorithm = decrypt_message(
        esdk, candidate_key(key_ref, data_key), ciphertext, expected
    )
    if dict(context) != dict(expected) or algorithm != CANDIDATE_ALGORITHM:
        raise SealIntegrityError("sealed blob does not belong to this candidate")
    return plaintext


def seal_sealed_blob(
    esdk: Any,
    vault: str,
    scope: Scope,
    candidate_id: str,
    key_ref: str,
    data_key: bytes,
    plaintext: bytes,
) -> SealedBlob:
    """``plaintext`` sealed for the candidate under its data key; any failure of the SDK is the
    ``vault`` (its name, for the message) being unable to seal right now."""
    try:
        ciphertext = seal_candidate(
            esdk, key_ref, data_key, plaintext, encryption_context(scope, candidate_id)
        )
    except Exception as exc:
        raise VaultUnavailable(f"the {vault} vault could not encrypt the candidate") from exc
    return SealedBlob(key_ref=key_ref, ciphertext=ciphertext)


def open_sealed_blob(
    esdk: Any, scope: Scope, candidate_id: str, blob: SealedBlob, data_key: bytes
) -> bytes:
    """The plaintext of ``blob``, which must have been sealed for exactly this candidate."""
    return open_candidate(
        esdk, blob.key_ref, data_key, blob.ciphertext, encryption_context(scope, candidate_id)
    )


def decrypt_message(
    esdk: Any, materials: Any, ciphertext: bytes, expected: Mapping[str, str]
) -> tuple[bytes, Mapping[str, str], Any]:
    """Plaintext, encryption context and algorithm of an ESDK message, or ``SealIntegrityError``.

    ``materials`` is an MPL keyring or an ESDK master key provider; either way every pair of
    ``expected`` must be in the message's encryption context."""
    # The streaming decryptor is driven by hand rather than through ``client.decrypt``: the
    # latter's ``with`` block logs an ERROR traceback ("Error on closing") for every failed
    # decrypt. "decrypt-unsigned" additionally refuses messages using a signing suite.
    source = io.BytesIO(ciphertext)
    decryptor: Any = None
    # The SDK checks a required encryption context only for MPL keyrings; for a master key
    # provider the pairs are checked below, after the message authenticated.
    if isinstance(materials, MasterKeyProvider):
        given: dict[str, Any] = {"key_provider": materials}
    else:
        given = {"keyring": materials, "encryption_context": dict(expected)}
    try:
        decryptor = esdk.stream(mode="decrypt-unsigned", source=source, **given)
        plaintext = decryptor.read()
        header = decryptor.header
        decryptor.close()
        context = header.encryption_context
        algorithm = header.algorithm
    # The message is untrusted input and the SDK raises an open-ended set of types for malformed
    # messages (its own errors, InvalidTag, struct and Unicode errors, MPL errors).
    except Exception as exc:
        if decryptor is not None:
            # Mark the half-read stream closed without the footer check, so its finalizer does
            # not raise again.
            io.IOBase.close(decryptor)
        raise SealIntegrityError("sealed message failed authentication") from exc
    # The SDK stops at the end of the message; trailing bytes mean the message was altered.
    if source.read(1) or not isinstance(plaintext, bytes) or not isinstance(context, dict):
        raise SealIntegrityError("sealed message failed authentication")
    if any(context.get(name) != value for name, value in expected.items()):
        raise SealIntegrityError("sealed message belongs to another encryption context")
    return plaintext, context, algorithm

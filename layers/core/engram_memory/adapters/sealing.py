"""What both vaults share about a sealed candidate: the ESDK message format and how to open it.

The embedded vault and the KMS vault differ only in how the per-candidate data key is kept; the
sealed message itself (raw AES keyring under the data key, committing suite without signatures,
an encryption context binding tenant, workspace and candidate) is the same, and so are the
checks made when opening it.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, Final

from ..engine.context import Scope
from ..engine.ports import SealIntegrityError

KEY_NAMESPACE: Final = "engram-memory/candidate"
"""Raw AES keyring namespace of every candidate data key (the key name is the ``key_ref``)."""


def encryption_context(scope: Scope, candidate_id: str) -> dict[str, str]:
    return {
        "engram:tenant": scope.tenant_id,
        "engram:workspace": scope.workspace_id,
        "engram:candidate": candidate_id,
    }


def decrypt_message(
    esdk: Any, keyring: Any, ciphertext: bytes, expected: Mapping[str, str]
) -> tuple[bytes, Mapping[str, str], Any]:
    """Plaintext, encryption context and algorithm of an ESDK message, or ``SealIntegrityError``."""
    # The streaming decryptor is driven by hand rather than through ``client.decrypt``: the
    # latter's ``with`` block logs an ERROR traceback ("Error on closing") for every failed
    # decrypt. "decrypt-unsigned" additionally refuses messages using a signing suite.
    source = io.BytesIO(ciphertext)
    decryptor: Any = None
    try:
        decryptor = esdk.stream(
            mode="decrypt-unsigned",
            source=source,
            keyring=keyring,
            encryption_context=dict(expected),
        )
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
    return plaintext, context, algorithm

"""The cloud ``RecordKeys``: per-record keys in the key table, under per-scope KMS data keys.

Two kinds of item share the key table with the candidate keys (it has no point-in-time
recovery and is never backed up)::

    {key_ref: "scopekey:<hash of tenant, workspace>", wrapped: <KMS ciphertext of the scope key>}
    {key_ref: "record:<hash of tenant, workspace, record id>", wrapped: <record key under it>}

A scope key is a KMS data key (``GenerateDataKey``) made once per scope, its ciphertext bound to
the encryption context ``{engram:tenant, engram:workspace, engram:key-class: record-scope}``; a
function decrypts it with KMS once per scope and keeps it (``ScopeKeys``). A record key is a
random AES-256 key wrapped under its scope key with AES-GCM; a body is sealed under it with
AES-GCM (``record_sealing``). A read is one ``BatchGetItem`` of the page's record keys and AES-GCM
in memory: no KMS call and no Encryption SDK message per record.

The key class keeps permissions apart: a role may decrypt scope keys (the ``engram:key-class``
condition) and read ``record:``/``scopekey:`` items without any permission to unwrap a candidate
key (those are Encryption SDK messages under another context, ``kms_vault``). Forget deletes the
record's item: the body, in the table, a backup or an export, can never be opened again.

Errors: throttled, failing or unreachable services raise ``VaultUnavailable``; KMS refusing a
scope key or an item failing authentication raise ``SealIntegrityError``. Nothing is logged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, TypeVar

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from engram_memory.adapters.aws.kms_vault import KeyTableClients, is_transient_kms_error
from engram_memory.adapters.record_sealing import KEY_BYTES, ScopeKeys
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SealIntegrityError, VaultUnavailable

__all__ = ["KEY_CLASS", "RECORD_ITEM_PREFIX", "SCOPE_ITEM_PREFIX", "KmsRecordKeys"]

KEY_CLASS: Final = "record-scope"
RECORD_ITEM_PREFIX: Final = "record:"
SCOPE_ITEM_PREFIX: Final = "scopekey:"
_BATCH: Final = 100  # BatchGetItem's ceiling
_CLIENT_CONFIG: Final = Config(
    connect_timeout=2, read_timeout=5, retries={"mode": "standard", "max_attempts": 3}
)
_T = TypeVar("_T")


def scope_key_context(scope: Scope) -> dict[str, str]:
    """The KMS encryption context of a scope key (the IAM policies condition on its key class)."""
    return {
        "engram:tenant": scope.tenant_id,
        "engram:workspace": scope.workspace_id,
        "engram:key-class": KEY_CLASS,
    }


def _hashed(*fields: str) -> str:
    return hashlib.sha256("\x00".join(fields).encode("utf-8")).hexdigest()


def record_item_key(scope: Scope, record_id: str) -> str:
    return RECORD_ITEM_PREFIX + _hashed(scope.tenant_id, scope.workspace_id, record_id)


def scope_item_key(scope: Scope) -> str:
    return SCOPE_ITEM_PREFIX + _hashed(scope.tenant_id, scope.workspace_id)


class KmsRecordKeys(KeyTableClients):
    """``RecordKeys`` over the key table and a KMS key (its ARN ``kms_key_id``). Clients may be
    injected; otherwise made from ``session`` on first use. Safe to share between threads."""

    _client_config: ClassVar[Config] = _CLIENT_CONFIG
    _no_client: ClassVar[str] = "could not create a {} client"
    _key_table: ClassVar[str] = "the key table"

    def _set_up(self) -> None:
        self._scope_keys = ScopeKeys(self._load_scope_key)

    # -- RecordKeys ----------------------------------------------------------------------------

    def prepare(self, scope: Scope, record_id: str) -> None:
        """Nothing ahead of admission: the capture function holds no permission on scope keys."""

    def seal(self, scope: Scope, record_id: str, plaintext: bytes) -> bytes:
        # No key is made ahead (``prepare``), so one conditional write is the usual path; a key
        # already there (a retried admission, another instance) is read and used instead.
        _, wrapped = self._scope_keys.new_record_key(scope, record_id)
        if not self._put_new_key("write key", record_item_key(scope, record_id), wrapped):
            wrapped = self._wrapped(scope, [record_id])[record_id]
        return self._scope_keys.seal_body(scope, record_id, wrapped, plaintext)

    def open_many(self, scope: Scope, sealed: Mapping[str, bytes]) -> dict[str, bytes]:
        return self._scope_keys.open_bodies(scope, self._wrapped(scope, list(sealed)), sealed)

    def destroy(self, scope: Scope, record_id: str) -> None:
        key = record_item_key(scope, record_id)
        self._dynamodb(
            "destroy",
            lambda client: client.delete_item(TableName=self._table, Key={"key_ref": {"S": key}}),
        )

    def key_exists(self, scope: Scope, record_id: str) -> bool:
        return record_id in self._wrapped(scope, [record_id])

    # -- the key table -------------------------------------------------------------------------

    def _wrapped(self, scope: Scope, record_ids: list[str]) -> dict[str, bytes]:
        """The stored wrapped keys of ``record_ids`` (strongly consistent; absent ones left out)."""
        by_item = {record_item_key(scope, record_id): record_id for record_id in record_ids}
        names = list(by_item)
        found: dict[str, bytes] = {}
        for start in range(0, len(names), _BATCH):
            pending: dict[str, Any] = {
                self._table: {
                    "Keys": [{"key_ref": {"S": name}} for name in names[start : start + _BATCH]],
                    "ConsistentRead": True,
                }
            }
            while pending:
                response = self._batch_get(pending)
                for item in response.get("Responses", {}).get(self._table, []):
                    found[by_item[item["key_ref"]["S"]]] = _wrapped_bytes(item)
                pending = response.get("UnprocessedKeys") or {}
        return found

    def _batch_get(self, request: dict[str, Any]) -> Any:
        return self._dynamodb(
            "read record keys", lambda client: client.batch_get_item(RequestItems=request)
        )

    def _load_scope_key(self, scope: Scope) -> bytes:
        """The scope's key from KMS: decrypted from its item, or made (and stored) first."""
        key_ref = scope_item_key(scope)
        context = scope_key_context(scope)
        response = self._dynamodb(
            "read scope key",
            lambda client: client.get_item(
                TableName=self._table, Key={"key_ref": {"S": key_ref}}, ConsistentRead=True
            ),
        )
        item = response.get("Item")
        if item is None:
            made = self._kms(
                lambda kms: kms.generate_data_key(
                    KeyId=self._kms_key_id, KeySpec="AES_256", EncryptionContext=context
                )
            )
            if self._put_new_key("write key", key_ref, bytes(made["CiphertextBlob"])):
                return bytes(made["Plaintext"])
            return self._load_scope_key(scope)  # another instance made it first
        decrypted = self._kms(
            lambda kms: kms.decrypt(
                CiphertextBlob=_wrapped_bytes(item),
                EncryptionContext=context,
                KeyId=self._kms_key_id,
            )
        )
        scope_key = bytes(decrypted["Plaintext"])
        if len(scope_key) != KEY_BYTES:
            raise SealIntegrityError("the scope key is malformed")
        return scope_key

    # -- clients -------------------------------------------------------------------------------

    def _kms(self, operation: Callable[[Any], _T]) -> _T:
        client = self._client("kms")
        try:
            return operation(client)
        except (ClientError, BotoCoreError) as exc:
            if is_transient_kms_error(exc):
                raise VaultUnavailable("KMS could not answer for a scope key") from exc
            raise SealIntegrityError("KMS refused the scope key") from exc


def _wrapped_bytes(item: Mapping[str, Any]) -> bytes:
    wrapped = item.get("wrapped", {}).get("B")
    if not isinstance(wrapped, bytes):
        raise SealIntegrityError("a key item is malformed")
    return wrapped

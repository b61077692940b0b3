"""The cloud vault: per-candidate data keys wrapped by AWS KMS in a DynamoDB key table.

Each sealed candidate gets its own random 256-bit data key, exactly as in the embedded vault: the
payload is encrypted with the AWS Encryption SDK with that data key as its raw AES wrapping key
(``sealing.py``; committing algorithm suite without signatures; an encryption context binding tenant, workspace
and candidate). The data key itself is encrypted with the AWS Encryption SDK under an AWS KMS
keyring (the tenant's KMS key; an encryption context binding tenant, workspace, candidate and
``key_ref``) and the resulting message is stored as one item of the **key table**::

    {key_ref (S, partition key), wrapped (B), created_at_ms (N)}

The key table has no point-in-time recovery and is never backed up, so ``DeleteItem`` on a key
crypto-shreds its blob for good: the ciphertext, wherever a copy of it lives, can never be opened
again. Sealing needs only ``kms:GenerateDataKey`` (and ``dynamodb:PutItem``); opening needs
``kms:Decrypt`` (and ``dynamodb:GetItem``), so the capture function's role may encrypt but never
decrypt.

Error translation: a throttled, failing (5xx) or unreachable service, or a timeout, raises
``VaultUnavailable``; a missing key item on open raises ``KeyDestroyed``; KMS refusing to decrypt
(wrong encryption context, invalid ciphertext, access denied) and any authentication failure of
the Encryption SDK raise ``SealIntegrityError``. Exception messages never carry plaintext, key
bytes or ciphertext, and the vault logs nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar

import aws_encryption_sdk
import boto3
from aws_cryptographic_material_providers.mpl import AwsCryptographicMaterialProviders
from aws_cryptographic_material_providers.mpl.config import MaterialProvidersConfig
from aws_cryptographic_material_providers.mpl.models import CreateAwsKmsKeyringInput
from aws_encryption_sdk import CommitmentPolicy
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from engram_memory.adapters.aws.calls import CONDITION_FAILED, error_code
from engram_memory.adapters.aws.client_config import client_config
from engram_memory.adapters.sealing import (
    CANDIDATE_ALGORITHM,
    KEY_NAMESPACE,
    decrypt_message,
    encryption_context,
    open_sealed_blob,
    seal_sealed_blob,
)
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    KeyDestroyed,
    SealedBlob,
    SealIntegrityError,
    VaultUnavailable,
)

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_kms.client import KMSClient

__all__ = ["KEY_NAMESPACE", "KmsVault", "create_key_table"]


_KEY_BYTES: Final = 32
_ALGORITHM: Final = CANDIDATE_ALGORITHM  # the wrapped data key's message too
_KEY_ARN: Final = re.compile(r"arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+")

# Error codes that mean "the service is busy or broken right now", whatever the HTTP status.
_TRANSIENT_CODES: Final = frozenset(
    {
        "ThrottlingException",
        "Throttling",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "LimitExceededException",
        "TransactionInProgressException",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "KMSInternalException",
        "DependencyTimeoutException",
        "KeyUnavailableException",
        # The tenant's KMS key is disabled or pending deletion: an operator state, not a
        # property of this blob, so the vault is unavailable rather than the blob corrupt.
        "DisabledException",
        "KMSInvalidStateException",
    }
)

# Bounded network behaviour for the clients the vault creates itself (not for injected ones):
# the stack's one policy.
_CLIENT_CONFIG: Final = client_config()

_T = TypeVar("_T")


class KeyTableClients:
    """The KMS and key-table (DynamoDB) clients of a key store under the KMS key ``kms_key_id``:
    injected, or made from ``session`` (or a default boto3 session) on first use, under one
    lock. Nothing opens a client at import or construction time. Both key stores reach their
    key table through ``_dynamodb`` and write a key item only where none is (``_put_new_key``)."""

    _client_config: ClassVar[Config] = _CLIENT_CONFIG
    _no_client: ClassVar[str] = "the KMS vault could not create a {} client"
    _key_table: ClassVar[str] = "the KMS vault key table"  # what a failure message names

    def __init__(
        self,
        *,
        kms_key_id: str,
        key_table: str,
        kms_client: KMSClient | None = None,
        dynamodb_client: DynamoDBClient | None = None,
        session: boto3.session.Session | None = None,
    ) -> None:
        self._check_key_id(kms_key_id)
        if not key_table:
            raise ValueError("key_table must name the DynamoDB key table")
        self._kms_key_id = kms_key_id
        self._table = key_table
        self._session = session
        self._lock = threading.Lock()
        self._kms_client: Any = kms_client
        self._dynamodb_client: Any = dynamodb_client
        self._set_up()

    @staticmethod
    def _check_key_id(kms_key_id: str) -> None:
        """Refuse (``ValueError``) a key id this store cannot work with."""

    def _set_up(self) -> None:
        """The store's own state, made once the clients' is."""

    def _client_locked(self, service: str) -> Any:
        """The ``kms`` or ``dynamodb`` client, made now if needed; the caller holds the lock."""
        attribute = f"_{service}_client"
        client = getattr(self, attribute)
        if client is None:
            try:
                session = self._session if self._session is not None else boto3.session.Session()
                client = session.client(service, config=self._client_config)  # type: ignore[call-overload]
            except (BotoCoreError, ValueError) as exc:
                raise VaultUnavailable(self._no_client.format(service)) from exc
            setattr(self, attribute, client)
        return client

    def _client(self, service: str) -> Any:
        with self._lock:
            return self._client_locked(service)

    def _dynamodb(self, action: str, operation: Callable[[Any], _T]) -> _T:
        """``operation`` on the key table. Every failure is transient from the store's point of
        view (``VaultUnavailable``): there is no integrity question to answer until an item has
        been read."""
        client = self._client("dynamodb")
        try:
            return operation(client)
        except (ClientError, BotoCoreError) as exc:
            raise VaultUnavailable(f"{self._key_table} failed during {action}") from exc

    def _put_new_key(self, action: str, key_ref: str, wrapped: bytes, **attributes: Any) -> bool:
        """Write the key item ``key_ref``; False when one is already there (a slot another
        attempt took, a key a retried admission made)."""
        item = {"key_ref": {"S": key_ref}, "wrapped": {"B": wrapped}, **attributes}
        try:
            self._dynamodb(
                action,
                lambda client: client.put_item(
                    TableName=self._table,
                    Item=item,
                    ConditionExpression="attribute_not_exists(key_ref)",
                ),
            )
        except VaultUnavailable as exc:
            if error_code(exc.__cause__) == CONDITION_FAILED:
                return False
            raise
        return True


class KmsVault(KeyTableClients):
    """A ``Vault`` whose per-candidate data keys are KMS-wrapped items of a DynamoDB key table.

    ``kms_key_id`` must be the **key ARN** of the tenant's symmetric KMS key (the KMS keyring
    cannot decrypt with a bare key id or an alias). ``key_table`` is the name of the key table
    (see ``create_key_table``). Clients may be injected; otherwise they are created from
    ``session`` (or a default boto3 session) on first use. Nothing opens a client at import or
    construction time. Safe to share between threads.
    """

    @staticmethod
    def _check_key_id(kms_key_id: str) -> None:
        if not _KEY_ARN.fullmatch(kms_key_id):
            raise ValueError("kms_key_id must be the ARN of a KMS key (arn:aws:kms:...:key/...)")

    def _set_up(self) -> None:
        self._kms_recorder: _RecordingKmsClient | None = None
        self._slots = _AttemptSlots()
        self._kms_keyring: Any = None
        self._materials = AwsCryptographicMaterialProviders(config=MaterialProvidersConfig())
        # One data key per message, so a message carrying more is malformed by construction.
        self._esdk = aws_encryption_sdk.EncryptionSDKClient(
            commitment_policy=CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT,
            max_encrypted_data_keys=1,
        )

    # ----------------------------------------------------------------------------------------
    # Vault port
    # ----------------------------------------------------------------------------------------

    def seal(self, scope: Scope, candidate_id: str, plaintext: bytes) -> SealedBlob:
        """Encrypt ``plaintext`` under a fresh data key bound to ``scope`` and ``candidate_id``.

        The key's name is the candidate's next free **attempt slot** (``attempt_key_ref``), taken
        with a conditional write: a call retried after an unknown outcome (in any instance)
        finds its first attempt's key and returns it as ``superseded``, for the capture to shred
        once its own candidate is committed, so no retry leaves a key item behind. Raises
        ``VaultUnavailable`` when the candidate cannot be sealed (KMS or DynamoDB refused or
        failed, or encryption failed); no key item is written unless everything else worked.
        """
        data_key = secrets.token_bytes(_KEY_BYTES)
        slot = self._slots.first(scope, candidate_id)
        while True:
            key_ref = attempt_key_ref(scope, candidate_id, slot)
            sealed = seal_sealed_blob(
                self._esdk, "KMS", scope, candidate_id, key_ref, data_key, plaintext
            )
            wrapped = self._wrap(data_key, _wrap_context(key_ref, scope, candidate_id))
            # The key item is written last so a failed seal leaves no orphan key behind.
            if self._put_key(key_ref, wrapped):
                break
            slot += 1
        self._slots.taken(scope, candidate_id, slot)
        earlier = tuple(attempt_key_ref(scope, candidate_id, n) for n in range(slot))
        return dataclasses.replace(sealed, superseded=earlier)

    def _put_key(self, key_ref: str, wrapped: bytes) -> bool:
        """Write the key item; False when the slot is taken (another attempt's key)."""
        created = {"N": str(time.time_ns() // 1_000_000)}
        return self._put_new_key("seal", key_ref, wrapped, created_at_ms=created)

    def open(self, scope: Scope, candidate_id: str, blob: SealedBlob) -> bytes:
        """Decrypt ``blob``, which must have been sealed for this ``scope`` and ``candidate_id``.

        Raises ``KeyDestroyed`` when its data key is gone, ``SealIntegrityError`` when the blob
        or the wrapped key fails authentication, belongs to another context, or KMS refuses to
        unwrap it, ``VaultUnavailable`` when KMS or DynamoDB cannot answer right now.
        """
        response = self._dynamodb(
            "open",
            lambda client: client.get_item(
                TableName=self._table,
                Key={"key_ref": {"S": blob.key_ref}},
                ConsistentRead=True,
            ),
        )
        item = response.get("Item")
        if not item:
            raise KeyDestroyed(f"data key {blob.key_ref} no longer exists")
        wrapped = item.get("wrapped", {}).get("B")
        if not isinstance(wrapped, bytes):
            raise SealIntegrityError(f"data key {blob.key_ref} is malformed")
        data_key = self._unwrap(wrapped, _wrap_context(blob.key_ref, scope, candidate_id))
        return open_sealed_blob(self._esdk, scope, candidate_id, blob, data_key)

    def destroy(self, key_ref: str) -> None:
        """Durably delete the data key; idempotent (destroying a missing key is not an error)."""
        self._dynamodb(
            "destroy",
            lambda client: client.delete_item(
                TableName=self._table, Key={"key_ref": {"S": key_ref}}
            ),
        )

    def key_exists(self, key_ref: str) -> bool:
        """Whether the data key ``key_ref`` is still held (a strongly consistent read)."""
        response = self._dynamodb(
            "key_exists",
            lambda client: client.get_item(
                TableName=self._table,
                Key={"key_ref": {"S": key_ref}},
                ConsistentRead=True,
                ProjectionExpression="key_ref",
            ),
        )
        return bool(response.get("Item"))

    # ----------------------------------------------------------------------------------------
    # Data key wrapping (AWS Encryption SDK, AWS KMS keyring)
    # ----------------------------------------------------------------------------------------

    def _wrap(self, data_key: bytes, context: dict[str, str]) -> bytes:
        keyring, recorder = self._kms()
        recorder.reset()
        try:
            wrapped, _header = self._esdk.encrypt(
                source=data_key,
                keyring=keyring,
                encryption_context=context,
                algorithm=_ALGORITHM,
            )
        except Exception as exc:
            cause = recorder.last_error() or exc
            raise VaultUnavailable("the KMS vault could not wrap the data key") from cause
        if not isinstance(wrapped, bytes):
            raise VaultUnavailable("the KMS vault could not wrap the data key")
        return wrapped

    def _unwrap(self, wrapped: bytes, context: dict[str, str]) -> bytes:
        keyring, recorder = self._kms()
        recorder.reset()
        try:
            data_key, found, algorithm = decrypt_message(self._esdk, keyring, wrapped, context)
        except SealIntegrityError:
            kms_error = recorder.last_error()
            if kms_error is not None and is_transient_kms_error(kms_error):
                raise VaultUnavailable("KMS could not unwrap the data key right now") from kms_error
            if kms_error is not None:
                raise SealIntegrityError("KMS refused to unwrap the data key") from kms_error
            raise
        if dict(found) != context or algorithm != _ALGORITHM or len(data_key) != _KEY_BYTES:
            raise SealIntegrityError("data key does not belong to this candidate")
        return data_key

    def _kms(self) -> tuple[Any, _RecordingKmsClient]:
        with self._lock:
            if self._kms_keyring is None or self._kms_recorder is None:
                recorder = _RecordingKmsClient(self._client_locked("kms"))
                try:
                    keyring = self._materials.create_aws_kms_keyring(
                        input=CreateAwsKmsKeyringInput(
                            kms_key_id=self._kms_key_id, kms_client=recorder
                        )
                    )
                except Exception as exc:
                    raise VaultUnavailable("the KMS keyring could not be created") from exc
                self._kms_recorder, self._kms_keyring = recorder, keyring
            return self._kms_keyring, self._kms_recorder

    # ----------------------------------------------------------------------------------------
    # Key table (DynamoDB)
    # ----------------------------------------------------------------------------------------


def create_key_table(dynamodb_client: DynamoDBClient, name: str) -> None:
    """Create the key table ``name`` (on-demand, partition key ``key_ref``) and wait for it.

    For tests and local set-ups; the deployed table comes from the SAM template. Point-in-time
    recovery stays off (its default): a restorable copy would undo crypto-shredding.
    """
    dynamodb_client.create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "key_ref", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "key_ref", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb_client.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


class _RecordingKmsClient:
    """Forwards to a boto3 KMS client and remembers, per thread, the last error it raised.

    The KMS keyring folds client errors into Encryption SDK exceptions; the recorded error tells
    a transient KMS failure (``VaultUnavailable``) from a refusal (``SealIntegrityError``).
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._local = threading.local()

    def reset(self) -> None:
        self._local.error = None

    def last_error(self) -> BaseException | None:
        error: BaseException | None = getattr(self._local, "error", None)
        return error

    def generate_data_key(self, **kwargs: Any) -> Any:
        return self._record(self._client.generate_data_key, kwargs)

    def decrypt(self, **kwargs: Any) -> Any:
        return self._record(self._client.decrypt, kwargs)

    def encrypt(self, **kwargs: Any) -> Any:
        return self._record(self._client.encrypt, kwargs)

    def __getattr__(self, name: str) -> Any:
        # ``meta`` (the keyring tags the user agent) and anything else the keyring may touch.
        return getattr(self._client, name)

    def _record(self, method: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
        try:
            return method(**kwargs)
        except Exception as exc:
            self._local.error = exc
            raise


def is_transient_kms_error(exc: BaseException) -> bool:
    """Whether a KMS client error means "try again later" rather than "refused"."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        metadata = exc.response.get("ResponseMetadata", {})
        status = metadata.get("HTTPStatusCode", 0)
        return error.get("Code", "") in _TRANSIENT_CODES or status >= 500
    # Connection, endpoint, timeout and credential failures; and anything the client raised that
    # is not a service answer at all. Only an explicit refusal by KMS is an integrity failure.
    return True


def attempt_key_ref(scope: Scope, candidate_id: str, slot: int) -> str:
    """The name of the data key of a candidate's ``slot``-th sealing (0 for the first)."""
    fields = (scope.tenant_id, scope.workspace_id, candidate_id, str(slot))
    return "key_" + hashlib.sha256("\x00".join(fields).encode()).hexdigest()[:32]


class _AttemptSlots:
    """The next attempt slot per candidate this instance sealed, so that the attempts of one
    call (a commit retried after the head moved) do not probe the slots it took already; a
    candidate this instance does not remember starts at slot 0. Bounded, oldest forgotten."""

    _LIMIT: ClassVar[int] = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[tuple[Scope, str], int] = {}

    def first(self, scope: Scope, candidate_id: str) -> int:
        with self._lock:
            return self._next.get((scope, candidate_id), 0)

    def taken(self, scope: Scope, candidate_id: str, slot: int) -> None:
        with self._lock:
            self._next.pop((scope, candidate_id), None)
            self._next[(scope, candidate_id)] = slot + 1
            if len(self._next) > self._LIMIT:
                del self._next[next(iter(self._next))]


def _wrap_context(key_ref: str, scope: Scope, candidate_id: str) -> dict[str, str]:
    return {**encryption_context(scope, candidate_id), "engram:key_ref": key_ref}

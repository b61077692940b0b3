"""The cloud vault: per-candidate data keys wrapped by KMS in a DynamoDB key table (on moto)."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aws_encryption_sdk
import boto3
import pytest
from aws_cryptographic_material_providers.mpl import AwsCryptographicMaterialProviders
from aws_cryptographic_material_providers.mpl.config import MaterialProvidersConfig
from aws_cryptographic_material_providers.mpl.models import (
    CreateAwsKmsKeyringInput,
)
from aws_encryption_sdk.internal.formatting.deserialize import deserialize_header
from aws_testing import client_error
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from botocore.stub import Stubber
from moto import mock_aws

from engram_memory.adapters.aws.kms_vault import KEY_NAMESPACE, KmsVault, create_key_table
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    KeyDestroyed,
    SealedBlob,
    SealIntegrityError,
    VaultUnavailable,
)

from engram_testing import decrypts_with, run_in_threads

REGION = "us-east-1"
TABLE = "engram-keys"
SCOPE = Scope("tenant-a", "workspace-1")
SECRET = b"the launch code is swordfish-7731"
COMMIT_KEY = aws_encryption_sdk.Algorithm.AES_256_GCM_HKDF_SHA512_COMMIT_KEY

_MATERIALS = AwsCryptographicMaterialProviders(config=MaterialProvidersConfig())
_ESDK = aws_encryption_sdk.EncryptionSDKClient(
    commitment_policy=aws_encryption_sdk.CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT
)


@dataclass(frozen=True)
class Aws:
    session: boto3.session.Session
    kms: Any
    dynamodb: Any
    key_arn: str


def _fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture(scope="module")
def session() -> Iterator[boto3.session.Session]:
    # One session for the module: building clients from a fresh session reloads the service
    # models every time, which would dominate the run time.
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_credentials(monkeypatch)
        yield boto3.session.Session(region_name=REGION)


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, session: boto3.session.Session) -> Iterator[Aws]:
    _fake_credentials(monkeypatch)
    with mock_aws():
        kms = session.client("kms")
        dynamodb = session.client("dynamodb")
        key_arn = kms.create_key(Description="tenant-a vault key")["KeyMetadata"]["Arn"]
        create_key_table(dynamodb, TABLE)
        yield Aws(session=session, kms=kms, dynamodb=dynamodb, key_arn=key_arn)


def _vault(aws: Aws, *, kms: Any = None, dynamodb: Any = None) -> KmsVault:
    return KmsVault(
        kms_key_id=aws.key_arn,
        key_table=TABLE,
        kms_client=kms if kms is not None else aws.kms,
        dynamodb_client=dynamodb if dynamodb is not None else aws.dynamodb,
    )


@pytest.fixture
def vault(aws: Aws) -> KmsVault:
    return _vault(aws)


# --------------------------------------------------------------------------------------------
# Helpers: what an attacker, or an auditor, can do with the key table and KMS
# --------------------------------------------------------------------------------------------


def _items(aws: Aws) -> dict[str, dict[str, Any]]:
    items = aws.dynamodb.scan(TableName=TABLE, ConsistentRead=True)["Items"]
    return {item["key_ref"]["S"]: item for item in items}


def _kms_keyring(aws: Aws) -> Any:
    return _MATERIALS.create_aws_kms_keyring(
        input=CreateAwsKmsKeyringInput(kms_key_id=aws.key_arn, kms_client=aws.kms)
    )


def _unwrap_through_kms(aws: Aws, wrapped: bytes) -> tuple[bytes, dict[str, str]]:
    """Decrypt a stored wrapped key with KMS, trusting whatever context its header claims."""
    decryptor = _ESDK.stream(mode="decrypt", source=io.BytesIO(wrapped), keyring=_kms_keyring(aws))
    data_key = decryptor.read()
    context = dict(decryptor.header.encryption_context)
    decryptor.close()
    return data_key, context


def _decrypts_with(wrapping_key: bytes, key_name: str, ciphertext: bytes) -> bool:
    """Whether someone holding ``wrapping_key`` could decrypt ``ciphertext`` with the ESDK."""
    return decrypts_with(KEY_NAMESPACE, wrapping_key, key_name, ciphertext, SECRET)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _assert_reveals_nothing(exc: BaseException, *secrets: bytes) -> None:
    for link in _chain(exc):
        text = f"{link!s} {link!r} {link.args!r}"
        for secret in secrets:
            assert repr(secret)[2:-1] not in text
            assert secret.hex() not in text
        assert "swordfish" not in text


class _FailingKms:
    """A KMS client that forwards to moto but fails the named operations, and counts calls."""

    def __init__(self, inner: Any, failures: dict[str, Callable[[str], Exception]]) -> None:
        self._inner = inner
        self._failures = failures
        self.calls: list[str] = []

    def _call(self, operation: str, kwargs: dict[str, Any]) -> Any:
        self.calls.append(operation)
        if operation in self._failures:
            raise self._failures[operation](operation)
        return getattr(self._inner, operation)(**kwargs)

    def generate_data_key(self, **kwargs: Any) -> Any:
        return self._call("generate_data_key", kwargs)

    def decrypt(self, **kwargs: Any) -> Any:
        return self._call("decrypt", kwargs)

    def encrypt(self, **kwargs: Any) -> Any:
        return self._call("encrypt", kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _client_error(code: str, status: int = 400) -> Callable[[str], Exception]:
    def make(operation: str) -> Exception:
        return client_error(code, status, operation, f"{code} (test)")

    return make


# --------------------------------------------------------------------------------------------
# Sealing and opening
# --------------------------------------------------------------------------------------------


def test_every_seal_uses_a_fresh_data_key(vault: KmsVault, aws: Aws) -> None:
    first = vault.seal(SCOPE, "cand_1", SECRET)
    second = vault.seal(SCOPE, "cand_1", SECRET)

    assert first.key_ref != second.key_ref
    assert first.ciphertext != second.ciphertext
    items = _items(aws)
    assert set(items) == {first.key_ref, second.key_ref}
    first_key, _ = _unwrap_through_kms(aws, items[first.key_ref]["wrapped"]["B"])
    second_key, _ = _unwrap_through_kms(aws, items[second.key_ref]["wrapped"]["B"])
    assert len(first_key) == len(second_key) == 32
    assert first_key != second_key


def test_the_ciphertext_and_the_key_item_hold_no_plaintext_or_key_bytes(
    vault: KmsVault, aws: Aws
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    assert SECRET not in blob.ciphertext
    assert b"swordfish" not in blob.ciphertext
    item = _items(aws)[blob.key_ref]
    assert set(item) == {"key_ref", "wrapped", "created_at_ms"}
    assert int(item["created_at_ms"]["N"]) > 1_600_000_000_000
    wrapped = item["wrapped"]["B"]
    data_key, _ = _unwrap_through_kms(aws, wrapped)
    assert data_key not in wrapped
    assert data_key not in blob.ciphertext


def test_the_blob_is_an_esdk_message_under_the_candidate_data_key(vault: KmsVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    header, _raw = deserialize_header(io.BytesIO(blob.ciphertext))
    assert header.algorithm == COMMIT_KEY
    assert dict(header.encryption_context) == {
        "engram:tenant": "tenant-a",
        "engram:workspace": "workspace-1",
        "engram:candidate": "cand_1",
    }
    (edk,) = header.encrypted_data_keys
    assert edk.key_provider.provider_id == KEY_NAMESPACE
    assert edk.key_provider.key_info.startswith(blob.key_ref.encode())


def test_the_wrapped_key_is_a_kms_esdk_message_bound_to_tenant_workspace_candidate_key_ref(
    vault: KmsVault, aws: Aws
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    wrapped = _items(aws)[blob.key_ref]["wrapped"]["B"]

    header, _raw = deserialize_header(io.BytesIO(wrapped))
    context = {
        "engram:tenant": "tenant-a",
        "engram:workspace": "workspace-1",
        "engram:candidate": "cand_1",
        "engram:key_ref": blob.key_ref,
    }
    assert header.algorithm == COMMIT_KEY
    assert dict(header.encryption_context) == context
    (edk,) = header.encrypted_data_keys
    assert edk.key_provider.provider_id == "aws-kms"
    assert edk.key_provider.key_info == aws.key_arn.encode()

    # KMS itself binds the context: the data key's KMS ciphertext opens only under it.
    kms_blob = edk.encrypted_data_key
    assert aws.kms.decrypt(CiphertextBlob=kms_blob, EncryptionContext=context)["Plaintext"]
    for name, other in [
        ("engram:tenant", "tenant-b"),
        ("engram:workspace", "workspace-2"),
        ("engram:candidate", "cand_2"),
        ("engram:key_ref", "key_" + "0" * 32),
    ]:
        with pytest.raises(ClientError) as refused:
            aws.kms.decrypt(CiphertextBlob=kms_blob, EncryptionContext={**context, name: other})
        assert refused.value.response["Error"]["Code"] == "InvalidCiphertextException"
    with pytest.raises(ClientError):
        aws.kms.decrypt(CiphertextBlob=kms_blob, EncryptionContext={})


def test_a_blob_presented_under_another_key_ref_fails_integrity(vault: KmsVault) -> None:
    first = vault.seal(SCOPE, "cand_1", SECRET)
    second = vault.seal(SCOPE, "cand_1", SECRET)

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", SealedBlob(second.key_ref, first.ciphertext))


def test_a_wrapped_key_moved_to_another_key_ref_fails_integrity(vault: KmsVault, aws: Aws) -> None:
    mine = vault.seal(SCOPE, "cand_1", SECRET)
    other = vault.seal(SCOPE, "cand_1", b"something else")
    items = _items(aws)
    # An attacker with write access to the key table copies another candidate's wrapped key.
    aws.dynamodb.put_item(
        TableName=TABLE,
        Item={**items[mine.key_ref], "wrapped": items[other.key_ref]["wrapped"]},
    )

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", mine)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda ct: ct[:-1] + bytes([ct[-1] ^ 1]),
        lambda ct: ct[:40] + bytes([ct[40] ^ 1]) + ct[41:],
        lambda ct: ct + b"\x00",
        lambda ct: ct[:-10],
        lambda ct: b"",
    ],
    ids=["last-byte", "header-byte", "trailing-byte", "truncated", "empty"],
)
def test_a_corrupted_ciphertext_fails_integrity(
    vault: KmsVault, corrupt: Callable[[bytes], bytes]
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", SealedBlob(blob.key_ref, corrupt(blob.ciphertext)))


@pytest.mark.parametrize(
    "wrapped",
    [{"B": b"not an esdk message"}, {"S": "text"}, None],
    ids=["garbage", "wrong-type", "missing"],
)
def test_a_malformed_key_item_fails_integrity(
    vault: KmsVault, aws: Aws, wrapped: dict[str, Any] | None
) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    item: dict[str, Any] = {"key_ref": {"S": blob.key_ref}, "created_at_ms": {"N": "1"}}
    if wrapped is not None:
        item["wrapped"] = wrapped
    aws.dynamodb.put_item(TableName=TABLE, Item=item)

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", blob)


def test_a_tampered_wrapped_key_fails_integrity(vault: KmsVault, aws: Aws) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    item = _items(aws)[blob.key_ref]
    wrapped = item["wrapped"]["B"]
    tampered = wrapped[:-1] + bytes([wrapped[-1] ^ 1])
    aws.dynamodb.put_item(TableName=TABLE, Item={**item, "wrapped": {"B": tampered}})

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", blob)


# --------------------------------------------------------------------------------------------
# Crypto-shredding
# --------------------------------------------------------------------------------------------


def test_a_destroyed_key_makes_the_blob_unopenable_by_the_vault(vault: KmsVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    vault.destroy(blob.key_ref)

    assert vault.key_exists(blob.key_ref) is False
    with pytest.raises(KeyDestroyed):
        vault.open(SCOPE, "cand_1", blob)


def test_no_key_material_still_held_decrypts_a_shredded_blob(vault: KmsVault, aws: Aws) -> None:
    shredded = vault.seal(SCOPE, "cand_1", SECRET)
    kept = [
        vault.seal(SCOPE, "cand_1", SECRET),
        vault.seal(SCOPE, "cand_2", SECRET),
        vault.seal(Scope("tenant-b", "workspace-9"), "cand_1", SECRET),
    ]
    # Before the shred, the holder of the key table plus KMS can read the blob...
    before = _items(aws)[shredded.key_ref]["wrapped"]["B"]
    data_key, _ = _unwrap_through_kms(aws, before)
    assert _decrypts_with(data_key, shredded.key_ref, shredded.ciphertext)

    vault.destroy(shredded.key_ref)

    # ...afterwards no remaining item, unwrapped through KMS, opens it under any key name.
    items = _items(aws)
    assert set(items) == {blob.key_ref for blob in kept}
    for key_ref, item in items.items():
        remaining_key, _ = _unwrap_through_kms(aws, item["wrapped"]["B"])
        for key_name in (shredded.key_ref, key_ref):
            assert not _decrypts_with(remaining_key, key_name, shredded.ciphertext)
    for blob in kept:
        assert _decrypts_with(
            _unwrap_through_kms(aws, items[blob.key_ref]["wrapped"]["B"])[0],
            blob.key_ref,
            blob.ciphertext,
        )


def test_destroy_is_idempotent(vault: KmsVault) -> None:
    blob = vault.seal(SCOPE, "cand_1", SECRET)

    vault.destroy(blob.key_ref)
    vault.destroy(blob.key_ref)
    vault.destroy("key_never_existed")

    assert vault.key_exists(blob.key_ref) is False


def test_key_exists_reports_only_keys_still_held(vault: KmsVault) -> None:
    kept = vault.seal(SCOPE, "cand_1", SECRET)
    gone = vault.seal(SCOPE, "cand_2", SECRET)

    vault.destroy(gone.key_ref)

    assert vault.key_exists(kept.key_ref) is True
    assert vault.key_exists(gone.key_ref) is False
    assert vault.key_exists("key_missing") is False


def test_create_key_table_makes_an_on_demand_table_without_point_in_time_recovery(
    aws: Aws,
) -> None:
    table = aws.dynamodb.describe_table(TableName=TABLE)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "key_ref", "KeyType": "HASH"}]
    assert table["AttributeDefinitions"] == [{"AttributeName": "key_ref", "AttributeType": "S"}]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    backups = aws.dynamodb.describe_continuous_backups(TableName=TABLE)
    recovery = backups["ContinuousBackupsDescription"]["PointInTimeRecoveryDescription"]
    assert recovery["PointInTimeRecoveryStatus"] == "DISABLED"


# --------------------------------------------------------------------------------------------
# Permissions and failures
# --------------------------------------------------------------------------------------------


def test_capture_needs_only_generate_data_key_and_cannot_open(aws: Aws) -> None:
    no_decrypt = _FailingKms(aws.kms, {"decrypt": _client_error("AccessDeniedException")})
    capture = _vault(aws, kms=no_decrypt)

    blob = capture.seal(SCOPE, "cand_1", SECRET)

    assert no_decrypt.calls == ["generate_data_key"]
    with pytest.raises(SealIntegrityError) as failure:
        capture.open(SCOPE, "cand_1", blob)
    assert no_decrypt.calls == ["generate_data_key", "decrypt"]
    _assert_reveals_nothing(failure.value, SECRET)
    # A function allowed to decrypt opens what capture sealed.
    assert _vault(aws).open(SCOPE, "cand_1", blob) == SECRET


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("ThrottlingException", 400, VaultUnavailable),
        ("KMSInternalException", 500, VaultUnavailable),
        ("DependencyTimeoutException", 503, VaultUnavailable),
        ("KeyUnavailableException", 500, VaultUnavailable),
        ("DisabledException", 400, VaultUnavailable),
        ("SomethingNew", 502, VaultUnavailable),
        ("AccessDeniedException", 400, SealIntegrityError),
        ("InvalidCiphertextException", 400, SealIntegrityError),
        ("IncorrectKeyException", 400, SealIntegrityError),
    ],
)
def test_kms_errors_on_open_are_translated(
    aws: Aws, code: str, status: int, expected: type[Exception]
) -> None:
    blob = _vault(aws).seal(SCOPE, "cand_1", SECRET)
    failing = _vault(aws, kms=_FailingKms(aws.kms, {"decrypt": _client_error(code, status)}))

    with pytest.raises(expected) as failure:
        failing.open(SCOPE, "cand_1", blob)
    _assert_reveals_nothing(failure.value, SECRET)


@pytest.mark.parametrize(
    "error",
    [
        lambda op: EndpointConnectionError(endpoint_url="https://kms.us-east-1.amazonaws.com"),
        lambda op: ReadTimeoutError(endpoint_url="https://kms.us-east-1.amazonaws.com"),
        lambda op: RuntimeError("connection pool exhausted"),
    ],
    ids=["endpoint", "read-timeout", "unexpected"],
)
def test_unreachable_kms_makes_the_vault_unavailable(
    aws: Aws, error: Callable[[str], Exception]
) -> None:
    blob = _vault(aws).seal(SCOPE, "cand_1", SECRET)
    failing = _vault(aws, kms=_FailingKms(aws.kms, {"decrypt": error, "generate_data_key": error}))

    with pytest.raises(VaultUnavailable):
        failing.open(SCOPE, "cand_1", blob)
    with pytest.raises(VaultUnavailable):
        failing.seal(SCOPE, "cand_2", SECRET)


def test_kms_throttling_on_seal_is_unavailable_and_writes_no_key(aws: Aws) -> None:
    kms = aws.session.client("kms")
    stubber = Stubber(kms)
    stubber.add_client_error(
        "generate_data_key", service_error_code="ThrottlingException", http_status_code=400
    )
    vault = _vault(aws, kms=kms)

    with stubber, pytest.raises(VaultUnavailable) as failure:
        vault.seal(SCOPE, "cand_1", SECRET)

    stubber.assert_no_pending_responses()
    assert _items(aws) == {}
    _assert_reveals_nothing(failure.value, SECRET)


@pytest.mark.parametrize(
    ("operation", "call"),
    [
        ("put_item", lambda vault, blob: vault.seal(SCOPE, "cand_2", SECRET)),
        ("get_item", lambda vault, blob: vault.open(SCOPE, "cand_1", blob)),
        ("get_item", lambda vault, blob: vault.key_exists(blob.key_ref)),
        ("delete_item", lambda vault, blob: vault.destroy(blob.key_ref)),
    ],
    ids=["seal", "open", "key_exists", "destroy"],
)
@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ProvisionedThroughputExceededException", 400),
        ("ThrottlingException", 400),
        ("InternalServerError", 500),
        ("ResourceNotFoundException", 400),
    ],
)
def test_key_table_failures_make_the_vault_unavailable(
    aws: Aws,
    operation: str,
    call: Callable[[KmsVault, SealedBlob], object],
    code: str,
    status: int,
) -> None:
    blob = _vault(aws).seal(SCOPE, "cand_1", SECRET)
    dynamodb = aws.session.client("dynamodb")
    stubber = Stubber(dynamodb)
    stubber.add_client_error(operation, service_error_code=code, http_status_code=status)
    vault = _vault(aws, dynamodb=dynamodb)

    with stubber, pytest.raises(VaultUnavailable) as failure:
        call(vault, blob)
    stubber.assert_no_pending_responses()
    _assert_reveals_nothing(failure.value, SECRET)
    assert _vault(aws).key_exists(blob.key_ref)


def test_a_missing_key_table_makes_the_vault_unavailable(aws: Aws) -> None:
    vault = KmsVault(
        kms_key_id=aws.key_arn,
        key_table="no-such-table",
        kms_client=aws.kms,
        dynamodb_client=aws.dynamodb,
    )

    for call in (
        lambda: vault.seal(SCOPE, "cand_1", SECRET),
        lambda: vault.key_exists("key_x"),
        lambda: vault.destroy("key_x"),
        lambda: vault.open(SCOPE, "cand_1", SealedBlob("key_x", b"...")),
    ):
        with pytest.raises(VaultUnavailable):
            call()


def test_failed_opens_log_no_warnings_and_nothing_logs_the_plaintext(
    vault: KmsVault, aws: Aws, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    refusing = _vault(aws, kms=_FailingKms(aws.kms, {"decrypt": _client_error("AccessDenied")}))

    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_2", blob)
    with pytest.raises(SealIntegrityError):
        vault.open(SCOPE, "cand_1", SealedBlob(blob.key_ref, blob.ciphertext[:-1]))
    with pytest.raises(SealIntegrityError):
        refusing.open(SCOPE, "cand_1", blob)
    assert vault.open(SCOPE, "cand_1", blob) == SECRET

    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "swordfish" not in caplog.text


# --------------------------------------------------------------------------------------------
# Construction and clients
# --------------------------------------------------------------------------------------------


class _RecordingSession:
    def __init__(self, inner: boto3.session.Session) -> None:
        self._inner = inner
        self.created: list[str] = []

    def client(self, service: str, **kwargs: Any) -> Any:
        self.created.append(service)
        return self._inner.client(service, **kwargs)  # type: ignore[call-overload]  # the stubs overload client() per literal service name


def test_no_client_is_created_until_the_first_call(aws: Aws) -> None:
    session = _RecordingSession(aws.session)
    vault = KmsVault(kms_key_id=aws.key_arn, key_table=TABLE, session=session)  # type: ignore[arg-type]

    assert session.created == []
    assert vault.key_exists("key_missing") is False
    assert session.created == ["dynamodb"]
    blob = vault.seal(SCOPE, "cand_1", SECRET)
    assert vault.open(SCOPE, "cand_1", blob) == SECRET
    vault.seal(SCOPE, "cand_2", SECRET)
    assert session.created == ["dynamodb", "kms"]


def test_construction_needs_no_region_credentials_or_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")

    vault = KmsVault(
        kms_key_id="arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        key_table=TABLE,
    )

    # Without a region the first call cannot build a client: unavailable, not a crash.
    with pytest.raises(VaultUnavailable):
        vault.key_exists("key_missing")


@pytest.mark.parametrize(
    "key_id",
    [
        "1234abcd-12ab-34cd-56ef-1234567890ab",
        "alias/engram",
        "arn:aws:kms:us-east-1:123456789012:alias/engram",
        "",
    ],
)
def test_the_kms_key_must_be_given_by_its_key_arn(key_id: str) -> None:
    with pytest.raises(ValueError, match="ARN"):
        KmsVault(kms_key_id=key_id, key_table=TABLE)


def test_a_vault_opens_blobs_sealed_by_another_instance(aws: Aws) -> None:
    blob = _vault(aws).seal(SCOPE, "cand_1", SECRET)

    assert _vault(aws).open(SCOPE, "cand_1", blob) == SECRET


def test_a_vault_under_another_kms_key_cannot_open_blobs(aws: Aws) -> None:
    blob = _vault(aws).seal(SCOPE, "cand_1", SECRET)
    other_arn = aws.kms.create_key()["KeyMetadata"]["Arn"]
    other = KmsVault(
        kms_key_id=other_arn, key_table=TABLE, kms_client=aws.kms, dynamodb_client=aws.dynamodb
    )

    with pytest.raises(SealIntegrityError):
        other.open(SCOPE, "cand_1", blob)


def test_concurrent_seals_and_opens_from_four_threads(vault: KmsVault) -> None:
    results: dict[str, bytes] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work(worker: int) -> None:
        try:
            for i in range(5):
                candidate = f"cand_{worker}_{i}"
                plaintext = f"{candidate}: {SECRET.decode()}".encode()
                blob = vault.seal(SCOPE, candidate, plaintext)
                opened = vault.open(SCOPE, candidate, blob)
                with lock:
                    results[candidate] = opened
                assert opened == plaintext
        except BaseException as exc:
            with lock:
                errors.append(exc)

    run_in_threads(work, 4)

    assert errors == []
    assert len(results) == 20

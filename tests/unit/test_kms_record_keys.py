"""The cloud ``RecordKeys`` on moto: one KMS call per scope and process, none per record; the key
class in the KMS encryption context; errors translated to the port's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_testing import REGION, inject, moto_aws
from botocore.exceptions import ClientError

from engram_memory.adapters.aws.kms_record_keys import (
    KEY_CLASS,
    KmsRecordKeys,
    scope_item_key,
)
from engram_memory.adapters.aws.kms_vault import create_key_table
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SealIntegrityError, VaultUnavailable

TABLE = "engram-keys"
SCOPE = Scope("tenant-a", "workspace-1")


@pytest.fixture
def clients() -> Iterator[tuple[Any, Any, str]]:
    with moto_aws():
        kms = boto3.client("kms", region_name=REGION)
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        create_key_table(dynamodb, TABLE)
        key_arn = kms.create_key(Description="record keys")["KeyMetadata"]["Arn"]
        yield kms, dynamodb, key_arn


def _keys(clients: tuple[Any, Any, str]) -> KmsRecordKeys:
    kms, dynamodb, key_arn = clients
    return KmsRecordKeys(
        kms_key_id=key_arn, key_table=TABLE, kms_client=kms, dynamodb_client=dynamodb
    )


def _kms_calls(kms: Any) -> list[str]:
    calls: list[str] = []
    inject(kms, "before-call.kms.*", lambda model, **_: calls.append(model.name))
    return calls


def test_a_process_calls_kms_once_per_scope_and_never_per_record(
    clients: tuple[Any, Any, str],
) -> None:
    kms = clients[0]
    calls = _kms_calls(kms)
    writer = _keys(clients)
    sealed = {f"rec_{i}": writer.seal(SCOPE, f"rec_{i}", f"body {i}".encode()) for i in range(10)}
    assert calls == ["GenerateDataKey"]  # the scope's key, made once

    reader = _keys(clients)  # another function instance: decrypts the scope key once
    calls.clear()
    for _ in range(3):
        opened = reader.open_many(SCOPE, sealed)
        assert opened == {f"rec_{i}": f"body {i}".encode() for i in range(10)}
    assert calls == ["Decrypt"]


def test_the_scope_key_is_bound_to_its_scope_and_key_class(
    clients: tuple[Any, Any, str],
) -> None:
    kms, dynamodb, _ = clients
    _keys(clients).seal(SCOPE, "rec_1", b"body")
    item = dynamodb.get_item(TableName=TABLE, Key={"key_ref": {"S": scope_item_key(SCOPE)}})
    wrapped = item["Item"]["wrapped"]["B"]
    context = {
        "engram:tenant": SCOPE.tenant_id,
        "engram:workspace": SCOPE.workspace_id,
        "engram:key-class": KEY_CLASS,
    }
    assert len(kms.decrypt(CiphertextBlob=wrapped, EncryptionContext=context)["Plaintext"]) == 32
    with pytest.raises(ClientError):  # a candidate's context (no key class) does not open it
        kms.decrypt(CiphertextBlob=wrapped, EncryptionContext={"engram:tenant": SCOPE.tenant_id})


def test_a_destroyed_key_opens_nothing_and_a_failing_table_is_unavailable(
    clients: tuple[Any, Any, str],
) -> None:
    _, dynamodb, _ = clients
    keys = _keys(clients)
    sealed = keys.seal(SCOPE, "rec_1", b"body")
    assert keys.key_exists(SCOPE, "rec_1")
    keys.destroy(SCOPE, "rec_1")
    keys.destroy(SCOPE, "rec_1")  # idempotent
    assert not keys.key_exists(SCOPE, "rec_1")
    assert keys.open_many(SCOPE, {"rec_1": sealed}) == {}

    def throttled(**_: Any) -> None:
        raise ClientError(
            {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"}},
            "BatchGetItem",
        )

    remove = inject(dynamodb, "before-call.dynamodb.BatchGetItem", throttled)
    try:
        with pytest.raises(VaultUnavailable):
            keys.open_many(SCOPE, {"rec_1": sealed})
    finally:
        remove()


def test_a_tampered_body_fails_authentication(clients: tuple[Any, Any, str]) -> None:
    keys = _keys(clients)
    sealed = keys.seal(SCOPE, "rec_1", b"body")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealIntegrityError):
        keys.open_many(SCOPE, {"rec_1": tampered})

"""Forgetting that reaches backups, cloud adapters (moto), at the store level: a copy of the
canonical table taken before a forget, put back after it, holds a body nobody can open, because
the record's key (in the key table, which has no point-in-time recovery and is never backed up)
was destroyed by the forget."""

from __future__ import annotations

from typing import Any

import boto3
from aws_testing import KEY_TABLE, REGION, TABLE

from engram_memory.adapters.aws.kms_record_keys import record_item_key, scope_item_key
from engram_memory.engine.ports import is_sealed_body

from engram_testing import Harness, context

TEXT = "The disaster-recovery runbook sits behind the saffron-osprey door."


def _scan(table: str) -> list[dict[str, Any]]:
    client = boto3.client("dynamodb", region_name=REGION)
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        items.extend(page["Items"])
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def test_a_table_copy_from_before_a_forget_put_back_opens_nothing(aws: Harness) -> None:
    scope = context().scope
    record_id = aws.remember(TEXT)
    kept = aws.remember("The cafeteria closes at three on Fridays.")
    backup = _scan(TABLE)  # the canonical items, as a table export would hold them
    assert "saffron-osprey" not in repr(backup)  # the body is sealed in the copy too
    row = aws.store.record_get(scope, record_id)
    assert row.body is not None and is_sealed_body(row.body)
    key_items = {item["key_ref"]["S"] for item in _scan(KEY_TABLE)}
    assert {record_item_key(scope, record_id), scope_item_key(scope)} <= key_items

    assert aws.forget(record_id)["ok"]
    assert record_item_key(scope, record_id) not in {
        item["key_ref"]["S"] for item in _scan(KEY_TABLE)
    }

    client = boto3.client("dynamodb", region_name=REGION)
    for item in backup:  # the restore: every item back as it was before the forget
        client.put_item(TableName=TABLE, Item=item)
    restored = aws.store.record_get(scope, record_id)
    assert restored.state == "accepted_current" and restored.body == row.body

    assert aws.record_keys.open_many(scope, {record_id: restored.body}) == {}
    assert aws.get(record_id)["error"]["code"] == "NOT_FOUND"
    assert aws.engine.project(scope, record_id, restored, aws.engine.surfaces) is False
    assert aws.search("saffron osprey runbook")["records"] == []
    # The other record, whose key still exists, reads as before.
    assert aws.get(kept)["output"]["value"]["record"]["record_id"] == kept

"""A cloud search reads every hit's eligibility, and the sealed bodies of its page only.

On the AWS adapters (DynamoDB, S3, KMS on moto): when a search has more hits than its page, the
hits up to the ranking depth are read with a projection that leaves the sealed bodies out, every
one of them revalidated (state, valid time, expiry), and the page's rows are read again whole;
a page row that is no longer eligible by then is left out of the answer, and a page body that
does not open is the contract's error, as before the cut.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_testing import aws_harness

from engram_memory.adapters.aws.dynamo_store import DynamoStore, _record_key
from engram_memory.engine.context import Scope

from engram_testing import TENANT, WORKSPACE, Harness

SCOPE = Scope(TENANT, WORKSPACE)
QUERY = "retry budget"


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = aws_harness(tmp_path)
    made.without_quality_gate()  # numbered notes that look alike
    try:
        yield made
    finally:
        made.close()


def _remember(harness: Harness, count: int) -> list[str]:
    return [
        harness.remember(f"note {n} about the retry budget of service {n}") for n in range(count)
    ]


def _batch_gets(harness: Harness) -> list[dict[str, Any]]:
    """Every BatchGetItem request the store sends from now on, as sent (keys, projection)."""
    sent: list[dict[str, Any]] = []
    store = harness.store
    assert isinstance(store, DynamoStore)

    def keep(params: dict[str, Any], **_: Any) -> None:
        if store.table_name in params["RequestItems"]:  # not the record keys' table
            sent.append(params["RequestItems"][store.table_name])

    store.dynamodb.meta.events.register("provide-client-params.dynamodb.BatchGetItem", keep)
    return sent


def _set_state(harness: Harness, record_id: str, state: str) -> None:
    store = harness.store
    assert isinstance(store, DynamoStore)
    store.dynamodb.update_item(
        TableName=store.table_name,
        Key=_record_key(SCOPE, record_id),
        UpdateExpression="SET #s = :s",
        ExpressionAttributeNames={"#s": "state"},
        ExpressionAttributeValues={":s": {"S": state}},
    )


def _all_pages(harness: Harness, limit: int) -> list[str]:
    found: list[str] = []
    page = harness.search(QUERY, limit=limit)
    while True:
        found += [p["record"]["record_id"] for p in page["records"]]
        cursor = page.get("next_page_cursor")
        if cursor is None:
            return found
        page = harness.search(QUERY, limit=limit, page_cursor=cursor)


def test_the_ranked_hits_are_read_without_bodies_and_the_page_with_them(
    harness: Harness,
) -> None:
    _remember(harness, 8)
    store = harness.store
    assert isinstance(store, DynamoStore)
    records = _batch_gets(harness)
    found = harness.search(QUERY, limit=3)

    assert len(found["records"]) == 3
    ranking, page = records
    assert len(ranking["Keys"]) == 8  # every hit, revalidated
    projected = set(ranking["ExpressionAttributeNames"].values())
    assert {"state", "valid_from_ms", "valid_to_ms", "expires_at_ms"} <= projected
    assert not {"body", "body_ref"} & projected  # no sealed body, no blob fetched
    assert "ProjectionExpression" not in page
    page_ids = {key["sk"]["S"] for key in page["Keys"]}
    assert page_ids == {
        _record_key(SCOPE, p["record"]["record_id"])["sk"]["S"] for p in found["records"]
    }


def test_a_search_whose_hits_fit_the_page_reads_them_once_with_bodies(harness: Harness) -> None:
    _remember(harness, 3)
    records = _batch_gets(harness)

    assert len(harness.search(QUERY, limit=5)["records"]) == 3
    assert len(records) == 1 and "ProjectionExpression" not in records[0]


def test_every_ranked_hit_is_still_revalidated(harness: Harness) -> None:
    ids = _remember(harness, 8)
    for gone in ids[::3]:  # wherever they rank, on a page or past it
        _set_state(harness, gone, "superseded")

    listed = _all_pages(harness, limit=2)

    assert sorted(listed) == sorted(set(ids) - set(ids[::3]))
    first = harness.search(QUERY, limit=2)
    eligible = len(ids) - len(ids[::3])
    assert first["rank_receipt"]["candidate_count"] == len(ids)
    assert "next_page_cursor" in first and len(listed) == eligible


def test_a_page_row_no_longer_eligible_when_its_body_is_read_is_left_out(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _remember(harness, 6)
    store = harness.store
    assert isinstance(store, DynamoStore)
    records_get = store.records_get

    def racing(scope: Scope, record_ids: Any, *, bodies: bool = True) -> Any:
        if bodies:  # the page's read: a forget committed since the ranking read
            _set_state(harness, record_ids[0], "forgotten")
        return records_get(scope, record_ids, bodies=bodies)

    monkeypatch.setattr(store, "records_get", racing)
    found = harness.search(QUERY, limit=3)

    answered = [p["record"]["record_id"] for p in found["records"]]
    assert len(answered) == 2 and set(answered) <= set(ids)
    monkeypatch.undo()
    assert len(harness.search(QUERY, limit=3)["records"]) == 3  # the next page moved up


@pytest.mark.parametrize(
    ("damage", "code"),
    [("REMOVE body", "BLOB_MISSING"), ("SET body = :b", "JOURNAL_CORRUPT")],
)
def test_a_page_body_that_does_not_open_is_the_contracts_error(
    harness: Harness, damage: str, code: str
) -> None:
    ids = _remember(harness, 6)
    store = harness.store
    assert isinstance(store, DynamoStore)
    for record_id in ids:  # whichever ranks on the page
        extra: dict[str, Any] = {}
        if ":b" in damage:
            extra["ExpressionAttributeValues"] = {":b": {"B": b"not a sealed body"}}
        store.dynamodb.update_item(
            TableName=store.table_name,
            Key=_record_key(SCOPE, record_id),
            UpdateExpression=damage,
            **extra,
        )

    answer = harness.call("search", {"query": QUERY, "purpose_ref": "purpose:general", "limit": 3})

    assert answer["ok"] is False and answer["error"]["code"] == code


def test_large_bodies_are_fetched_from_the_blob_store_for_the_page_only(tmp_path: Path) -> None:
    harness = aws_harness(tmp_path, inline_limit_bytes=64)  # every body goes to S3
    harness.without_quality_gate()
    try:
        _remember(harness, 8)
        store = harness.store
        assert isinstance(store, DynamoStore)
        fetched: list[str] = []
        store.s3.meta.events.register(
            "provide-client-params.s3.GetObject", lambda params, **_: fetched.append(params["Key"])
        )

        found = harness.search(QUERY, limit=3)

        # before the cut, every hit's blob was fetched to revalidate it (8 here)
        assert len(found["records"]) == 3
        assert len(fetched) == 3
    finally:
        harness.close()

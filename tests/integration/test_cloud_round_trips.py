"""Round trips per tool on the AWS adapter set (DynamoDB, S3, KMS on moto; the index port).

Every boto3 request the store and the vault send is counted with botocore's own ``before-call``
event (the seam a real request goes through), and every call on the index port (one OpenSearch
request each: ``_search``, a k-NN ``_search``, an index or delete) by a counting wrapper. The
counts are the data's: a search is one index query, one batched read of the hits (without their
bodies when they are more than a page) and one of the page's; a get one read of the record and
one of the head; a write one transaction, and one more per outbox item it queued. Run with ``-s``
to print the table per tool (issue 14, part 4); ``bench.lambda_warm --built`` counts the same
requests per tool on the built functions.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_testing import aws_harness

from engram_testing import Harness

Counts = collections.Counter[str]


class CountingIndex:
    """The harness's index, with every port call counted (each is one OpenSearch request)."""

    def __init__(self, inner: Any, counts: Counts) -> None:
        self.inner = inner
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        counted_calls = {"search", "nearest", "score_at", "apply", "has_vector", "contains"}
        if name in counted_calls and callable(found):

            def counted(*args: Any, **kwargs: Any) -> Any:
                self._counts[f"index.{name}"] += 1
                return found(*args, **kwargs)

            return counted
        return found


@pytest.fixture
def counted(tmp_path: Path) -> Iterator[tuple[Harness, Counts]]:
    harness = aws_harness(tmp_path)
    counts: Counts = collections.Counter()

    def count(model: Any, **_: Any) -> None:
        counts[f"{model.service_model.service_name}.{model.name}"] += 1

    clients = {
        id(client): client
        for client in (
            harness.store.dynamodb,
            harness.store.s3,
            harness.vault._kms_client,
            harness.vault._dynamodb_client,
        )
    }
    for client in clients.values():
        client.meta.events.register("before-call.*.*", count)
    counting = CountingIndex(harness.engine.lexical, counts)
    harness.engine.lexical = counting
    harness.engine.surfaces = tuple(
        counting if surface is counting.inner else surface for surface in harness.engine.surfaces
    )
    try:
        yield harness, counts
    finally:
        for client in clients.values():
            client.meta.events.unregister("before-call.*.*", count)
        harness.close()


def _during(counts: Counts, action: Any) -> tuple[Any, dict[str, int]]:
    before = collections.Counter(counts)
    result = action()
    return result, dict(sorted((counts - before).items()))


def test_each_tool_makes_the_round_trips_its_data_needs(
    counted: tuple[Harness, Counts], capsys: pytest.CaptureFixture[str]
) -> None:
    harness, counts = counted
    harness.without_quality_gate()  # numbered warm-up notes
    for n in range(5):
        harness.remember(f"warm note {n} about the retry budget")
    captured, capture_trips = _during(counts, lambda: harness.capture("the retry budget is 3"))
    _, admission_trips = _during(counts, lambda: harness.admit(captured["candidate_id"]))
    found, search_trips = _during(counts, lambda: harness.search("retry budget", limit=5))
    record_id = found["records"][0]["record"]["record_id"]
    _, get_trips = _during(counts, lambda: harness.get(record_id))
    pending = harness.capture("a note to withdraw")
    _, withdraw_trips = _during(counts, lambda: harness.withdraw(pending["candidate_id"]))
    _, forget_trips = _during(counts, lambda: harness.forget(record_id))
    table = {
        "capture": capture_trips,
        "request_admission": admission_trips,
        "search": search_trips,
        "get": get_trips,
        "withdraw": withdraw_trips,
        "forget": forget_trips,
    }
    with capsys.disabled():
        print("\nround trips per tool (AWS adapters on moto):")
        for tool, trips in table.items():
            print(f"  {tool}: {trips}")

    assert len(found["records"]) == 5
    # Reads never write and never transact; a search is one index query.
    for read in ("search", "get"):
        assert not any("Transact" in op or "Put" in op or "Update" in op for op in table[read])
    assert search_trips.get("index.search") == 1
    # The hits of a search (6 here, for a page of 5) are read back in one batch without their
    # sealed bodies, to revalidate every one; the page's rows whole in a second, its record keys
    # in a third (test_cloud_search_bodies.py: hits that fit the page are read once, whole). A
    # get reads the record, the head and the record's key.
    assert search_trips.get("dynamodb.BatchGetItem") == 3
    assert get_trips == {"dynamodb.GetItem": 2, "dynamodb.BatchGetItem": 1}
    # Admission writes the record's key once (one conditional put), never a KMS call per record.
    assert admission_trips.get("dynamodb.PutItem") == 1
    # Each mutation commits in one transaction, and each outbox item it queued (a key to
    # destroy, a projection to update) is removed in one more, without reading it first.
    # (admission: the projection — the candidate's key stays, linked to its record, so that a
    # backup taken while it was pending restores it; withdraw: the candidate's key and the
    # record key made at capture; forget: the projection, the record's key and its candidate's)
    queued = {"capture": 0, "request_admission": 1, "withdraw": 2, "forget": 3}
    for write, items in queued.items():
        assert table[write].get("dynamodb.TransactWriteItems") == 1 + items, (write, table[write])

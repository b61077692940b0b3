"""Concurrent writers of one workspace queue on its head instead of failing (DynamoDB on moto).

Each writer is its own ``Engine`` (one Lambda instance each), so the in-process scope lock does
not serialize them: they meet at the head's condition in DynamoDB, as in the cloud.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aws_testing import another_engine, inject
from botocore.exceptions import ClientError

from engram_memory.engine.journal import verify_journal

from engram_testing import Harness, capture_args, context, handled


def transaction_conflicts(times: int) -> Any:
    """A botocore hook cancelling the next ``times`` transactions for a TransactionConflict."""
    left = [times]

    def hook(**_: Any) -> None:
        if left[0] > 0:
            left[0] -= 1
            raise ClientError(
                {
                    "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
                    "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
                },
                "TransactWriteItems",
            )

    hook.left = left  # type: ignore[attr-defined]
    return hook


def test_a_transaction_conflict_is_retried_until_the_commit_lands(aws: Harness) -> None:
    hook = transaction_conflicts(4)
    inject(aws.store.dynamodb, "before-call.dynamodb.TransactWriteItems", hook)
    value = aws.ok("capture", capture_args(key="contended-capture-01"))
    assert value["status"] == "committed_pending" and value["cursor"] == "1"
    assert hook.left == [0]  # every conflict was absorbed by a retry
    assert verify_journal(aws.store, context().scope).cursor == 1


def test_contention_past_the_deadline_is_deadline_exceeded_not_fence_lost(aws: Harness) -> None:
    inject(
        aws.store.dynamodb,
        "before-call.dynamodb.TransactWriteItems",
        transaction_conflicts(10_000),
    )
    ctx = dataclasses.replace(context(), deadline_ms=aws.clock.now_ms() + 200)
    assert aws.error("capture", capture_args(key="contended-capture-02"), ctx) == (
        "DEADLINE_EXCEEDED"
    )
    assert aws.store.head(context().scope).cursor == 0


def test_contention_without_a_deadline_ends_fence_lost_after_the_budget(aws: Harness) -> None:
    engine = another_engine(aws, contention_budget_ms=200)
    inject(
        aws.store.dynamodb,
        "before-call.dynamodb.TransactWriteItems",
        transaction_conflicts(10_000),
    )
    envelope = handled(engine, "capture", capture_args(key="contended-capture-03"), context())
    assert envelope["error"]["code"] == "FENCE_LOST" and envelope["error"]["retriable"]


def test_twenty_concurrent_writers_in_one_workspace_all_succeed(aws: Harness) -> None:
    """Twenty engines capture at once; every call answers ok, each committed exactly once.

    Each call has a deadline, as a Lambda gives it, far enough for moto (which serializes every
    request) to get through the queue on a loaded machine.
    """
    engines = [another_engine(aws) for _ in range(20)]
    ctx = dataclasses.replace(context(), deadline_ms=aws.clock.now_ms() + 600_000)

    def write(index: int) -> str:
        text = f"Writer {index} decided something."
        envelope = handled(
            engines[index], "capture", capture_args(text, key=f"writer-{index:03d}-capture"), ctx
        )
        assert envelope["ok"], envelope
        cursor: str = envelope["output"]["value"]["cursor"]
        return cursor

    with ThreadPoolExecutor(max_workers=20) as pool:
        cursors = list(pool.map(write, range(20)))
    assert sorted(int(c) for c in cursors) == list(range(1, 21))  # dense: each commit once
    assert verify_journal(aws.store, context().scope).cursor == 20

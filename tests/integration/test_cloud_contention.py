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


def test_fifty_concurrent_writers_in_one_workspace_all_succeed(aws: Harness) -> None:
    """Fifty engines capture at once; every call answers ok, each committed exactly once: no
    call lost, no FENCE_LOST, no DEADLINE_EXCEEDED (issue 25, item 8).

    Each call has a deadline, as a Lambda gives it, far enough for moto (which serializes every
    request) to get through the queue on a loaded machine.
    """
    writers = 50
    engines = [another_engine(aws) for _ in range(writers)]
    ctx = dataclasses.replace(context(), deadline_ms=aws.clock.now_ms() + 600_000)

    def write(index: int) -> str:
        text = f"Writer {index} decided something."
        envelope = handled(
            engines[index], "capture", capture_args(text, key=f"writer-{index:03d}-capture"), ctx
        )
        assert envelope["ok"], envelope
        cursor: str = envelope["output"]["value"]["cursor"]
        return cursor

    with ThreadPoolExecutor(max_workers=writers) as pool:
        cursors = list(pool.map(write, range(writers)))
    assert sorted(int(c) for c in cursors) == list(range(1, writers + 1))  # dense: each once
    assert verify_journal(aws.store, context().scope).cursor == writers


class _StaleOnce:
    """The store, whose head read after the first refused commit is one commit behind: another
    writer landed while this one was building its change set (issue 25, item 8)."""

    def __init__(self, store: Any, stale: Any) -> None:
        self._store, self._stale, self.reads = store, stale, 0

    def head(self, scope: Any) -> Any:
        self.reads += 1
        return self._stale if self.reads == 2 else self._store.head(scope)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_a_retry_whose_head_moved_while_building_sends_no_doomed_transaction(
    aws: Harness,
) -> None:
    stale = aws.store.head(context().scope)
    aws.ok("capture", capture_args(key="earlier-writer-0001"))  # the head moves past `stale`
    proxy = _StaleOnce(aws.store, stale)
    engine = another_engine(dataclasses.replace(aws, store=proxy))
    sent: list[int] = []
    inject(
        aws.store.dynamodb, "before-call.dynamodb.TransactWriteItems", lambda **_: sent.append(1)
    )
    inject(aws.store.dynamodb, "before-call.dynamodb.TransactWriteItems", transaction_conflicts(1))
    envelope = handled(engine, "capture", capture_args(key="contended-capture-04"), context())
    assert envelope["ok"] and envelope["output"]["value"]["cursor"] == "2"
    # the conflict, then the commit that lands: the change set built on the stale head was
    # checked against a fresh head read and never sent
    assert len(sent) == 2, sent
    assert verify_journal(aws.store, context().scope).cursor == 2

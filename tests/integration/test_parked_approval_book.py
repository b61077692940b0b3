"""The cloud's parked task tokens (``ParkedApprovalBook``) on moto's DynamoDB: parked once per
execution (a retried step refreshes the token of the same approval), taken once, reported once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from aws_testing import TABLE, aws_clients, moto_aws

from engram_memory.adapters.aws.dynamo_store import create_tables
from engram_memory.cloud.parked_approvals import ParkedApprovalBook, WorkflowRequest
from engram_memory.cloud.tool_invocation import ToolInvocation

from engram_testing import context, sha

T0 = 1_790_000_000_000
EXECUTION = "forget-" + "0" * 64


@pytest.fixture
def store() -> Iterator[ParkedApprovalBook]:
    with moto_aws():
        dynamodb, _ = aws_clients()
        create_tables(dynamodb, TABLE)
        yield ParkedApprovalBook(dynamodb, TABLE)


def park(store: ParkedApprovalBook, approval_id: str, token: str, **ctx_fields: Any) -> str:
    ctx = context(agent_id="agent-1", session_id="session-1", **ctx_fields)
    request = WorkflowRequest(
        invocation=ToolInvocation.from_trusted("forget", {"record_id": "mem_1"}, ctx),
        target="mem_1",
        operation_digest=sha("forget mem_1"),
        reason_ref="tidy",
    )
    return store.park(
        approval_id=approval_id,
        task_token=token,
        execution_name=EXECUTION,
        workflow="forget",
        request=request,
        issued_at_ms=T0,
    )


def test_a_retried_step_keeps_the_approval_and_hands_it_the_new_token(
    store: ParkedApprovalBook,
) -> None:
    first = park(store, "apr_" + "1" * 32, "token-1")
    again = park(store, "apr_" + "2" * 32, "token-2")

    assert again == first
    parked = store.for_execution(EXECUTION)
    assert parked is not None
    assert (parked.approval_id, parked.task_token, parked.agent_id) == (first, "token-2", "agent-1")
    assert store.get("apr_" + "2" * 32) is None


def test_a_token_is_taken_once_and_a_later_retry_does_not_revive_it(
    store: ParkedApprovalBook,
) -> None:
    approval_id = park(store, "apr_" + "1" * 32, "token-1")

    taken = store.take(approval_id, T0 + 1_000)
    assert taken is not None and taken.task_token == "token-1"
    assert store.take(approval_id, T0 + 2_000) is None
    assert park(store, "apr_" + "3" * 32, "token-3") == approval_id
    parked: Any = store.get(approval_id)
    assert parked.used and parked.task_token is None
    assert store.take("apr_" + "9" * 32, T0) is None  # unknown


def test_the_commit_is_first_reported_once(store: ParkedApprovalBook) -> None:
    approval_id = park(store, "apr_" + "1" * 32, "token-1")

    assert store.first_report(approval_id, T0 + 1_000)
    assert not store.first_report(approval_id, T0 + 2_000)
    assert not store.first_report("apr_" + "9" * 32, T0)


def test_the_approver_the_agents_token_named_is_parked_with_the_token(
    store: ParkedApprovalBook,
) -> None:
    approval_id = park(store, "apr_" + "1" * 32, "token-1", approver="person-dana")
    parked = store.get(approval_id)
    assert parked is not None and parked.approver == "person-dana"
    taken = store.take(approval_id, T0 + 1_000)
    assert taken is not None and taken.approver == "person-dana"
    assert "approver" not in taken.approved(T0 + 1_000).model_dump()  # not in the binding


def test_without_an_approver_claim_none_is_parked(store: ParkedApprovalBook) -> None:
    parked = store.get(park(store, "apr_" + "1" * 32, "token-1"))
    assert parked is not None and parked.approver is None

"""One ``Approval`` type: every place an approval rests or travels is a serialization of it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engram_memory.cloud.parked_approvals import ParkedApproval, from_item, to_item
from engram_memory.engine.gate import (
    APPROVAL_TTL_MS,
    EXECUTION_WINDOW_MS,
    Approval,
)
from engram_memory.mcp_surface.request_state import RequestStateSealer

from engram_testing import forget_request

REQUEST = forget_request("mem_x", summary="forget mem_x")
ASKED = Approval.asked(REQUEST, approval_id="apr_" + "a" * 32, issued_at_ms=1_000)


def test_an_open_question_is_no_approval_until_it_is_approved() -> None:
    assert ASKED.approved_at_ms is None and not ASKED.usable_at(1_000)
    given = ASKED.approved(2_000)
    assert given.binds(REQUEST) and given.usable_at(2_000 + EXECUTION_WINDOW_MS)
    assert not given.usable_at(2_001 + EXECUTION_WINDOW_MS)
    assert not ASKED.expired(1_000 + APPROVAL_TTL_MS) and ASKED.expired(1_001 + APPROVAL_TTL_MS)


def test_the_parked_item_round_trips_and_its_approval_carries_no_task_token() -> None:
    parked = ParkedApproval(
        **ASKED.model_dump(),
        task_token="secret-task-token",
        execution_name="forget-" + "0" * 64,
        workflow="forget",
        reason_ref="reason:obsolete",
    )
    item = to_item(parked)
    assert item["issued_at_ms"] == {"N": "1000"} and "approved_at_ms" not in item
    assert from_item(item) == parked
    assert from_item({**item, "used_at_ms": {"N": "5"}}).used is True
    given = from_item(item).approved(2_000)
    assert type(given) is Approval and given == ASKED.approved(2_000)
    assert "secret-task-token" not in given.model_dump_json()


def test_the_sealed_request_state_is_the_open_approval() -> None:
    sealer = RequestStateSealer(b"k" * 32)
    assert sealer.open(sealer.seal(ASKED)) == ASKED


def test_the_wire_form_is_the_model_s_json_and_refuses_anything_else() -> None:
    given = ASKED.approved(2_000)
    assert Approval.model_validate(json.loads(given.model_dump_json())) == given
    with pytest.raises(ValidationError, match="task_token"):
        Approval.model_validate({**given.model_dump(), "task_token": "x"})
    with pytest.raises(ValidationError, match="operation_digest"):
        Approval.model_validate({**given.model_dump(), "operation_digest": "md5:1"})

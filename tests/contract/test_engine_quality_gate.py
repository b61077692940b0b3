"""The built-in policy's quality gate through the engine (issue 27): near-duplicates of current
records of the same scope are held (or rejected, by host setting), low-information captures
rejected; the agent's outcome names no other record, the operator's view does."""

from __future__ import annotations

import json

from engram_memory.operator_plane import inspection
from engram_memory.policy.builtin import BuiltinAdmissionPolicy

from engram_testing import Harness, context

FACT = "The billing service retries failed card charges three times, an hour apart."


def _admitted(harness: Harness, text: str, **kw: object) -> dict[str, object]:
    captured = harness.capture(text, **kw)  # type: ignore[arg-type]
    outcome: dict[str, object] = harness.admit(str(captured["candidate_id"]))["outcome"]
    return outcome


def test_a_near_duplicate_is_held_and_the_operator_sees_which_record_it_resembles(
    harness: Harness,
) -> None:
    first = _admitted(harness, FACT)
    assert first["status"] == "accepted"
    captured = harness.capture(
        "the billing service retries failed card-charges 3 times, an hour apart"
    )
    value = harness.admit(captured["candidate_id"])
    outcome = value["outcome"]
    assert outcome["status"] == "pending_adjudication"
    assert str(first["record_id"]) not in json.dumps(value)  # the agent is not told which
    shown = inspection.pending_show(
        harness.engine, context().scope, captured["candidate_id"], "ops-ana"
    )
    assert shown["resembles"] == [first["record_id"]]


def test_rejected_by_host_setting_and_a_genuine_new_fact_is_admitted(harness: Harness) -> None:
    harness.engine.policy = BuiltinAdmissionPolicy(near_duplicates="rejected")
    assert _admitted(harness, FACT)["status"] == "accepted"
    assert _admitted(harness, FACT + " ")["status"] == "rejected"
    new = "The billing service sends invoices on the first working day of each month."
    assert _admitted(harness, new)["status"] == "accepted"


def test_a_near_duplicate_in_another_workspace_is_not_one(harness: Harness) -> None:
    assert _admitted(harness, FACT)["status"] == "accepted"
    other = context(workspace="ws-other-2")
    captured = harness.capture(FACT + "!", ctx=other)
    assert harness.admit(captured["candidate_id"], ctx=other)["outcome"]["status"] == "accepted"


def test_a_forgotten_record_is_no_longer_a_neighbour(harness: Harness) -> None:
    first = _admitted(harness, FACT)
    assert harness.forget(str(first["record_id"]))["ok"]
    assert _admitted(harness, FACT + "!")["status"] == "accepted"


def test_low_information_captures_are_rejected(harness: Harness) -> None:
    assert _admitted(harness, "ok, thanks!")["status"] == "rejected"
    assert _admitted(harness, "... --- !!!")["status"] == "rejected"

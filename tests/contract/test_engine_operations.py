"""The operations plane: an operator resolves candidates held for adjudication."""

from __future__ import annotations

import pytest

from engram_memory.contract.errors import EngramError
from engram_memory.engine.operations import adjudicate

from engram_testing import Harness, ScriptedPolicy, context


def test_an_operator_accepts_a_held_candidate_and_it_becomes_searchable(harness: Harness) -> None:
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    captured = harness.capture("Held for review: the release train leaves on Tuesdays.")
    assert harness.admit(captured["candidate_id"])["outcome"]["status"] == "pending_adjudication"
    outcome = adjudicate(
        harness.engine, context().scope, captured["candidate_id"], "accept", "ops-ana"
    )
    assert outcome["status"] == "accepted"
    found = harness.search("release train Tuesdays")["records"]
    assert [p["record"]["record_id"] for p in found] == [outcome["record_id"]]
    again = adjudicate(
        harness.engine, context().scope, captured["candidate_id"], "accept", "ops-ana"
    )
    assert again == outcome


def test_an_operator_rejection_shreds_the_candidate(harness: Harness) -> None:
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    captured = harness.capture()
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    outcome = adjudicate(
        harness.engine, context().scope, captured["candidate_id"], "reject", "ops-ana"
    )
    assert outcome["status"] == "rejected"
    assert not harness.vault.key_exists(row.key_ref)


def test_adjudicating_an_unknown_or_decided_candidate_is_not_found(harness: Harness) -> None:
    with pytest.raises(EngramError) as unknown:
        adjudicate(harness.engine, context().scope, "candidate_" + "0" * 64, "accept", "ops-ana")
    assert unknown.value.code.value == "NOT_FOUND"
    captured = harness.capture()
    harness.admit(captured["candidate_id"])
    with pytest.raises(EngramError):
        adjudicate(harness.engine, context().scope, captured["candidate_id"], "reject", "ops-bo")

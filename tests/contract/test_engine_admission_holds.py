"""A held admission waits for a person (issue 35, item 6), on both adapter sets.

The policy's hold (``adjudication_required`` → ``pending_adjudication``) is stored in one commit:
the answer in the ledger under the call's idempotency key, and the candidate marked held. A
retry with the key replays it (``replayed: true``, no journal event); a call with a new key is
held too, without asking the policy again; only an operator's adjudication (or a withdraw) ends
it. The near-duplicate gate reads its neighbours so that the decision does not depend on the
index having caught up: a record whose projection is on its way is a neighbour; an index that
cannot be asked answers a retriable error and writes nothing (a backlog past the bound:
``tests/integration/test_dynamo_store.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from engram_memory.engine.ports import (
    AdmissionRequest,
    ChangeSet,
    CommitConflict,
    LedgerEntry,
    PolicyDecision,
    StateTransition,
)
from engram_memory.operator_plane import decisions, inspection
from engram_memory.policy.builtin import BuiltinAdmissionPolicy

from engram_testing import Harness, ScriptedPolicy, context

FACT = "The billing service retries failed card charges three times, an hour apart."
NEAR = "the billing service retries failed card-charges 3 times, an hour apart"
OPS = "ops-ana"


def _args(candidate_id: str, key: str) -> dict[str, str]:
    return {"candidate_id": candidate_id, "idempotency_key": key}


def _journal(harness: Harness) -> list[int]:
    return [event.cursor for event in harness.store.events(context().scope, 0, 1000)]


def _held_by_script(harness: Harness, key: str = "admit-held-000001") -> tuple[str, dict[str, Any]]:
    """A candidate the (scripted) policy held under ``key``: its id and the first answer."""
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    captured = harness.capture("Held for review: the release train leaves on Tuesdays.")
    first = harness.ok("request_admission", _args(captured["candidate_id"], key))
    assert first["outcome"]["status"] == "pending_adjudication" and first["replayed"] is False
    return captured["candidate_id"], first


def test_a_hold_is_stored_with_its_key_and_a_retry_replays_it_without_an_event(
    harness: Harness,
) -> None:
    journal = _journal(harness)
    candidate_id, first = _held_by_script(harness)
    assert _journal(harness) == [*journal, 1]  # the capture's event; the hold wrote none
    row = harness.store.candidate_get(context().scope, candidate_id)
    assert (row.state, row.held) == ("pending", first["outcome"]["decision_receipt_digest"])
    entry = harness.store.ledger_get(context().scope, context().principal, "admit-held-000001")
    assert (entry.tool, entry.target, entry.cursor) == ("request_admission", candidate_id, 0)

    policy = ScriptedPolicy("accept")  # the policy (or the index it reads) changed its mind
    harness.engine.policy = policy
    again = harness.ok("request_admission", _args(candidate_id, "admit-held-000001"))
    assert again == {**first, "replayed": True}
    assert policy.seen == [] and _journal(harness) == [*journal, 1]
    assert harness.store.candidate_get(context().scope, candidate_id).state == "pending"


def test_a_new_key_on_a_held_candidate_is_held_without_asking_the_policy(
    harness: Harness,
) -> None:
    candidate_id, first = _held_by_script(harness)
    policy = ScriptedPolicy("accept")
    harness.engine.policy = policy
    other = harness.ok("request_admission", _args(candidate_id, "admit-held-000002"))
    outcome = other["outcome"]
    assert (outcome["status"], other["replayed"]) == ("pending_adjudication", False)
    assert outcome["decision_receipt_digest"] == first["outcome"]["decision_receipt_digest"]
    assert policy.seen == []
    replay = harness.ok("request_admission", _args(candidate_id, "admit-held-000002"))
    assert replay == {**other, "replayed": True}
    audit = [e for e in harness.audit.events if e.tool == "request_admission"]
    assert audit[-2].digests["decision_receipt_digest"] == outcome["decision_receipt_digest"]


def test_an_operator_adjudication_ends_the_hold_and_the_held_key_still_replays(
    harness: Harness,
) -> None:
    candidate_id, first = _held_by_script(harness)
    outcome = decisions.adjudicate(harness.engine, context().scope, candidate_id, "accept", OPS)
    assert outcome["status"] == "accepted"
    row = harness.store.candidate_get(context().scope, candidate_id)
    assert (row.state, row.held) == ("admitted", None)
    assert harness.error("request_admission", _args(candidate_id, "admit-held-000003")) == (
        "NOT_FOUND"
    )
    replay = harness.ok("request_admission", _args(candidate_id, "admit-held-000001"))
    assert replay == {**first, "replayed": True}  # the answer that call was given


def test_an_operator_rejects_a_held_candidate_and_its_agent_may_withdraw_one(
    harness: Harness,
) -> None:
    rejected, _ = _held_by_script(harness, "admit-held-000004")
    outcome = decisions.adjudicate(harness.engine, context().scope, rejected, "reject", OPS)
    assert outcome["status"] == "rejected"
    assert harness.store.candidate_get(context().scope, rejected).held is None
    withdrawn, _ = _held_by_script(harness, "admit-held-000005")
    assert harness.withdraw(withdrawn)["ok"]
    row = harness.store.candidate_get(context().scope, withdrawn)
    assert (row.state, row.held) == ("withdrawn", None)


def test_pending_list_tells_a_held_candidate_from_one_never_asked_for(harness: Harness) -> None:
    held, _ = _held_by_script(harness)
    waiting = harness.capture("Not asked yet: the canary stage runs for forty minutes.")
    listed = {
        row["candidate_id"]: row["held"]
        for row in inspection.pending_list(harness.engine, context().scope, OPS)
    }
    assert listed == {held: True, waiting["candidate_id"]: False}
    shown = inspection.pending_show(harness.engine, context().scope, held, OPS)
    assert shown["candidate"]["held"] is True


def test_pending_list_says_why_each_candidate_waits_and_shows_its_first_line(
    harness: Harness,
) -> None:
    """Issue 38, item 3: held by the policy (a near-duplicate of which record, forgotten
    content, manual adjudication) reads apart from captured and never submitted; each with its
    text's first line; the listing is audited, its audit line holds no text."""
    fact = "The billing service retries failed card charges three times, an hour apart."
    original = harness.remember(fact)
    near = harness.capture("the billing service retries failed card-charges 3 times, an hour apart")
    gone_text = "The staging cluster rotates its certificates every week."
    harness.forget(harness.remember(gone_text))
    again = harness.capture(gone_text)
    never = harness.capture("Deploys freeze on Fridays.\nExceptions need the release manager.")
    for held in (near, again):
        outcome = harness.admit(held["candidate_id"])["outcome"]
        assert outcome["status"] == "pending_adjudication"
    harness.engine.policy = BuiltinAdmissionPolicy(mode="manual")
    manual = harness.capture("Releases are cut on Tuesdays after the freeze.")
    assert harness.admit(manual["candidate_id"])["outcome"]["status"] == "pending_adjudication"
    harness.audit.events.clear()

    listed = {
        row["candidate_id"]: (row["waiting"], row["held_for"], row["first_line"])
        for row in inspection.pending_list(harness.engine, context().scope, OPS)
    }
    assert listed == {
        near["candidate_id"]: (
            "held",
            f"near-duplicate of {original}",
            "the billing service retries failed card-charges 3 times, an hour apart",
        ),
        again["candidate_id"]: ("held", "forgotten before (the tombstone guard)", gone_text),
        manual["candidate_id"]: (
            "held",
            "adjudication required (manual admission)",
            "Releases are cut on Tuesdays after the freeze.",
        ),
        never["candidate_id"]: ("not submitted", None, "Deploys freeze on Fridays."),
    }
    (line,) = harness.audit.events
    assert (line.tool, line.principal, line.ok) == ("admin.pending_list", "operator:ops-ana", True)
    assert "Deploys" not in repr(line) and "billing" not in repr(line)


class _RacedByAHold(ScriptedPolicy):
    """Accepts; but while it decides, another call of the same agent (another key) is held."""

    def __init__(self, harness: Harness) -> None:
        super().__init__("accept")
        self.harness = harness
        self.raced = False

    def decide(self, request: AdmissionRequest) -> PolicyDecision:
        if not self.raced:
            self.raced = True
            self.harness.engine.policy = ScriptedPolicy("adjudication_required")
            key = "admit-race-000002"
            held = self.harness.ok("request_admission", _args(request.candidate_id, key))
            assert held["outcome"]["status"] == "pending_adjudication"
            self.harness.engine.policy = self
        return super().decide(request)


def test_an_acceptance_racing_a_hold_loses_and_answers_the_hold(harness: Harness) -> None:
    captured = harness.capture("Raced: the release train leaves on Wednesdays.")
    harness.engine.policy = _RacedByAHold(harness)
    value = harness.ok("request_admission", _args(captured["candidate_id"], "admit-race-000001"))
    assert value["outcome"]["status"] == "pending_adjudication"
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    assert (row.state, row.held) == ("pending", value["outcome"]["decision_receipt_digest"])
    assert harness.search("release train Wednesdays")["records"] == []


def test_the_store_refuses_a_policy_decision_on_a_held_candidate(harness: Harness) -> None:
    candidate_id, _ = _held_by_script(harness)
    scope = context().scope
    refused = ChangeSet(
        scope=scope,
        expected_head=harness.store.head(scope),
        ledger=LedgerEntry(context().principal, "direct-000000001", "t", None, "h", b"{}", 0),
        candidate_transition=StateTransition(candidate_id, "pending", "rejected"),
        unless_held=True,
    )
    with pytest.raises(CommitConflict) as conflict:
        harness.store.commit(refused)
    assert conflict.value.reason == "state"
    assert harness.store.candidate_get(scope, candidate_id).state == "pending"


def test_a_held_tombstone_guard_replays_and_stays_held(harness: Harness) -> None:
    text = "The old billing API key rotation schedule is monthly."
    record_id = harness.remember(text)
    assert harness.forget(record_id)["ok"]
    again = harness.capture(text, key="recapture-held-0001")
    first = harness.ok("request_admission", _args(again["candidate_id"], "admit-guard-000001"))
    assert first["outcome"]["status"] == "pending_adjudication"
    assert harness.ok("request_admission", _args(again["candidate_id"], "admit-guard-000001")) == {
        **first,
        "replayed": True,
    }


def test_a_confirmed_hold_spends_its_approval_and_its_replay_asks_nobody(
    harness: Harness,
) -> None:
    strict = context(confirm_required=frozenset({"request_admission"}))
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    captured = harness.capture(ctx=strict)
    args = _args(captured["candidate_id"], "admit-confirmed-01")
    first = harness.ok("request_admission", args, strict)
    assert first["outcome"]["status"] == "pending_adjudication"
    asked = len(harness.confirmations.requests)
    assert harness.ok("request_admission", args, strict) == {**first, "replayed": True}
    assert len(harness.confirmations.requests) == asked
    approval = harness.confirmations.last
    assert approval is not None and not harness.store.spend_approval(
        context().scope, approval.approval_id
    )


# -- neighbours: never an index that is behind ------------------------------------------------


def _index_deferred(harness: Harness) -> bool:
    return not harness.index.maintained_by_store


def test_a_record_whose_projection_is_on_its_way_is_a_neighbour(harness: Harness) -> None:
    deferred = _index_deferred(harness)
    if deferred:
        harness.index.writable = False  # the upsert after the commit fails: the index lags
    first = harness.remember(FACT)
    if deferred:
        harness.index.writable = True
        assert not harness.index.contains(context().scope, first)
        assert harness.store.outbox_has(context().scope, "upsert_projection", first)
    captured = harness.capture(NEAR)
    outcome = harness.admit(captured["candidate_id"])["outcome"]
    assert outcome["status"] == "pending_adjudication"
    shown = inspection.pending_show(harness.engine, context().scope, captured["candidate_id"], OPS)
    assert shown["resembles"] == [first]


def test_an_index_that_cannot_be_asked_holds_the_decision_back(harness: Harness) -> None:
    harness.remember(FACT)
    captured = harness.capture(NEAR)
    args = _args(captured["candidate_id"], "admit-index-down-01")
    if _index_deferred(harness):
        harness.index.available = False
        envelope = harness.call("request_admission", args)
        assert (envelope["error"]["code"], envelope["error"]["retriable"]) == (
            "RANKING_UNAVAILABLE",
            True,
        )
        row = harness.store.candidate_get(context().scope, captured["candidate_id"])
        assert (row.state, row.held) == ("pending", None)
        assert (
            harness.store.ledger_get(context().scope, context().principal, args["idempotency_key"])
            is None
        )
        harness.index.available = True
    value = harness.ok("request_admission", args)
    assert (value["outcome"]["status"], value["replayed"]) == ("pending_adjudication", False)

"""The operations plane: an operator resolves candidates held for adjudication."""

from __future__ import annotations

from typing import Any

import pytest

from engram_memory.contract.errors import EngramError
from engram_memory.engine.context import Scope
from engram_memory.engine.gate import FORM_ANSWER
from engram_memory.engine.kernel import Kernel
from engram_memory.engine.ports import ProjectionChange
from engram_memory.engine.usecases.transitions import LifecycleOperation
from engram_memory.operator_plane import decisions, inspection, repair
from engram_memory.operator_plane.decisions import adjudicate
from engram_memory.operator_plane.inspection import NOT_RECORDED

from engram_testing import PRINCIPAL, PURPOSE, TENANT, Harness, ScriptedPolicy, context


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


# -- the operations API: inspection -----------------------------------------------------------

OPS = "ops-ana"


def _scope() -> Scope:
    return context().scope


def _operator_lines(harness: Harness) -> list[tuple[str, str, bool, str]]:
    return [
        (event.tool, event.principal, event.ok, event.code)
        for event in harness.audit.events
        if event.tool.startswith("admin.")
    ]


def test_pending_list_and_show_open_a_held_candidate_for_the_operator_and_audit_it(
    harness: Harness,
) -> None:
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    text = "Held for review: the canary stage runs for forty minutes."
    captured = harness.capture(text)
    harness.admit(captured["candidate_id"])
    listed = inspection.pending_list(harness.engine, _scope(), OPS)
    assert [row["candidate_id"] for row in listed] == [captured["candidate_id"]]
    assert [row["first_line"] for row in listed] == [text]  # opened for the operator, audited
    shown = inspection.pending_show(harness.engine, _scope(), captured["candidate_id"], OPS)
    assert shown["record"]["components"][0]["text"] == text
    assert shown["candidate"]["record_digest"] == shown["record"]["record_digest"]
    assert _operator_lines(harness) == [
        ("admin.pending_list", "operator:ops-ana", True, "OK"),
        ("admin.pending_show", "operator:ops-ana", True, "OK"),
    ]
    assert text not in repr(harness.audit.events)
    outcome = decisions.adjudicate(
        harness.engine, _scope(), captured["candidate_id"], "accept", OPS, reason="checked"
    )
    assert outcome["status"] == "accepted"
    assert inspection.pending_list(harness.engine, _scope(), OPS) == []
    with pytest.raises(EngramError) as gone:
        inspection.pending_show(harness.engine, _scope(), captured["candidate_id"], OPS)
    assert gone.value.code.value == "NOT_FOUND"
    assert _operator_lines(harness)[-1] == (
        "admin.pending_show",
        "operator:ops-ana",
        False,
        "NOT_FOUND",
    )


def test_records_list_show_and_history_follow_a_record_through_its_life(
    harness: Harness,
) -> None:
    record_id = harness.remember("The nightly backup runs at 02:00 UTC.")
    listed = inspection.records_list(harness.engine, _scope(), OPS)
    assert [(row["record_id"], row["state"]) for row in listed] == [(record_id, "accepted_current")]
    decisions.transition(harness.engine, _scope(), record_id, "dispute", OPS, "contested")
    assert inspection.records_list(harness.engine, _scope(), OPS, state="accepted_current") == []
    shown = inspection.record_show(harness.engine, _scope(), record_id, OPS)
    assert shown["state"] == "accepted_disputed"
    assert shown["record"]["components"][0]["text"] == "The nightly backup runs at 02:00 UTC."
    history = inspection.record_history(harness.engine, _scope(), record_id, OPS)
    assert [event["operation"] for event in history] == ["capture", "admit", "dispute"]
    assert [event["cursor"] for event in history] == ["1", "2", "3"]
    assert "02:00" not in repr(history)


def test_the_consoles_list_opens_each_records_first_line_and_never_a_forgotten_ones(
    harness: Harness,
) -> None:
    """``with_text``: the text's first line (cut at a word), its kind and source, its author;
    a forgotten record has none, and the audit line counts the bodies opened, never text."""
    kept = harness.remember("Deploys freeze on Fridays.\nSecurity fixes still go out at once.")
    long = harness.remember("The incident review covers " + "timeline and remedies, " * 10)
    forgotten = harness.remember("The vendor's private pricing sheet lives on the shared drive.")
    decisions.forget_record(harness.engine, _scope(), forgotten, OPS, "not ours to keep")
    listed = {
        row["record_id"]: row
        for row in inspection.records_list(harness.engine, _scope(), OPS, with_text=True)
    }
    body = inspection.record_show(harness.engine, _scope(), kept, OPS)["record"]
    assert listed[kept]["excerpt"] == {
        "text": "Deploys freeze on Fridays…",
        "kind": body["components"][0]["kind"],
        "source": body["citations"][0]["source_ref"],
    }
    assert listed[kept]["principal"] == context().principal
    cut = listed[long]["excerpt"]["text"]
    assert cut.endswith("remedies…") and len(cut) <= inspection.EXCERPT_CHARS + 1
    assert listed[forgotten]["state"] == "tombstoned"
    assert listed[forgotten]["excerpt"] is None
    assert "pricing" not in repr(listed)
    line = [e for e in harness.audit.events if e.tool == "admin.records_list"][-1]
    assert line.digests["bodies_opened"] == "2"
    assert "Deploys" not in repr(harness.audit.events)


def _why(step: dict[str, object]) -> tuple[object, ...]:
    return (step["operation"], step["actor"], step["reason"], step["approved_by"])


def test_the_history_says_who_forgot_or_withdrew_why_and_who_approved(harness: Harness) -> None:
    """Issue 38, item 2: an agent's forget and withdraw are journaled with the agent's
    ``reason_ref`` and the person who approved (whatever the store: the cloud's ledger cannot
    say who committed a step, the event does); an operator's with the operator's reason."""
    terminal = "operator:ops-dana at the terminal"
    harness.confirmations.doctor = lambda a: a.model_copy(update={"approved_by": terminal})
    record_id = harness.remember("The nightly backup runs at 02:00 UTC.")
    assert harness.forget(record_id)["ok"]
    history = inspection.record_history(harness.engine, _scope(), record_id, OPS)
    assert _why(history[-1]) == ("tombstone", PRINCIPAL, "reason:obsolete", terminal)
    assert [_why(step)[2:] for step in history[:2]] == [(None, None), (None, None)]

    harness.confirmations.doctor = lambda a: a.model_copy(update={"approved_by": FORM_ANSWER})
    draft = harness.capture("A draft the agent takes back.")["candidate_id"]
    assert harness.withdraw(draft)["ok"]
    history = inspection.record_history(harness.engine, _scope(), draft, OPS)
    assert [_why(step) for step in history][1:] == [
        ("withdraw", PRINCIPAL, "reason:mistake", "form answered by the client")
    ]

    other = harness.remember("The staging cluster rotates certificates weekly.")
    decisions.forget_record(harness.engine, _scope(), other, OPS, "erasure request")
    last = inspection.record_history(harness.engine, _scope(), other, OPS)[-1]
    assert _why(last) == ("tombstone", "operator:ops-ana", "erasure request", None)


def test_a_forget_journaled_before_events_kept_why_reads_not_recorded(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events written before they kept the reason and the approver still read: the history
    says those are not recorded rather than leaving them blank."""
    original = Kernel.journal_step

    def as_before(self: Kernel, *args: Any, **_why: Any) -> Any:
        return original(self, *args[:6])  # no ``why``: the event as it was written before

    record_id = harness.remember("The nightly backup runs at 02:00 UTC.")
    monkeypatch.setattr(Kernel, "journal_step", as_before)
    assert harness.forget(record_id)["ok"]
    monkeypatch.undo()
    (step,) = inspection.record_history(harness.engine, _scope(), record_id, OPS)[-1:]
    assert "reason_ref" not in step and "by" not in step
    assert (step["operation"], step["reason"], step["approved_by"]) == (
        "tombstone",
        NOT_RECORDED,
        NOT_RECORDED,
    )


# -- the lifecycle of §4 ------------------------------------------------------------------------


def _reveals(harness: Harness, record_id: str, query: str) -> tuple[bool, bool]:
    found = [p["record"]["record_id"] for p in harness.search(query)["records"]]
    return record_id in found, harness.get(record_id)["ok"]


@pytest.mark.parametrize(
    ("operation", "state"),
    [
        ("dispute", "accepted_disputed"),
        ("supersede", "historical"),
        ("expire", "expired"),
        ("trust_invalidate", "trust_invalid"),
    ],
)
def test_a_record_leaving_current_disappears_from_search_and_get(
    harness: Harness, operation: LifecycleOperation, state: str
) -> None:
    record_id = harness.remember("The staging cluster rotates certificates weekly.")
    assert _reveals(harness, record_id, "staging certificates") == (True, True)
    output = decisions.transition(harness.engine, _scope(), record_id, operation, OPS, "why")
    assert output["receipt"]["from_state"] == "accepted_current"
    assert output["receipt"]["to_state"] == state
    assert output["receipt"]["operation"] == operation
    assert _reveals(harness, record_id, "staging certificates") == (False, False)
    assert not any(surface.contains(_scope(), record_id) for surface in harness.engine.surfaces)
    exported = list(inspection.export_records(harness.engine, _scope(), OPS))
    assert exported == []


def test_resolving_a_dispute_brings_the_record_back(harness: Harness) -> None:
    record_id = harness.remember("The staging cluster rotates certificates weekly.")
    decisions.transition(harness.engine, _scope(), record_id, "dispute", OPS, "contested")
    resolved = decisions.transition(harness.engine, _scope(), record_id, "resolve", OPS, "ok")
    assert (resolved["receipt"]["from_state"], resolved["receipt"]["to_state"]) == (
        "accepted_disputed",
        "accepted_current",
    )
    assert _reveals(harness, record_id, "staging certificates") == (True, True)


def test_supersede_names_a_current_successor(harness: Harness) -> None:
    old = harness.remember("Deploys need two approvals.")
    new = harness.remember("Deploys need three approvals since the audit.")
    decisions.transition(
        harness.engine, _scope(), old, "supersede", OPS, "policy change", superseded_by=new
    )
    history = inspection.record_history(harness.engine, _scope(), old, OPS)
    assert history[-1]["digests"]["superseded_by"] == new
    with pytest.raises(EngramError) as unknown:
        decisions.transition(
            harness.engine,
            _scope(),
            new,
            "supersede",
            OPS,
            "x",
            superseded_by="mem_" + "a" * 20,
        )
    assert unknown.value.code.value == "NOT_FOUND"


def test_transitions_the_lifecycle_forbids_are_refused(harness: Harness) -> None:
    record_id = harness.remember()
    with pytest.raises(EngramError) as illegal:
        decisions.transition(harness.engine, _scope(), record_id, "resolve", OPS, "why")
    assert illegal.value.code.value == "ILLEGAL_TRANSITION"
    assert harness.forget(record_id)["ok"]
    with pytest.raises(EngramError) as terminal:
        decisions.transition(harness.engine, _scope(), record_id, "dispute", OPS, "why")
    assert terminal.value.code.value == "ALREADY_TERMINAL"
    with pytest.raises(EngramError) as blank:
        decisions.transition(harness.engine, _scope(), record_id, "dispute", OPS, " ")
    assert blank.value.code.value == "INVALID_SCHEMA"


_INTO: dict[str, list[LifecycleOperation]] = {
    "accepted_current": [],
    "accepted_disputed": ["dispute"],
    "historical": ["supersede"],
    "expired": ["expire"],
    "trust_invalid": ["dispute", "trust_invalidate"],
}


@pytest.mark.parametrize("state", sorted(_INTO))
def test_forget_works_from_each_of_the_five_states_and_says_so(
    harness: Harness, state: str
) -> None:
    record_id = harness.remember("A memory to forget from one of the five states.")
    for operation in _INTO[state]:
        decisions.transition(harness.engine, _scope(), record_id, operation, OPS, "setup")
    forgotten = harness.forget(record_id)
    assert forgotten["ok"], forgotten
    receipt = forgotten["output"]["value"]["receipt"]
    assert (receipt["from_state"], receipt["to_state"]) == (state, "tombstoned")
    row = harness.store.record_get(_scope(), record_id)
    assert row.state == "tombstoned" and row.body is None


def test_an_operator_forgets_and_withdraws_with_receipts(harness: Harness) -> None:
    record_id = harness.remember("The old on-call rota lives in the wiki.")
    decisions.transition(harness.engine, _scope(), record_id, "expire", OPS, "stale")
    forgotten = decisions.forget_record(harness.engine, _scope(), record_id, OPS, "request #7")
    assert forgotten["receipt"]["from_state"] == "expired"
    assert forgotten["projection_invalidation"] == "complete"
    other = context(principal="agent-other")
    captured = harness.capture("A draft by another agent.", other)
    key_ref = harness.store.candidate_get(_scope(), captured["candidate_id"]).key_ref
    withdrawn = decisions.withdraw_candidate(
        harness.engine, _scope(), captured["candidate_id"], OPS, "not wanted"
    )
    assert withdrawn["receipt"]["to_state"] == "withdrawn"
    assert withdrawn["key_destruction"] == "complete"
    assert not harness.vault.key_exists(key_ref)
    with pytest.raises(EngramError) as again:
        decisions.withdraw_candidate(
            harness.engine, _scope(), captured["candidate_id"], OPS, "twice"
        )
    assert again.value.code.value == "ALREADY_TERMINAL"


def test_an_operator_withdraws_only_a_pending_candidate_as_an_agent_would(harness: Harness) -> None:
    record_id = harness.remember("Admitted already: a withdraw is the wrong transition.")
    admitted = harness.store.record_get(_scope(), record_id).candidate_id
    for candidate_id, code in (
        (admitted, "ILLEGAL_TRANSITION"),
        ("cand_00000000000000000000000000", "NOT_FOUND"),
    ):
        with pytest.raises(EngramError) as refused:
            decisions.withdraw_candidate(harness.engine, _scope(), candidate_id, OPS, "why")
        assert refused.value.code.value == code
        # the agent's own withdraw answers the same (the one rule of transitions.withdrawable)
        if candidate_id == admitted:
            assert harness.withdraw(candidate_id)["error"]["code"] == code


# -- status and export ----------------------------------------------------------------------------


def test_status_counts_states_and_reports_index_and_key_store_health(harness: Harness) -> None:
    kept = harness.remember("Status: the current record.")
    disputed = harness.remember("Status: the disputed record.")
    decisions.transition(harness.engine, _scope(), disputed, "dispute", OPS, "why")
    pending = harness.capture("Status: a pending candidate.")
    report = inspection.status(harness.engine, _scope(), OPS)
    assert report["records"] == {"accepted_current": 1, "accepted_disputed": 1}
    assert report["candidates"] == {"admitted": 2, "pending": 1}
    assert report["outbox"] == {}
    assert report["index"]["fresh"] and report["index"]["current_records_checked"] == 1
    assert report["key_store"] == {
        "health": "ok",
        "checked": "the first 1000 of each (--full: all)",
        "pending_checked": 1,
        "records_checked": 2,
        "records_without_key": 0,
        "unreadable": [],
        "unreadable_total": 0,
    }
    harness.vault.destroy(harness.store.candidate_get(_scope(), pending["candidate_id"]).key_ref)
    for surface in harness.engine.surfaces:
        surface.apply(_scope(), ProjectionChange(delete_record_id=kept))
    report = inspection.status(harness.engine, _scope(), OPS, full=True)
    assert report["key_store"]["health"] == "keys_missing"
    assert report["key_store"]["checked"] == "all"
    assert report["key_store"]["unreadable"] == [
        {"candidate_id": pending["candidate_id"], "code": "BLOB_MISSING"}
    ]
    assert report["index"]["missing_from_index"] == 1 and not report["index"]["fresh"]


def test_export_holds_the_current_records_with_their_admission_receipts(
    harness: Harness,
) -> None:
    record_id = harness.remember("Export me: the release notes live in docs/releases.")
    forgotten = harness.remember("Do not export: a forgotten memory.")
    harness.forget(forgotten)
    lines = list(inspection.export_records(harness.engine, _scope(), OPS))
    assert [line["record"]["record_id"] for line in lines] == [record_id]
    admission = lines[0]["receipts"]["admission"]
    assert admission["record_digest"] == lines[0]["record"]["record_digest"]
    assert admission["event_id"].startswith("evt_") and admission["decision_receipt_digest"]
    assert "forgotten memory" not in repr(lines)
    scope = _scope()
    assert repair.verify_all(harness.engine) == {f"{scope.tenant_id}/{scope.workspace_id}": 5}


# -- revocation -------------------------------------------------------------------------------------


def test_revoked_tokens_answer_authorization_revoked_in_every_composition(
    harness: Harness,
) -> None:
    issued = harness.clock.now_ms() - 1000
    token_a = context(credential_id="jti-a", credential_issued_at_ms=issued)
    token_b = context(credential_id="jti-b", credential_issued_at_ms=issued)
    record_id = harness.remember("Revocation: a shared memory.")
    assert harness.get(record_id, token_a)["ok"]
    decisions.revoke_credentials(harness.engine, TENANT, OPS, token_id="jti-a")
    assert harness.error("search", {"query": "x", "purpose_ref": PURPOSE}, token_a) == (
        "AUTHORIZATION_REVOKED"
    )
    assert harness.get(record_id, token_b)["ok"]
    decisions.revoke_credentials(harness.engine, TENANT, OPS, principal=token_b.principal)
    assert harness.get(record_id, token_b)["error"]["code"] == "AUTHORIZATION_REVOKED"
    harness.clock.advance(5_000)
    later = context(credential_id="jti-c", credential_issued_at_ms=harness.clock.now_ms())
    assert harness.get(record_id, later)["ok"]  # minted after the revocation
    assert harness.get(record_id)["ok"]  # no credential: nothing to revoke
    first = decisions.revoke_credentials(harness.engine, TENANT, OPS, token_id="jti-z")
    harness.clock.advance(5_000)
    again = decisions.revoke_credentials(harness.engine, TENANT, OPS, token_id="jti-z")
    assert again == {**first, "already_revoked": True}  # the first time stands
    assert [e.tool for e in harness.audit.events if e.tool.startswith("admin.")] == [
        "admin.revoke"
    ] * 4
    with pytest.raises(EngramError):
        decisions.revoke_credentials(harness.engine, TENANT, OPS)

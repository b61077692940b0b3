"""Sealed record bodies on both adapter sets: the canonical store holds no record's text, each
record has its own key (``RecordKeys``), and forget destroys it in the same flow that drops the
record's projections, so a copy of the store taken before the forget opens nothing."""

from __future__ import annotations

import dataclasses

import pytest

from engram_memory.engine.ports import SealIntegrityError, is_sealed_body

from engram_testing import Harness, ScriptedPolicy, context

TEXT = "The quarterly archive lives in the cobalt-heron bucket."


def test_an_admitted_body_is_sealed_under_its_own_key_and_reads_back(harness: Harness) -> None:
    record_id = harness.remember(TEXT)
    row = harness.store.record_get(context().scope, record_id)
    assert row.body is not None and is_sealed_body(row.body)
    assert b"cobalt-heron" not in row.body and b"quarterly" not in row.body
    assert harness.record_keys.key_exists(context().scope, record_id)
    assert harness.get(record_id)["output"]["value"]["record"]["record_id"] == record_id
    assert [p["record"]["record_id"] for p in harness.search("cobalt heron")["records"]] == [
        record_id
    ]


def test_a_body_moved_to_another_record_fails_authentication(harness: Harness) -> None:
    first = harness.remember(TEXT)
    second = harness.remember("The staging cluster restarts at noon on Fridays.")
    scope = context().scope
    moved = harness.store.record_get(scope, first).body
    with pytest.raises(SealIntegrityError):
        harness.record_keys.open_many(scope, {second: moved})
    assert harness.record_keys.open_many(scope, {first: moved})  # in its own place it opens


def test_forget_destroys_the_record_key_and_an_earlier_copy_opens_nothing(
    harness: Harness,
) -> None:
    scope = context().scope
    record_id = harness.remember(TEXT)
    before_forget = harness.store.record_get(scope, record_id)  # what a backup would hold

    assert harness.forget(record_id)["ok"]

    assert not harness.record_keys.key_exists(scope, record_id)
    assert harness.record_keys.open_many(scope, {record_id: before_forget.body}) == {}
    # Put the old row back as a restore would: the record stays forgotten.
    engine = harness.engine
    assert engine.bodies(scope, [before_forget]) == {}
    assert engine.project(scope, record_id, before_forget, engine.surfaces) is False
    assert harness.search("cobalt heron")["records"] == []


def test_withdraw_and_rejection_destroy_the_key_made_for_the_record_at_capture(
    harness: Harness,
) -> None:
    scope = context().scope
    withdrawn = harness.capture(TEXT)
    admitted_later = harness.store.candidate_get(scope, withdrawn["candidate_id"])
    assert harness.withdraw(withdrawn["candidate_id"])["ok"]
    assert not harness.record_keys.key_exists(scope, admitted_later.record_id)

    harness.engine.policy = ScriptedPolicy("reject")
    rejected = harness.capture("The rejected memory mentions the amber-kestrel host.")
    candidate = harness.store.candidate_get(scope, rejected["candidate_id"])
    assert harness.admit(rejected["candidate_id"])["outcome"]["status"] == "rejected"
    assert not harness.record_keys.key_exists(scope, candidate.record_id)


def test_records_of_one_scope_are_not_opened_with_another_scopes_keys(harness: Harness) -> None:
    record_id = harness.remember(TEXT)
    row = harness.store.record_get(context().scope, record_id)
    other = dataclasses.replace(context().scope, workspace_id="another-workspace")
    assert harness.record_keys.open_many(other, {record_id: row.body}) == {}


def test_a_hit_whose_key_is_gone_is_skipped_not_an_error(harness: Harness) -> None:
    # An index that still holds a record whose key is destroyed (a canonical store restored
    # beside an index that was not rebuilt): search answers without it, get says NOT_FOUND.
    scope = context().scope
    gone = harness.remember("The heron-ledger lists every cobalt bucket.")
    kept = harness.remember("The heron-ledger is archived each quarter.")
    harness.record_keys.destroy(scope, gone)
    found = harness.search("heron ledger")
    assert [packet["record"]["record_id"] for packet in found["records"]] == [kept]
    assert harness.get(gone)["error"]["code"] == "NOT_FOUND"
    first = harness.search("heron ledger", limit=1)
    pages = [packet["record"]["record_id"] for packet in first["records"]]
    if "next_page_cursor" in first:
        more = harness.search("heron ledger", limit=1, page_cursor=first["next_page_cursor"])
        pages += [packet["record"]["record_id"] for packet in more["records"]]
    assert pages == [kept]

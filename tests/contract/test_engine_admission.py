"""Behaviour of request_admission: policy decisions, envelopes, the tombstone guard."""

from __future__ import annotations

import json
import logging

import pytest

from engram_memory.contract.canonical import digest
from engram_memory.contract.outputs import RequestAdmissionOutput
from engram_memory.contract.types import format_instant

from engram_testing import Harness, ScriptedPolicy, context


def test_an_accepting_policy_promotes_the_candidate_to_a_record(harness: Harness) -> None:
    captured = harness.capture()
    value = harness.admit(captured["candidate_id"])
    RequestAdmissionOutput.model_validate(value)
    outcome = value["outcome"]
    assert outcome["status"] == "accepted"
    assert outcome["record_id"].startswith("mem_") and len(outcome["record_id"]) == 56
    assert value["replayed"] is False
    got = harness.get(outcome["record_id"])
    assert (
        got["ok"] and got["output"]["value"]["record"]["record_digest"] == captured["record_digest"]
    )


def test_admission_keeps_the_candidate_data_key_until_its_record_is_forgotten(
    harness: Harness,
) -> None:
    # A backup taken while the candidate was pending holds its ciphertext: the key must outlive
    # the admission for that backup to restore what was acknowledged (issue 24), and go with
    # the record so the backup cannot bring forgotten text back.
    captured = harness.capture()
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    assert harness.vault.key_exists(row.key_ref)
    record_id = harness.admit(captured["candidate_id"])["outcome"]["record_id"]
    assert harness.vault.key_exists(row.key_ref)
    assert harness.forget(record_id)["ok"]
    assert not harness.vault.key_exists(row.key_ref)


def test_a_rejecting_policy_rejects_and_shreds(harness: Harness) -> None:
    harness.engine.policy = ScriptedPolicy("reject")
    captured = harness.capture()
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    outcome = harness.admit(captured["candidate_id"])["outcome"]
    assert outcome["status"] == "rejected" and "record_id" not in outcome
    assert not harness.vault.key_exists(row.key_ref)
    assert harness.search("deploy staging")["records"] == []


def test_manual_adjudication_answers_pending_adjudication_and_stores_only_the_hold(
    harness: Harness,
) -> None:
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    captured = harness.capture()
    head = harness.store.head(context().scope)
    value = harness.admit(captured["candidate_id"], key="admit-key-000010")
    outcome = value["outcome"]
    assert outcome["status"] == "pending_adjudication" and "record_id" not in outcome
    assert outcome["cursor"] == str(head.cursor)  # no event: the receipt quotes the head
    assert harness.store.head(context().scope) == head
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    assert (row.state, row.held) == ("pending", outcome["decision_receipt_digest"])
    entry = harness.store.ledger_get(context().scope, context().principal, "admit-key-000010")
    assert json.loads(entry.output) == value
    assert harness.search("deploy staging")["records"] == []


def test_the_decision_receipt_digest_binds_the_decision_envelope(harness: Harness) -> None:
    captured = harness.capture()
    outcome = harness.admit(captured["candidate_id"])["outcome"]
    policy = harness.engine.policy
    envelope = {
        "policy_id": policy.policy_id,
        "policy_version": policy.version(),
        "record_digest": captured["record_digest"],
        "decision": "accept",
        "issued_at": format_instant(harness.clock.now),
    }
    assert outcome["decision_receipt_digest"] == digest("admission-decision", envelope)


def test_admission_replay_returns_the_stored_outcome(harness: Harness) -> None:
    captured = harness.capture()
    first = harness.admit(captured["candidate_id"], key="admit-key-000001")
    again = harness.admit(captured["candidate_id"], key="admit-key-000001")
    assert again["replayed"] is True
    assert again["outcome"] == first["outcome"]


def test_admission_of_an_unknown_or_decided_candidate_is_not_found(harness: Harness) -> None:
    unknown = "candidate_" + "0" * 64
    args = {"candidate_id": unknown, "idempotency_key": "admit-key-000002"}
    assert harness.error("request_admission", args) == "NOT_FOUND"
    captured = harness.capture()
    harness.admit(captured["candidate_id"])
    again = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-key-000003"}
    assert harness.error("request_admission", again) == "NOT_FOUND"


def test_another_principal_cannot_admit_my_candidate(harness: Harness) -> None:
    captured = harness.capture()
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-key-000004"}
    assert harness.error("request_admission", args, context(principal="agent-bob")) == "NOT_FOUND"


def test_policy_down_is_policy_unavailable_and_the_candidate_stays_pending(
    harness: Harness,
) -> None:
    pending = harness.capture()
    policy = ScriptedPolicy("accept")
    policy.unavailable = True
    harness.engine.policy = policy
    args = {"candidate_id": pending["candidate_id"], "idempotency_key": "admit-key-000005"}
    envelope = harness.call("request_admission", args)
    assert envelope["error"] == {
        "code": "POLICY_UNAVAILABLE",
        "message": envelope["error"]["message"],
        "retriable": True,
    }
    assert harness.store.candidate_get(context().scope, pending["candidate_id"]).state == "pending"


def test_a_policy_version_moving_during_the_decision_is_policy_stale(harness: Harness) -> None:
    captured = harness.capture()
    policy = ScriptedPolicy("accept")
    policy.move_version_during_decide = True
    harness.engine.policy = policy
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-key-000006"}
    assert harness.error("request_admission", args) == "POLICY_STALE"
    assert harness.store.candidate_get(context().scope, captured["candidate_id"]).state == "pending"


def test_the_agent_cannot_supply_the_decision(harness: Harness) -> None:
    captured = harness.capture()
    args = {
        "candidate_id": captured["candidate_id"],
        "idempotency_key": "admit-key-000007",
        "decision": "accept",
    }
    assert harness.error("request_admission", args) == "INVALID_SCHEMA"


def test_capture_of_an_aws_key_is_sealed_then_rejected_without_echoing_it(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    access_key = "AKIA" + "QZ7RT4MX2PLK9WNB"
    secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY"
    text = f"Deploy creds: aws_access_key_id={access_key} aws_secret_access_key={secret_key}"
    envelope = harness.admission(text, "admit-key-000008")
    assert envelope["output"]["value"]["outcome"]["status"] == "rejected"
    _assert_nowhere(harness, envelope, access_key, secret_key)
    assert access_key not in caplog.text and secret_key not in caplog.text


def test_capture_of_a_private_key_is_rejected_without_echoing_it(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7" + "q" * 40
    pem = f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----"
    envelope = harness.admission(f"Server key follows:\n{pem}", "admit-key-000009")
    assert envelope["output"]["value"]["outcome"]["status"] == "rejected"
    _assert_nowhere(harness, envelope, body)
    assert body not in caplog.text


def _assert_nowhere(harness: Harness, envelope: object, *secrets: str) -> None:
    surfaces = [repr(envelope), repr(harness.audit.events), repr(harness.store.table_snapshot())]
    for secret in secrets:
        for surface in surfaces:
            assert secret not in surface

"""Behaviour of withdraw and forget: confirmation, receipts, shredding, the tombstone guard."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aws_cryptographic_material_providers.mpl import AwsCryptographicMaterialProviders
from aws_encryption_sdk.exceptions import AWSEncryptionSDKClientError

from engram_memory.contract.errors import TrustedContextUnavailable
from engram_memory.contract.outputs import ForgetOutput, WithdrawOutput
from engram_memory.engine.gate import Approval, ConfirmationNeeded
from engram_memory.engine.ports import CandidateRow, KeyDestroyed, SealedBlob

from engram_testing import Harness, ScriptedPolicy, capture_args, context


def test_forget_tombstones_and_the_record_disappears_at_once(harness: Harness) -> None:
    record_id = harness.remember("The VPN gateway lives in eu-west-1.")
    envelope = harness.forget(record_id)
    value = envelope["output"]["value"]
    ForgetOutput.model_validate(value)
    receipt = value["receipt"]
    assert receipt["operation"] == "tombstone"
    assert receipt["from_state"] == "accepted_current" and receipt["to_state"] == "tombstoned"
    assert value["projection_invalidation"] == "complete" and value["coverage_receipt_digest"]
    assert harness.search("VPN gateway")["records"] == []
    assert harness.get(record_id)["error"]["code"] == "NOT_FOUND"
    assert not harness.index.contains(context().scope, record_id)
    row = harness.store.record_get(context().scope, record_id)
    assert row.state == "tombstoned" and row.body is None  # body shredded, digests kept


def test_forgotten_content_never_comes_back(harness: Harness) -> None:
    text = "The old billing API key rotation schedule is monthly."
    original = harness.capture(text, key="original-capture-01")
    record_id = harness.admit(original["candidate_id"])["outcome"]["record_id"]
    assert harness.forget(record_id)["ok"]

    again = harness.capture(text, key="recapture-key-0001")
    assert again["status"] == "committed_pending"
    outcome = harness.admit(again["candidate_id"])["outcome"]
    assert outcome["status"] == "pending_adjudication" and "record_id" not in outcome

    harness.engine.policy = ScriptedPolicy("reject")
    third = harness.capture(text, key="recapture-key-0002")
    assert harness.admit(third["candidate_id"])["outcome"]["status"] == "rejected"

    replay = harness.capture(text, key="original-capture-01")
    assert replay["status"] == "duplicate_exact"
    assert replay["candidate_id"] == original["candidate_id"]
    assert harness.search("billing rotation")["records"] == []


def test_forget_replay_and_already_terminal(harness: Harness) -> None:
    record_id = harness.remember()
    first = harness.forget(record_id, key="forget-key-000001")["output"]["value"]
    again = harness.forget(record_id, key="forget-key-000001")["output"]["value"]
    assert again["replayed"] is True and again["receipt"] == first["receipt"]
    assert len(harness.confirmations.requests) == 1  # no second confirmation on replay
    assert harness.forget(record_id, key="forget-key-000002")["error"]["code"] == "ALREADY_TERMINAL"


def test_forget_of_an_unknown_record_is_not_found_before_asking_anyone(harness: Harness) -> None:
    assert harness.forget("mem_" + "a" * 56)["error"]["code"] == "NOT_FOUND"
    assert harness.confirmations.requests == []


def test_withdraw_ends_a_pending_candidate_and_shreds_it(harness: Harness) -> None:
    captured = harness.capture("Draft: the office moves in March.")
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    value = harness.withdraw(captured["candidate_id"], key="withdraw-key-00001")["output"]["value"]
    WithdrawOutput.model_validate(value)
    receipt = value["receipt"]
    assert (receipt["from_state"], receipt["to_state"], receipt["operation"]) == (
        "pending",
        "withdrawn",
        "withdraw",
    )
    assert value["key_destruction"] == "complete"
    with pytest.raises(KeyDestroyed):
        harness.vault.open(context().scope, captured["candidate_id"], _blob(row))
    _assert_undecryptable_by_any_held_key(harness, row.sealed)
    replay = harness.withdraw(captured["candidate_id"], key="withdraw-key-00001")["output"]["value"]
    assert replay["replayed"] is True and replay["key_destruction"] == "complete"
    assert harness.withdraw(captured["candidate_id"])["error"]["code"] == "ALREADY_TERMINAL"


def test_withdraw_of_an_admitted_candidate_is_illegal(harness: Harness) -> None:
    captured = harness.capture()
    harness.admit(captured["candidate_id"])
    assert harness.withdraw(captured["candidate_id"])["error"]["code"] == "ILLEGAL_TRANSITION"


def test_withdraw_of_unknown_or_foreign_candidates_is_not_found_identically(
    harness: Harness,
) -> None:
    captured = harness.capture()
    foreign = harness.withdraw(captured["candidate_id"], ctx=context(principal="agent-bob"))
    unknown = harness.withdraw("candidate_" + "f" * 64)
    assert foreign["error"] == unknown["error"] and foreign["error"]["code"] == "NOT_FOUND"
    assert {k for k in foreign if k != "auditId"} == {k for k in unknown if k != "auditId"}


def _approved_elsewhere(approval: Approval) -> Approval:
    return approval.model_copy(update={"target": "candidate_" + "e" * 64})


def _approved_for_another_tool(approval: Approval) -> Approval:
    return approval.model_copy(update={"tool": "forget"})


def _earlier(issued_ms: int, approved_ms: int) -> Callable[[Approval], Approval]:
    """The approval as if issued and approved that many milliseconds earlier."""

    def doctor(approval: Approval) -> Approval:
        assert approval.approved_at_ms is not None  # doctored after the human approved
        return approval.model_copy(
            update={
                "issued_at_ms": approval.issued_at_ms - issued_ms,
                "approved_at_ms": approval.approved_at_ms - approved_ms,
            }
        )

    return doctor


_expired = _earlier(301_000, 1_000)
_executed_late = _earlier(40_000, 31_000)


@pytest.mark.parametrize(
    "doctor",
    [_approved_elsewhere, _approved_for_another_tool, _expired, _executed_late],
    ids=["other-target", "other-tool", "expired", "executed-late"],
)
def test_a_confirmation_that_does_not_bind_is_gate_failed_and_changes_nothing(
    harness: Harness, doctor: Callable[[Approval], Approval]
) -> None:
    captured = harness.capture()
    harness.confirmations.doctor = doctor
    before = harness.store.table_snapshot()
    assert harness.withdraw(captured["candidate_id"])["error"]["code"] == "gate_failed"
    assert harness.store.table_snapshot() == before


def test_a_declined_confirmation_is_gate_failed_and_changes_nothing(harness: Harness) -> None:
    record_id = harness.remember()
    harness.confirmations.mode = "decline"
    before = harness.store.table_snapshot()
    envelope = harness.forget(record_id)
    assert envelope["error"] == {
        "code": "gate_failed",
        "message": envelope["error"]["message"],
        "retriable": False,
    }
    assert harness.store.table_snapshot() == before
    harness.confirmations.mode = "approve"
    assert harness.get(record_id)["ok"]


def test_a_reused_approval_is_gate_failed(harness: Harness) -> None:
    first = harness.capture(key="reuse-capture-0001")
    second = harness.capture(key="reuse-capture-0002")
    assert harness.withdraw(first["candidate_id"])["ok"]
    used = harness.confirmations.last
    assert used is not None
    harness.confirmations.fixed = used.model_copy(update={"target": second["candidate_id"]})
    # Same approval id, now even bound to the right target: single use still refuses it.
    assert harness.withdraw(second["candidate_id"])["error"]["code"] == "gate_failed"


def test_a_declined_approval_is_spent_and_never_commits_later(harness: Harness) -> None:
    """CONTRACT.md §8: a question is spent by its first answer, a decline too (both stores)."""
    record_id = harness.remember()
    harness.confirmations.mode = "decline"
    assert harness.forget(record_id)["error"]["code"] == "gate_failed"
    (request,) = harness.confirmations.requests
    now = harness.clock.now_ms()
    asked = Approval.of(request, approval_id="rs_" + "d" * 32, issued_at_ms=now, approved_at_ms=now)

    declined = harness.engine.decline("forget", context(), asked)
    assert declined["error"]["code"] == "gate_failed"
    assert harness.audit.events[-1].code == "gate_failed"
    assert harness.audit.events[-1].target == record_id
    assert not harness.store.spend_approval(asked.scope, asked.approval_id)  # already spent

    harness.confirmations.mode = "approve"
    harness.confirmations.fixed = asked  # the same id, approved after the decline
    assert harness.forget(record_id)["error"]["code"] == "gate_failed"
    assert harness.get(record_id)["ok"]


def test_no_confirmation_channel_is_a_protocol_refusal(harness: Harness) -> None:
    record_id = harness.remember()
    harness.confirmations.mode = "no_channel"
    with pytest.raises(TrustedContextUnavailable):
        harness.forget(record_id)


def test_capture_needs_confirmation_when_the_host_says_so(harness: Harness) -> None:
    strict = context(confirm_required=frozenset({"capture"}))
    harness.confirmations.mode = "decline"
    assert harness.error("capture", capture_args(), strict) == "gate_failed"
    harness.confirmations.mode = "approve"
    assert harness.ok("capture", capture_args(), strict)["status"] == "committed_pending"
    assert harness.confirmations.requests[-1].tool == "capture"


def _blob(row: CandidateRow) -> SealedBlob:
    return SealedBlob(row.key_ref, row.sealed)


def _assert_undecryptable_by_any_held_key(harness: Harness, ciphertext: bytes) -> None:
    """Try every key the system still holds as a raw AES wrapping key: all must fail."""
    import aws_encryption_sdk
    from aws_cryptographic_material_providers.mpl.config import MaterialProvidersConfig
    from aws_cryptographic_material_providers.mpl.models import (
        AesWrappingAlg,
        CreateRawAesKeyringInput,
    )

    from engram_memory.adapters.sealing import KEY_NAMESPACE

    client = aws_encryption_sdk.EncryptionSDKClient(
        commitment_policy=aws_encryption_sdk.CommitmentPolicy.REQUIRE_ENCRYPT_REQUIRE_DECRYPT
    )
    mpl = AwsCryptographicMaterialProviders(config=MaterialProvidersConfig())
    candidates = harness.held_keys()
    import re

    key_names = set(re.findall(rb"key_[0-9a-f]{32}", ciphertext))
    assert key_names, "the sealed blob names its key"
    for key in candidates:
        for name in key_names:
            keyring = mpl.create_raw_aes_keyring(
                input=CreateRawAesKeyringInput(
                    key_namespace=KEY_NAMESPACE,
                    key_name=name.decode(),
                    wrapping_key=key,
                    wrapping_alg=AesWrappingAlg.ALG_AES256_GCM_IV12_TAG16,
                )
            )
            with pytest.raises(AWSEncryptionSDKClientError):
                client.decrypt(source=ciphertext, keyring=keyring)


def test_without_an_approval_the_engine_answers_what_to_approve_and_writes_nothing(
    harness: Harness,
) -> None:
    record_id = harness.remember("The nightly export writes to the archive bucket.")
    arguments = {
        "record_id": record_id,
        "idempotency_key": "forget-as-data-0001",
        "reason_ref": "reason:obsolete",
    }
    head = harness.store.head(context().scope)

    needed = harness.engine.handle("forget", arguments, context())

    assert isinstance(needed, ConfirmationNeeded)
    assert (needed.request.tool, needed.request.target) == ("forget", record_id)
    assert harness.store.head(context().scope) == head  # nothing written
    assert harness.get(record_id)["ok"] is True
    approval = Approval.of(
        needed.request,
        approval_id="apr_" + "a" * 32,
        issued_at_ms=harness.clock.now_ms(),
        approved_at_ms=harness.clock.now_ms(),
    )
    committed = harness.engine.handle("forget", arguments, context(), approval)
    assert not isinstance(committed, ConfirmationNeeded)
    assert committed["output"]["value"]["receipt"]["to_state"] == "tombstoned"
    assert committed["output"]["value"]["replayed"] is False


def test_an_approval_past_the_execution_window_is_gate_failed(harness: Harness) -> None:
    record_id = harness.remember("The audit trail is kept for seven years.")
    arguments = {
        "record_id": record_id,
        "idempotency_key": "forget-late-00001",
        "reason_ref": "reason:obsolete",
    }
    needed = harness.engine.handle("forget", arguments, context())
    assert isinstance(needed, ConfirmationNeeded)
    now = harness.clock.now_ms()
    approval = Approval.of(
        needed.request, approval_id="apr_" + "b" * 32, issued_at_ms=now, approved_at_ms=now
    )
    harness.clock.advance(30_001)

    late = harness.engine.handle("forget", arguments, context(), approval)

    assert not isinstance(late, ConfirmationNeeded)
    assert late["error"]["code"] == "gate_failed"
    assert harness.get(record_id)["ok"] is True


def test_an_approval_given_to_a_call_that_needs_none_authorizes_nothing(
    harness: Harness,
) -> None:
    record_id = harness.remember("The on-call rotation changes on Mondays.")
    forget = {"record_id": record_id, "idempotency_key": "forget-key-unused", "reason_ref": "r:x"}
    needed = harness.engine.handle("forget", forget, context())
    assert isinstance(needed, ConfirmationNeeded)
    now = harness.clock.now_ms()
    approval = Approval.of(
        needed.request, approval_id="apr_" + "c" * 32, issued_at_ms=now, approved_at_ms=now
    )
    # a capture needs no approval here: the one given is ignored, not consumed
    captured = harness.engine.handle(
        "capture", capture_args("Unrelated note.", key="capture-with-approval"), context(), approval
    )
    assert not isinstance(captured, ConfirmationNeeded) and captured["ok"]
    forgotten = harness.engine.handle("forget", forget, context(), approval)
    assert not isinstance(forgotten, ConfirmationNeeded)
    assert forgotten["output"]["value"]["receipt"]["to_state"] == "tombstoned"

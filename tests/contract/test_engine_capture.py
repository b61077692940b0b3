"""Behaviour of capture: sealed pending candidates, idempotency, retention and validation."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from engram_memory.contract.outputs import CaptureOutput
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import RetentionPolicy

from engram_testing import PURPOSE, START_MS, Harness, capture_args, context


def test_capture_commits_a_pending_candidate(harness: Harness) -> None:
    value = harness.ok("capture", capture_args())
    CaptureOutput.model_validate(value)
    assert value["status"] == "committed_pending"
    assert value["candidate_id"].startswith("candidate_")
    assert value["cursor"] == "1"


def test_same_key_and_content_replays_the_identical_acknowledgement(harness: Harness) -> None:
    first = harness.ok("capture", capture_args())
    harness.clock.advance(5_000)
    again = harness.ok("capture", capture_args())
    assert again["status"] == "duplicate_exact"
    assert {k: v for k, v in again.items() if k != "status"} == {
        k: v for k, v in first.items() if k != "status"
    }
    assert harness.store.head(context().scope).cursor == 1  # no new event


def test_replay_keeps_the_retention_resolved_the_first_time(harness: Harness) -> None:
    expires = format_instant(START_MS + 3_600_000)
    args = capture_args(retention={"derivative_rule": "make-ineligible", "expires_at": expires})
    first = harness.ok("capture", args)
    strict_host = context(retention=RetentionPolicy(max_expires_in_s=60))
    again = harness.ok("capture", args, strict_host)
    assert again["status"] == "duplicate_exact"
    assert again["record_digest"] == first["record_digest"]


def test_same_key_with_changed_text_is_a_digest_conflict_and_writes_nothing(
    harness: Harness,
) -> None:
    harness.ok("capture", capture_args())
    before = harness.store.head(context().scope)
    assert harness.error("capture", capture_args("Different text entirely.")) == "DIGEST_CONFLICT"
    assert harness.store.head(context().scope) == before


def test_a_capture_key_reused_for_withdraw_is_a_digest_conflict(harness: Harness) -> None:
    captured = harness.ok("capture", capture_args(key="shared-key-0000001"))
    assert harness.withdraw(captured["candidate_id"], key="shared-key-0000001")["error"][
        "code"
    ] == ("DIGEST_CONFLICT")


def test_the_same_key_from_another_principal_is_a_different_candidate(harness: Harness) -> None:
    alice = harness.ok("capture", capture_args())
    bob = harness.ok("capture", capture_args(), context(principal="agent-bob"))
    assert bob["status"] == "committed_pending"
    assert bob["candidate_id"] != alice["candidate_id"]


def _mutate(args: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    result = copy.deepcopy(args)
    node: Any = result
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is _DELETE:
        del node[last]
    else:
        node[int(last) if last.isdigit() else last] = value
    return result


_DELETE = object()

INVALID_CAPTURES = {
    "an extra top-level field": ("confirmed", True),
    "an extra payload field": ("payload.note", "x"),
    "a null optional field": ("payload.retention", None),
    "a 15-byte idempotency key": ("idempotency_key", "k" * 15),
    "a 257-byte idempotency key": ("idempotency_key", "k" * 257),
    "a non-NFC ref": ("payload.purpose_ref", "purpose:cafe\u0301"),
    "t_end before t": ("payload.valid_time", {"t": 10, "t_end": 9}),
    "an impossible date": (
        "payload.citations.0.observed_at",
        "2026-04-31T10:00:00.000Z",
    ),
    "a boolean where an integer is due": ("payload.valid_time", {"t": True}),
    "a primary event citing a citation outside the primary component": (
        "payload.primary_event.citation_id",
        "citation:other",
    ),
}


@pytest.mark.parametrize("case", sorted(INVALID_CAPTURES))
def test_malformed_captures_are_invalid_schema(harness: Harness, case: str) -> None:
    path, value = INVALID_CAPTURES[case]
    args = capture_args()
    if case.startswith("a primary event"):
        args["payload"]["citations"].append(
            {
                "citation_id": "citation:other",
                "source_ref": "source:other",
                "locator": {"scheme": "document", "value": "other"},
                "content_digest": "sha256:" + "b" * 64,
            }
        )
    assert harness.error("capture", _mutate(args, path, value)) == "INVALID_SCHEMA"
    assert harness.store.head(context().scope).cursor == 0


def test_a_malformed_digest_is_invalid_digest(harness: Harness) -> None:
    args = _mutate(capture_args(), "evidence.evidence_digest", "sha256:" + "A" * 64)
    assert harness.error("capture", args) == "INVALID_DIGEST"


def test_arguments_over_one_mebibyte_are_invalid_schema(harness: Harness) -> None:
    components = [
        {
            "component_id": f"component:{i}",
            "kind": "context",
            "text": "x" * 60_000,
            "citation_ids": ["citation:source"],
        }
        for i in range(18)
    ]
    components[0]["component_id"] = "component:decision"
    args = _mutate(capture_args(), "payload.components", components)
    assert harness.error("capture", args) == "INVALID_SCHEMA"


def test_expires_at_equal_to_the_capture_instant_is_invalid_schema(harness: Harness) -> None:
    retention = {
        "derivative_rule": "make-ineligible",
        "expires_at": format_instant(harness.clock.now),
    }
    assert harness.error("capture", capture_args(retention=retention)) == "INVALID_SCHEMA"


def test_expires_at_beyond_the_host_ceiling_is_unauthorized(harness: Harness) -> None:
    beyond = format_instant(harness.clock.now + 366 * 86_400_000)
    retention = {"derivative_rule": "make-ineligible", "expires_at": beyond}
    assert harness.error("capture", capture_args(retention=retention)) == "UNAUTHORIZED"


def test_retain_without_host_permission_is_unauthorized(harness: Harness) -> None:
    args = capture_args(retention={"derivative_rule": "retain"})
    assert harness.error("capture", args) == "UNAUTHORIZED"
    permitted = context(retention=RetentionPolicy(allow_retain=True))
    assert harness.ok("capture", args, permitted)["status"] == "committed_pending"


def test_reconciliation_families_without_consent_are_unauthorized(harness: Harness) -> None:
    args = capture_args(reconciliation={"family_refs": ["family:a", "family:b"]})
    assert harness.error("capture", args) == "UNAUTHORIZED"
    assert (
        harness.ok("capture", args, context(reconcile_consent=True))["status"]
        == "committed_pending"
    )


def test_a_purpose_mismatch_is_a_protocol_refusal(harness: Harness) -> None:
    from engram_memory.contract.errors import TrustedContextUnavailable

    with pytest.raises(TrustedContextUnavailable):
        harness.call("capture", capture_args(purpose="purpose:other"))


def test_the_sealed_candidate_holds_no_plaintext(harness: Harness) -> None:
    secret_text = "The launch codename is BLUEHERON-7731 and it stays internal."
    value = harness.ok("capture", capture_args(secret_text))
    row = harness.store.candidate_get(context().scope, value["candidate_id"])
    assert row is not None and row.state == "pending"
    assert b"BLUEHERON" not in row.sealed
    dump = repr(harness.store.table_snapshot())
    assert "BLUEHERON" not in dump


def test_purpose_ref_is_required_to_match_the_token_for_search_and_get(harness: Harness) -> None:
    from engram_memory.contract.errors import TrustedContextUnavailable

    with pytest.raises(TrustedContextUnavailable):
        harness.call("search", {"query": "x", "purpose_ref": "purpose:other"})
    with pytest.raises(TrustedContextUnavailable):
        harness.call("get", {"record_id": "mem_abc", "purpose_ref": "purpose:other"})
    assert context().purpose_ref == PURPOSE


def test_a_passed_deadline_is_deadline_exceeded_and_writes_nothing(harness: Harness) -> None:
    late = context(deadline_ms=harness.clock.now)
    envelope = harness.call("capture", capture_args(), late)
    assert (
        envelope["error"]["code"] == "DEADLINE_EXCEEDED" and envelope["error"]["retriable"] is True
    )
    assert harness.store.head(context().scope).cursor == 0


def test_a_cancelled_call_is_cancelled_and_writes_nothing(harness: Harness) -> None:
    from engram_memory.engine.context import CancellationFlag

    flag = CancellationFlag()
    flag.cancel()
    assert harness.error("capture", capture_args(), context(cancellation=flag)) == "CANCELLED"
    assert harness.store.head(context().scope).cursor == 0

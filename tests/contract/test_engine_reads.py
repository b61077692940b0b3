"""Behaviour of search and get: only current accepted records, receipts, redaction, paging."""

from __future__ import annotations

from typing import Any

import pytest

from engram_memory.contract.canonical import digest, digest_without
from engram_memory.contract.outputs import GetOutput, SearchOutput
from engram_memory.contract.types import format_instant
from engram_memory.engine import lexical

from engram_testing import START_MS, Harness, ScriptedPolicy, capture_args, context


def test_a_pending_candidate_is_never_returned_by_search_or_get(harness: Harness) -> None:
    captured = harness.capture("Pending: rotate the staging database nightly.")
    assert harness.search("rotate staging database")["records"] == []
    record_id = harness.admit(captured["candidate_id"])["outcome"]["record_id"]
    found = harness.search("rotate staging database")
    assert [p["record"]["record_id"] for p in found["records"]] == [record_id]


def test_get_of_a_pending_record_id_is_not_found_before_admission(harness: Harness) -> None:
    harness.engine.policy = ScriptedPolicy("adjudication_required")
    captured = harness.capture()
    row = harness.store.candidate_get(context().scope, captured["candidate_id"])
    assert harness.get(row.record_id)["error"]["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    ("valid_time", "retention"),
    [
        ({"t": START_MS + 86_400_000}, None),  # validity has not started
        ({"t": START_MS - 86_400_000, "t_end": START_MS - 1}, None),  # validity has ended
        (
            {"t": START_MS - 86_400_000},
            {"derivative_rule": "make-ineligible", "expires_at": format_instant(START_MS + 1_000)},
        ),
    ],
    ids=["not-yet-valid", "ended", "expired"],
)
def test_records_outside_valid_time_or_expired_are_not_returned(
    harness: Harness, valid_time: dict[str, int], retention: dict[str, str] | None
) -> None:
    extra: dict[str, Any] = {"retention": retention} if retention else {}
    args = capture_args(
        "Quarterly budget review moved to Thursday.", key="capture-window-01", **extra
    )
    args["payload"]["valid_time"] = valid_time
    args["payload"]["primary_event"]["at"] = valid_time["t"]
    captured = harness.ok("capture", args)
    record_id = harness.admit(captured["candidate_id"])["outcome"]["record_id"]
    if retention:
        assert harness.search("quarterly budget")["records"]  # visible until it expires
        harness.clock.advance(1_000)
    assert harness.search("quarterly budget")["records"] == []
    assert harness.get(record_id)["error"]["code"] == "NOT_FOUND"


def test_search_returns_packets_with_redaction_and_a_rank_receipt(harness: Harness) -> None:
    record_id = harness.remember("Use WAL mode so readers never block the single writer.")
    value = harness.search("WAL readers writer")
    SearchOutput.model_validate(value)
    packet = value["records"][0]
    assert packet["rank"] == 1 and packet["score"] > 0
    assert packet["record"]["record_id"] == record_id
    assert packet["redacted_fields"] == sorted(packet["redacted_fields"])
    assert "/scope_ref" in packet["redacted_fields"] and "scope_ref" not in packet["record"]
    receipt = value["rank_receipt"]
    assert receipt["profile"] == lexical.PROFILE
    # time-aware by default (engine/temporal.py): the 2.1.0 profile
    assert (receipt["profile_version"], receipt["profile_config_digest"]) == (
        lexical.receipt_profile(True)
    )
    assert receipt["candidate_count"] == 1
    assert receipt["receipt_digest"] == digest_without("rank-receipt", receipt, "receipt_digest")
    assert value["response_digest"] == digest_without("search-response", value, "response_digest")
    assert receipt["ordered_ids_digest"] == digest("ordered-ids", [record_id])


def test_ranking_follows_the_field_weights_and_breaks_ties_by_record_id(harness: Harness) -> None:
    harness.without_quality_gate()
    strong = harness.remember("kestrel kestrel migration notes")
    weak = harness.remember(
        "unrelated words about kestrel once, plus a lot of other filler text here"
    )
    ids = [p["record"]["record_id"] for p in harness.search("kestrel")["records"]]
    assert ids == [strong, weak]
    twin_a = harness.remember("identical twin phrase", key="twin-capture-0001")
    twin_b = harness.remember("identical twin phrase", key="twin-capture-0002")
    twins = [p["record"]["record_id"] for p in harness.search("twin phrase")["records"]]
    assert twins == sorted([twin_a, twin_b])


def test_empty_query_terms_mean_no_match_not_an_error(harness: Harness) -> None:
    harness.remember()
    assert harness.search("?!")["records"] == []


def test_lexical_and_semantic_without_a_semantic_channel_is_ranking_unavailable(
    harness: Harness,
) -> None:
    args = {
        "query": "deploy",
        "purpose_ref": context().purpose_ref,
        "capability_policy": {"minimum_channels": "lexical_and_semantic", "network": "forbid"},
    }
    assert harness.error("search", args) == "RANKING_UNAVAILABLE"


def test_get_returns_the_record_with_a_read_receipt(harness: Harness) -> None:
    record_id = harness.remember()
    envelope = harness.get(record_id)
    value = envelope["output"]["value"]
    GetOutput.model_validate(value)
    assert value["record"]["record_id"] == record_id
    receipt = value["read_receipt"]
    assert receipt["record_id"] == record_id and receipt["checked_at"] == format_instant(START_MS)
    assert receipt["receipt_digest"] == digest_without("read-receipt", receipt, "receipt_digest")
    assert value["packet_digest"] == digest_without("get-packet", value, "packet_digest")
    assert envelope["redactionClass"] == "high" and envelope["auditId"]


def test_paging_continues_ranks_and_a_forgotten_record_makes_the_cursor_stale(
    harness: Harness,
) -> None:
    harness.without_quality_gate()
    ids = [
        harness.remember(f"shared topic number {i} about gardening", key=f"page-capture-{i:05d}")
        for i in range(7)
    ]
    first = harness.search("gardening topic", limit=3)
    assert [p["rank"] for p in first["records"]] == [1, 2, 3]
    second = harness.search("gardening topic", limit=3, page_cursor=first["next_page_cursor"])
    assert [p["rank"] for p in second["records"]] == [4, 5, 6]
    assert second["rank_receipt"]["valid_as_of"] == first["rank_receipt"]["valid_as_of"]
    assert harness.forget(ids[0])["ok"]
    args = {
        "query": "gardening topic",
        "purpose_ref": context().purpose_ref,
        "limit": 3,
        "page_cursor": second["next_page_cursor"],
    }
    assert harness.error("search", args) == "STALE_PAGE"


@pytest.mark.parametrize("cursor", ["garbage", "a.b", "eyJ2IjoxfQ.AAAA"])
def test_a_cursor_that_does_not_verify_is_stale_page(harness: Harness, cursor: str) -> None:
    args = {"query": "x", "purpose_ref": context().purpose_ref, "page_cursor": cursor}
    assert harness.error("search", args) == "STALE_PAGE"


def test_a_cursor_for_another_query_or_scope_is_stale_page(harness: Harness) -> None:
    harness.without_quality_gate()
    for i in range(3):
        harness.remember(f"orchard apples variety {i}", key=f"orchard-capture-{i:04d}")
    first = harness.search("orchard apples", limit=1)
    cursor = first["next_page_cursor"]
    other_query = {
        "query": "orchard",
        "purpose_ref": context().purpose_ref,
        "limit": 1,
        "page_cursor": cursor,
    }
    assert harness.error("search", other_query) == "STALE_PAGE"
    same_query = {
        "query": "orchard apples",
        "purpose_ref": context().purpose_ref,
        "limit": 1,
        "page_cursor": cursor,
    }
    assert harness.error("search", same_query, context(principal="agent-bob")) == "STALE_PAGE"


def test_a_record_larger_than_max_packet_bytes_is_projection_oversized(harness: Harness) -> None:
    record_id = harness.remember("lighthouse " * 900)
    args = {"query": "lighthouse", "purpose_ref": context().purpose_ref, "max_packet_bytes": 4096}
    assert harness.error("search", args) == "PROJECTION_OVERSIZED"
    get_args = {
        "record_id": record_id,
        "purpose_ref": context().purpose_ref,
        "max_packet_bytes": 4096,
    }
    assert harness.error("get", get_args) == "PROJECTION_OVERSIZED"


def test_packets_fill_the_byte_budget_and_the_rest_goes_to_the_next_page(harness: Harness) -> None:
    for i in range(4):
        harness.remember(f"canyon survey {i} " + "detail " * 250, key=f"canyon-capture-{i:04d}")
    page = harness.search("canyon survey", max_packet_bytes=4_500 * 2)
    assert 1 <= len(page["records"]) < 4
    assert "next_page_cursor" in page


def test_a_response_over_the_transport_ceiling_is_result_too_large(harness: Harness) -> None:
    harness.without_quality_gate()
    import dataclasses

    for i in range(3):
        harness.remember(f"meadow survey {i} " + "detail " * 400, key=f"meadow-capture-{i:04d}")
    harness.engine.settings = dataclasses.replace(
        harness.engine.settings, transport_ceiling_bytes=8_000
    )
    args = {
        "query": "meadow survey",
        "purpose_ref": context().purpose_ref,
        "max_packet_bytes": 16_384,
    }
    assert harness.error("search", args) == "RESULT_TOO_LARGE"
    narrow = {**args, "limit": 1}
    assert harness.ok("search", narrow)["records"]

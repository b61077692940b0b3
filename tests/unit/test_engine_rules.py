"""Unit rules of the engine: the confirmation gate, page cursors, redaction, the analyzer."""

from __future__ import annotations

import pytest

from engram_memory.contract.errors import EngramError
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.gate import (
    APPROVAL_TTL_MS,
    EXECUTION_WINDOW_MS,
    Approval,
    ConfirmationRequest,
    check_approval,
)
from engram_memory.engine.paging import PageState, decode_cursor, encode_cursor
from engram_memory.engine.redaction import DEFAULT_ALLOWLIST, RedactionPolicy, redact

SCOPE = Scope("t", "w")
REQUEST = ConfirmationRequest(
    "forget", "mem_x", "sha256:" + "1" * 64, "alice", SCOPE, "reason:x", "summary"
)
APPROVAL = Approval(
    approval_id="apr_1",
    tool="forget",
    target="mem_x",
    operation_digest="sha256:" + "1" * 64,
    principal="alice",
    tenant_id=SCOPE.tenant_id,
    workspace_id=SCOPE.workspace_id,
    issued_at_ms=1_000,
    approved_at_ms=2_000,
)


def test_a_bound_timely_approval_passes() -> None:
    check_approval(APPROVAL, REQUEST, 2_000 + EXECUTION_WINDOW_MS)


@pytest.mark.parametrize(
    "change",
    [
        {"tool": "withdraw"},
        {"target": "mem_y"},
        {"operation_digest": "sha256:" + "2" * 64},
        {"principal": "bob"},
        {"workspace_id": "other"},
        {"tenant_id": "t2"},
        {"approved_at_ms": 500},  # approved before it was asked
    ],
)
def test_an_approval_bound_to_anything_else_fails(change: dict[str, object]) -> None:
    with pytest.raises(EngramError) as failed:
        check_approval(APPROVAL.model_copy(update=change), REQUEST, 2_000)
    assert failed.value.code.value == "gate_failed"


def test_the_ttl_and_the_execution_window_are_enforced() -> None:
    with pytest.raises(EngramError):
        check_approval(APPROVAL, REQUEST, 2_000 + EXECUTION_WINDOW_MS + 1)
    late_approval = APPROVAL.model_copy(update={"approved_at_ms": 1_000 + APPROVAL_TTL_MS - 10})
    check_approval(late_approval, REQUEST, 1_000 + APPROVAL_TTL_MS)
    with pytest.raises(EngramError):
        check_approval(late_approval, REQUEST, 1_000 + APPROVAL_TTL_MS + 1)


def test_page_cursors_round_trip_and_reject_tampering() -> None:
    state = PageState("sha256:" + "a" * 64, "sha256:" + "b" * 64, 5, "7", "sha256:" + "c" * 64, 10)
    cursor = encode_cursor(state, b"k" * 32)
    assert decode_cursor(cursor, b"k" * 32) == state
    with pytest.raises(EngramError):
        decode_cursor(cursor, b"j" * 32)
    body, tag = cursor.split(".")
    with pytest.raises(EngramError):
        decode_cursor(body[:-2] + "AA." + tag, b"k" * 32)


def test_redaction_keeps_the_allowlist_and_lists_the_rest_sorted() -> None:
    record = {
        "record_id": "mem_a",
        "record_digest": "sha256:" + "d" * 64,
        "scope_ref": "s",
        "payload_digest": "p",
        "components": [],
    }
    policy = RedactionPolicy.from_allowlist(DEFAULT_ALLOWLIST)
    kept, redacted, receipt = redact(record, policy)
    assert kept == {"record_id": "mem_a", "record_digest": "sha256:" + "d" * 64, "components": []}
    assert redacted == ["/payload_digest", "/scope_ref"]
    assert receipt.startswith("sha256:")
    only_id = RedactionPolicy.from_allowlist([])
    assert redact(record, only_id)[0] == {"record_id": "mem_a"}


def test_the_analyzer_folds_case_and_splits_on_non_words() -> None:
    assert lexical.tokens("Straße_WAL-mode, ÉTÉ 2026!") == ["strasse", "wal", "mode", "été", "2026"]
    assert lexical.query_terms("wal WAL Wal mode") == ["wal", "mode"]


def test_the_analyzer_drops_english_stop_words_and_stems_what_remains() -> None:
    assert lexical.analyze("When did she paint the sunsets? She's painting; he painted.") == [
        "paint",
        "sunset",
        "paint",
        "paint",
    ]
    assert lexical.query_terms("What is it?") == []  # only stop words: nothing to match
    assert lexical.analyze("Straße 2026") == ["strass", "2026"]


def test_projection_fields_put_the_primary_component_first() -> None:
    record = {
        "primary_component_id": "c1",
        "components": [
            {"component_id": "c1", "kind": "decision", "text": "Primary words"},
            {"component_id": "c2", "kind": "decision", "text": "Other decision"},
            {"component_id": "c3", "kind": "context", "text": "Background"},
        ],
        "citations": [{"source_ref": "source:Design-Doc"}],
    }
    fields = lexical.projection_fields(record)
    assert fields == {
        "primary": "primari word",
        "decision": "decis",  # "other" is a stop word
        "evidence": "",
        "context": "background",
        "citations": "sourc design doc",
    }

"""Behaviour across scopes and principals: nothing crosses a tenant or workspace."""

from __future__ import annotations

from typing import Any

import pytest

from engram_memory.contract.errors import UnknownTool

from engram_testing import OTHER_WORKSPACE, Harness, context


def _without_audit_id(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if k != "auditId"}


def test_a_record_of_workspace_a_is_not_found_from_b_exactly_like_an_unknown_id(
    harness: Harness,
) -> None:
    record_id = harness.remember("Workspace A keeps its incident runbook in the wiki.")
    from_b = harness.get(record_id, context(workspace=OTHER_WORKSPACE))
    unknown = harness.get("mem_" + "b" * 56, context(workspace=OTHER_WORKSPACE))
    assert from_b["error"]["code"] == "NOT_FOUND"
    assert _without_audit_id(from_b) == _without_audit_id(unknown)
    assert from_b["auditId"] != unknown["auditId"]


def test_search_in_workspace_b_never_sees_workspace_a(harness: Harness) -> None:
    harness.remember("Workspace A keeps its incident runbook in the wiki.")
    assert (
        harness.search("incident runbook wiki", context(workspace=OTHER_WORKSPACE))["records"] == []
    )
    assert (
        harness.search("incident runbook wiki", context(tenant="tenant-other-9999"))["records"]
        == []
    )


def test_scores_in_one_workspace_do_not_depend_on_another(harness: Harness) -> None:
    harness.without_quality_gate()
    harness.remember("ferry timetable changes in winter", key="score-capture-001")
    before = harness.search("ferry timetable")["records"][0]["score"]
    other = context(workspace=OTHER_WORKSPACE)
    for i in range(5):
        harness.remember(f"ferry harbour notes {i}", ctx=other, key=f"score-other-{i:05d}")
    assert harness.search("ferry timetable")["records"][0]["score"] == before


def test_forget_from_another_workspace_is_not_found(harness: Harness) -> None:
    record_id = harness.remember()
    assert (
        harness.forget(record_id, ctx=context(workspace=OTHER_WORKSPACE))["error"]["code"]
        == "NOT_FOUND"
    )
    assert harness.get(record_id)["ok"]


def test_accepted_records_are_visible_to_other_principals_of_the_workspace(
    harness: Harness,
) -> None:
    record_id = harness.remember()
    assert harness.get(record_id, context(principal="agent-bob"))["ok"]


@pytest.mark.parametrize("tool", ["search", "capture", "forget", "delete_everything"])
def test_a_tool_not_granted_or_unknown_is_refused_as_unknown_tool(
    harness: Harness, tool: str
) -> None:
    ctx = context(grants=frozenset({"get"}))
    with pytest.raises(UnknownTool):
        harness.call(tool, {}, ctx)


def test_every_call_is_audited_with_digests_and_no_content(harness: Harness) -> None:
    text = "Our SSO provider's support line is staffed weekdays only."
    record_id = harness.remember(text)
    harness.get(record_id)
    harness.get("mem_" + "c" * 56)
    events = harness.audit.events
    assert [e.tool for e in events] == ["capture", "request_admission", "get", "get"]
    assert [e.code for e in events] == ["OK", "OK", "OK", "NOT_FOUND"]
    assert all(e.audit_id.startswith("aud_") and e.principal == "agent-alice" for e in events)
    assert "record_digest" in events[0].digests
    assert "SSO" not in repr(events) and "weekdays" not in repr(events)

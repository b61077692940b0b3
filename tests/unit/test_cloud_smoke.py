"""The smoke command's steps (``engram_memory.cloud.smoke``) against a scripted agent, on a clock
the test moves: no network, no AWS, no wall-clock waits. The whole command runs in the cloud
gate against the built functions (``scripts/cloud_run/operator_smoke.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from engram_memory.cloud.smoke import (
    APPROVAL_WINDOW_S,
    DRAIN_WAIT_S,
    Answer,
    ApprovalLink,
    SmokeFailed,
    SmokeRun,
    capture_arguments,
    parse_report,
    report_lines,
)
from engram_memory.contract.models import CaptureInput

PURPOSE = "purpose:smoke-tests"
LINK = "https://memory.example.com/approvals/apr_0123456789abcdef0123456789abcdef"
TOOLS = ("search", "get", "capture", "request_admission", "withdraw", "forget")


def envelope(value: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "output": {"schema_version": 1, "value": value}, "auditId": "aud_1"}


def refusal(code: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": "…", "retriable": False}}


@dataclass
class Clock:
    """Time as the run sees it: only its own pauses move it."""

    now: float = 0.0
    pauses: int = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.pauses += 1


@dataclass
class Stack:
    """An agent's view of a stack: each gated call links to the page until ``approve_after``
    retries; search keeps finding a forgotten record for ``drain_after`` more searches."""

    approve_after: int = 2
    drain_after: int = 1
    admission: str = "accepted"
    grants: tuple[str, ...] = TOOLS
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    gated: dict[str, int] = field(default_factory=dict)
    forgotten: bool = False

    async def tools(self) -> dict[str, dict[str, Any]]:
        schema = {"properties": {"purpose_ref": {"type": "string", "const": PURPOSE}}}
        return {f"engram_memory_{tool}": schema for tool in self.grants}

    async def call(self, tool: str, arguments: dict[str, Any]) -> Answer:
        self.calls.append((tool, arguments))
        if tool == "capture":
            return envelope({"status": "committed_pending", "candidate_id": "candidate_" + tool})
        if tool == "request_admission":
            outcome = {"status": self.admission, "record_id": "mem_record"}
            return envelope({"outcome": outcome, "replayed": False})
        if tool == "search":
            if self.forgotten and self.drain_after <= 0:
                return envelope({"records": []})
            self.drain_after -= self.forgotten
            return envelope({"records": [{"record": {"record_id": "mem_record"}}]})
        if tool == "get":
            gone = self.forgotten and self.drain_after <= 0
            return (
                refusal("NOT_FOUND") if gone else envelope({"record": {"record_id": "mem_record"}})
            )
        return self.confirm(tool)

    def confirm(self, tool: str) -> Answer:
        self.gated[tool] = self.gated.get(tool, 0) + 1
        if self.gated[tool] <= self.approve_after:
            return ApprovalLink(f"{LINK}-{tool}")
        self.forgotten = self.forgotten or tool == "forget"
        state = "tombstoned" if tool == "forget" else "withdrawn"
        return envelope({"receipt": {"to_state": state}, "replayed": False})


def smoke(stack: Stack, clock: Clock | None = None) -> tuple[SmokeRun, list[str]]:
    said: list[str] = []
    clock = clock or Clock()
    run = SmokeRun(agent=stack, say=said.append, run_id="0a1b2c3d", clock=clock, sleep=clock.sleep)
    return run, said


def test_the_smoke_runs_the_six_tools_in_order_and_ends_what_it_captured() -> None:
    stack = Stack()
    run, said = smoke(stack)

    steps = anyio.run(run.run)

    assert [(s.step, s.ok) for s in steps] == [
        (name, True)
        for name in (
            "connect", "capture", "request_admission", "search", "get", "capture",
            "withdraw", "forget", "drained",
        )
    ]  # fmt: skip
    assert run.left == {}
    assert [tool for tool, _ in stack.calls].count("capture") == 2
    captured = [args for tool, args in stack.calls if tool == "capture"]
    assert all(a["payload"]["purpose_ref"] == PURPOSE for a in captured)
    assert all("smoke run 0a1b2c3d" in a["payload"]["components"][0]["text"] for a in captured)
    assert said[-1].startswith("[ok]   drained")


def test_a_gated_call_prints_the_link_once_and_is_retried_with_the_same_key() -> None:
    stack = Stack(approve_after=3)
    run, said = smoke(stack)

    anyio.run(run.run)

    forgets = [args for tool, args in stack.calls if tool == "forget"]
    assert len(forgets) == 4 and all(a == forgets[0] for a in forgets)
    waits = [line for line in said if line.startswith("[wait] forget")]
    assert len(waits) == 1 and f"{LINK}-forget" in waits[0]


def test_nobody_approving_within_the_window_fails_the_step_and_names_what_is_left() -> None:
    stack = Stack(approve_after=10_000)
    clock = Clock()
    run, said = smoke(stack, clock)

    with pytest.raises(SmokeFailed, match=r"^withdraw: nobody approved within 300 s"):
        anyio.run(run.run)

    assert clock.now >= APPROVAL_WINDOW_S
    assert run.left == {"mem_record": "record", "candidate_capture": "candidate"}
    assert said[-1].startswith("[FAIL] withdraw")


def test_a_held_admission_fails_at_request_admission_saying_why() -> None:
    run, _ = smoke(Stack(admission="pending_adjudication"))

    with pytest.raises(SmokeFailed, match=r"^request_admission: .*pending_adjudication.*manual"):
        anyio.run(run.run)

    assert run.left == {"candidate_capture": "candidate"}


def test_a_token_without_every_tool_fails_at_connect() -> None:
    run, _ = smoke(Stack(grants=("search", "get", "capture")))

    with pytest.raises(SmokeFailed, match=r"^connect: the token does not grant .*withdraw"):
        anyio.run(run.run)


def test_drained_waits_until_search_and_get_no_longer_see_the_record() -> None:
    clock = Clock()
    run, _ = smoke(Stack(drain_after=3), clock)

    anyio.run(run.run)

    assert 0 < clock.now < DRAIN_WAIT_S


def test_the_smokes_capture_is_a_valid_capture_of_the_contract() -> None:
    arguments = capture_arguments(
        "engram-memory smoke run 0a1b2c3d.", "smoke-0a1b2c3d-1", PURPOSE, 1_800_000_000_000
    )

    CaptureInput.model_validate(arguments)
    assert arguments["payload"]["valid_time"]["t"] == 1_800_000_000_000 - 60_000


REPORT = (
    "REPORT RequestId: 3f5a1b2c-0000-4000-8000-000000000001\tDuration: 35.21 ms\t"
    "Billed Duration: 36 ms\tMemory Size: 1024 MB\tMax Memory Used: 97 MB\t"
    "Init Duration: 812.40 ms\t"
)


def test_a_lambda_report_line_is_read_with_its_init_duration() -> None:
    report = parse_report("engram-dev-search", 1_000, REPORT)

    assert report is not None
    assert (report.request_id, report.duration_ms, report.billed_ms) == (
        "3f5a1b2c-0000-4000-8000-000000000001",
        35.21,
        36.0,
    )
    assert (report.memory_mb, report.max_memory_mb, report.init_ms) == (1024, 97, 812.4)
    warm = parse_report("engram-dev-search", 2_000, REPORT.split("\tInit")[0])
    assert warm is not None and warm.init_ms is None
    assert parse_report("engram-dev-search", 3_000, "START RequestId: x Version: $LATEST") is None


def test_the_report_table_totals_invocations_cold_starts_and_billing() -> None:
    cold = parse_report("engram-dev-search", 1_000, REPORT)
    warm = parse_report("engram-dev-get", 2_000, REPORT.split("\tInit")[0])
    assert cold is not None and warm is not None

    lines = report_lines([cold, warm])

    assert "init ms" in lines[0] and "engram-dev-search" in lines[1] and "812.4" in lines[1]
    assert lines[-1].strip() == "2 invocation(s) of 2 function(s), 1 cold start(s), 72 ms billed"
    assert "no REPORT lines yet" in report_lines([])[0]

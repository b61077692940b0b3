"""What the in-process benchmarks share: where the LoCoMo data is, and the trusted context their
``Engine.handle`` calls run under (the embedded host's default tenant and workspace)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.locomo.calls import PURPOSE

REPO = Path(__file__).resolve().parent.parent
# ``../shared`` beside the checkout (as CI lays it out), or beside a parent folder (a worktree).
DEFAULT_LOCOMO = next(
    (p / "shared" / "data" / "locomo" for p in REPO.parents if (p / "shared" / "data").is_dir()),
    REPO.parent / "shared" / "data" / "locomo",
)


def envelope(answer: object) -> dict[str, Any]:
    """``Engine.handle``'s answer as the envelope it is: the benches call no tool that asks for
    an approval, so a ``ConfirmationNeeded`` stops the bench."""
    assert isinstance(answer, dict), answer
    return answer


def bench_context() -> Any:
    """A trusted context for one call: the engine's import stays inside, so a bench that is run
    against another tree (``PYTHONPATH=/tmp/before/layers/core``) gets that tree's class."""
    from engram_memory.engine.context import TrustedContext, new_audit_id

    return TrustedContext(
        tenant_id="local",
        workspace_id="default",
        principal="bench-agent",
        purpose_ref=PURPOSE,
        audit_id=new_audit_id(),
    )


def seeding_policy() -> Any:
    """The built-in policy without its quality gate: the performance benchmarks seed corpora
    that repeat texts on purpose (``bench.hotpath.corpus`` cycles turns) and short turns, and
    measure cost, not admission (``bench.governance.admission`` measures the gate)."""
    from engram_memory.policy.builtin import BuiltinAdmissionPolicy

    return BuiltinAdmissionPolicy(near_duplicates="off", min_text_chars=0)


def remember_all(engine: Any, memories: Iterable[Any], run_id: str) -> list[str]:
    """Capture and admit each of ``memories`` (``bench.hotpath.corpus.Memory``) through
    ``engine.handle``; the record ids, in order. Any refusal stops the bench."""
    record_ids: list[str] = []
    for memory in memories:
        captured = engine.handle("capture", memory.capture_arguments(run_id), bench_context())
        assert captured["ok"], captured
        candidate_id = captured["output"]["value"]["candidate_id"]
        admitted = engine.handle(
            "request_admission", memory.admission_arguments(candidate_id, run_id), bench_context()
        )
        outcome = admitted["output"]["value"]["outcome"]
        assert outcome["status"] == "accepted", outcome
        record_ids.append(outcome["record_id"])
    return record_ids

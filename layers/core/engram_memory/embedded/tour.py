"""``engram-memory tour``: an agent's six tools, end to end, against the real embedded engine.

Capture, search before admission, request_admission, search, get, then a draft withdrawn and the
record forgotten (each confirmation asked at the terminal, or approved with ``--yes``), printing
every envelope.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram_memory.embedded.composition import EmbeddedHost
    from engram_memory.engine.context import TrustedContext
    from engram_memory.engine.gate import ConfirmationRequest

__all__ = ["TOUR_PURPOSE", "TOUR_TENANT", "TOUR_WORKSPACE", "run_tour"]

TOUR_TENANT = "local"
TOUR_WORKSPACE = "default"
TOUR_PURPOSE = "general"


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _ask_terminal(request: ConfirmationRequest) -> bool:
    print("\n--- confirmation needed ---------------------------------", file=sys.stderr)
    print(request.summary, file=sys.stderr)
    try:
        answer = input("Approve? [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in {"y", "yes"}


def _context() -> TrustedContext:
    from engram_memory.engine.context import Scope, TrustedContext

    return TrustedContext.bound(Scope(TOUR_TENANT, TOUR_WORKSPACE), "tour-agent", TOUR_PURPOSE)


def _show(title: str, envelope: dict[str, Any]) -> dict[str, Any]:
    print(f"\n=== {title}")
    print(json.dumps(envelope, indent=2, ensure_ascii=False))
    return envelope


def capture_args(text: str, key: str, now_ms: int) -> dict[str, Any]:
    return {
        "idempotency_key": key,
        "payload": {
            "schema_version": 2,
            "purpose_ref": TOUR_PURPOSE,
            "valid_time": {"t": now_ms - 60_000},
            "components": [
                {"component_id": "c1", "kind": "decision", "text": text, "citation_ids": ["s1"]}
            ],
            "primary_component_id": "c1",
            "primary_event": {
                "at": now_ms - 60_000,
                "type_ref": "event:decided",
                "citation_id": "s1",
            },
            "citations": [
                {
                    "citation_id": "s1",
                    "source_ref": "source:engram-tour",
                    "locator": {"scheme": "document", "value": "tour#1"},
                    "content_digest": _sha(text),
                }
            ],
        },
        "evidence": {
            "evidence_ref": "evidence:tour",
            "evidence_digest": _sha(text),
            "citation_ids": ["s1"],
        },
    }


class _Tour:
    """One walk through the tools: each step calls the engine as the tour's agent and prints."""

    def __init__(self, host: EmbeddedHost) -> None:
        self.host = host
        self.run = f"{int(time.time())}"
        self.now_ms = int(time.time() * 1000)

    def step(self, title: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return _show(title, self.host.call(tool, arguments, _context()))

    def capture(self, title: str, text: str, key: str) -> str:
        captured = self.step(title, "capture", capture_args(text, key, self.now_ms))
        return str(captured["output"]["value"]["candidate_id"])

    def search(self, title: str, **extra: Any) -> None:
        query = {"query": "WAL readers writer", "purpose_ref": TOUR_PURPOSE, **extra}
        self.step(title, "search", query)

    def get(self, title: str, record_id: str) -> None:
        self.step(title, "get", {"record_id": record_id, "purpose_ref": TOUR_PURPOSE})

    def remember(self) -> str | None:
        """Capture, look, admit, look again: the record id (none when the policy said no)."""
        text = f"Tour {self.run}: the embedded store runs SQLite in WAL mode so readers never block the writer."
        candidate_id = self.capture(
            "capture (a sealed, pending candidate)", text, f"tour-capture-{self.run}"
        )
        self.search("search before admission (pending memories are never returned)")
        admitted = self.step(
            "request_admission (the host policy decides)",
            "request_admission",
            {"candidate_id": candidate_id, "idempotency_key": f"tour-admit-{self.run}"},
        )
        self.search("search", limit=3)
        record_id = admitted["output"]["value"]["outcome"].get("record_id")
        return str(record_id) if record_id else None

    def withdraw_a_draft(self) -> None:
        draft = self.capture(
            "capture a draft to withdraw",
            f"Tour {self.run}: a draft that should not be kept.",
            f"tour-draft-{self.run}",
        )
        self.step(
            "withdraw (needs your confirmation; crypto-shreds the candidate)",
            "withdraw",
            {
                "candidate_id": draft,
                "idempotency_key": f"tour-withdraw-{self.run}",
                "reason_ref": "reason:tour-draft",
            },
        )

    def forget(self, record_id: str) -> None:
        self.step(
            "forget (needs your confirmation; the record becomes permanently ineligible)",
            "forget",
            {
                "record_id": record_id,
                "idempotency_key": f"tour-forget-{self.run}",
                "reason_ref": "reason:tour",
            },
        )
        self.get("get after forget", record_id)


def run_tour(data_dir: Path, *, approve_all: bool) -> int:
    from engram_memory.embedded.composition import open_embedded

    host = open_embedded(
        data_dir, ask_human=(lambda _request: True) if approve_all else _ask_terminal
    )
    try:
        tour = _Tour(host)
        record_id = tour.remember()
        if record_id:
            tour.get("get", record_id)
        tour.withdraw_a_draft()
        if record_id:
            tour.forget(record_id)
        print(f"\nAudit log: {(data_dir / 'audit.log').resolve()}")
    finally:
        host.close()
    return 0

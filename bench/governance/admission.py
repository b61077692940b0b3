"""Admission benchmark: precision and recall of the built-in policy's quality gate (issue 27).

Runs a labelled corpus of captures (``corpus/captures.jsonl``, written for this benchmark)
through the real embedded engine (SQLite store, sealed candidates, the host.json defaults):
the ``seed`` items are captured and admitted first, then every other item is captured and
sent to ``request_admission`` in file order. Each item's class says what the gate should do:

- ``duplicate`` (the text of a seed again), ``near_duplicate`` (a seed re-cased, re-punctuated,
  with a filler word or a digit for a number word), ``restatement`` (a seed's fact in other
  words): the near-duplicate rule (held for an operator by default);
- ``secret``: a ``secret:*`` rejection; ``trivia``: the ``low-information`` rejection;
- ``genuine``: a new fact, often on a seed's topic: accepted.

Per class: recall = the share of the class the expected rule caught; precision = the share of
what that rule caught that belongs to the classes it is meant for (the near-duplicate rule's
are duplicate, near_duplicate and restatement). ``genuine_not_accepted`` must be 0.

    python -m bench.governance.admission [--limit N] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.output import write_json

CORPUS = Path(__file__).resolve().parent / "corpus" / "captures.jsonl"
PURPOSE = "purpose:admission-benchmark"
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: every record is valid now
# What each class should get: the rule (its prefix) that is meant to catch it.
EXPECTED = {
    "duplicate": "near-duplicate",
    "near_duplicate": "near-duplicate",
    "restatement": "near-duplicate",
    "secret": "secret:",
    "trivia": "low-information",
    "genuine": "accept",
}
CLASSES = tuple(EXPECTED)


@dataclass(frozen=True)
class Item:
    item_id: str
    label: str
    text: str


def load(path: Path = CORPUS) -> list[Item]:
    """The corpus, in file order."""
    with path.open(encoding="utf-8") as lines:
        return [
            Item(row["id"], row["class"], row["text"])
            for row in (json.loads(line) for line in lines if line.strip())
        ]


def sliced(items: Sequence[Item], limit: int | None) -> list[Item]:
    """Every seed, and at most ``limit`` items of each other class."""
    if limit is None:
        return list(items)
    taken: dict[str, int] = {}
    kept = []
    for item in items:
        if item.label == "seed" or taken.get(item.label, 0) < limit:
            taken[item.label] = taken.get(item.label, 0) + 1
            kept.append(item)
    return kept


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_arguments(item: Item) -> dict[str, Any]:
    citation = {
        "citation_id": "citation:note",
        "source_ref": "bench:governance-admission",
        "locator": {"scheme": "item", "value": item.item_id},
        "content_digest": _sha(item.text),
    }
    component = {
        "component_id": "component:note",
        "kind": "evidence",
        "text": item.text,
        "citation_ids": ["citation:note"],
    }
    return {
        "idempotency_key": f"admission-bench-capture:{item.item_id}",
        "payload": {
            "schema_version": 2,
            "purpose_ref": PURPOSE,
            "valid_time": {"t": START_MS},
            "components": [component],
            "primary_component_id": "component:note",
            "primary_event": {
                "at": START_MS,
                "type_ref": "event:note",
                "citation_id": "citation:note",
            },
            "citations": [citation],
        },
        "evidence": {
            "evidence_ref": f"bench:{item.item_id}",
            "evidence_digest": _sha(item.text),
            "citation_ids": ["citation:note"],
        },
    }


class _Recording:
    """The host's policy, noting the rule of each decision (the agent's outcome has none)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.policy_id = inner.policy_id
        self.rules: list[str] = []

    def version(self) -> str:
        return str(self.inner.version())

    def decide(self, request: Any) -> Any:
        decision = self.inner.decide(request)
        self.rules.append(decision.rule)
        return decision


def _admit(engine: Any, item: Item, ctx: Any) -> str:
    """Capture and ask for admission; the outcome's status."""
    captured = engine.handle("capture", capture_arguments(item), ctx)
    assert captured["ok"], captured
    candidate_id = captured["output"]["value"]["candidate_id"]
    admitted = engine.handle(
        "request_admission",
        {"candidate_id": candidate_id, "idempotency_key": f"admission-bench-admit:{item.item_id}"},
        ctx,
    )
    assert admitted["ok"], admitted
    status: str = admitted["output"]["value"]["outcome"]["status"]
    return status


def run(items: Sequence[Item]) -> dict[str, Any]:
    """Each item through a fresh embedded engine: its status and the rule that decided."""
    from engram_memory.binding.host_config import HostConfig
    from engram_memory.embedded.composition import open_embedded
    from engram_memory.engine.context import TrustedContext, new_audit_id

    config = HostConfig()
    policy = _Recording(config.admission_policy())
    results: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="engram-admission-bench-") as tmp:
        host = open_embedded(Path(tmp), config=config, policy=policy)
        try:
            for item in items:
                ctx = TrustedContext(
                    tenant_id="local",
                    workspace_id="default",
                    principal="bench-agent",
                    purpose_ref=PURPOSE,
                    audit_id=new_audit_id(),
                )
                status = _admit(host.engine, item, ctx)
                if item.label == "seed":
                    assert status == "accepted", (item.item_id, status)
                    continue
                rule = policy.rules[-1]
                results.append(
                    {"id": item.item_id, "class": item.label, "status": status, "rule": rule}
                )
        finally:
            host.close()
    return report(results, config.admission.model_dump(mode="json"))


def _caught(rule: str, label: str) -> bool:
    return rule.startswith(EXPECTED[label])


def report(results: Sequence[dict[str, str]], setting: dict[str, Any]) -> dict[str, Any]:
    """Precision and recall per class, and the genuine facts that were not accepted."""
    per_class: dict[str, dict[str, Any]] = {}
    for label in CLASSES:
        mine = [r for r in results if r["class"] == label]
        rule = EXPECTED[label]
        meant = {c for c in CLASSES if EXPECTED[c] == rule}
        fired = [r for r in results if _caught(r["rule"], label)]
        per_class[label] = {
            "items": len(mine),
            "caught": sum(_caught(r["rule"], label) for r in mine),
            "recall": round(sum(_caught(r["rule"], label) for r in mine) / len(mine), 3)
            if mine
            else None,
            "precision": round(sum(r["class"] in meant for r in fired) / len(fired), 3)
            if fired
            else None,
        }
    genuine_missed = [
        r["id"] for r in results if r["class"] == "genuine" and r["status"] != "accepted"
    ]
    return {
        "corpus": str(CORPUS.name),
        "items": len(results),
        "setting": setting,
        "classes": per_class,
        "genuine_not_accepted": len(genuine_missed),
        "genuine_not_accepted_ids": genuine_missed,
        "missed": [
            {"id": r["id"], "rule": r["rule"]}
            for r in results
            if not _caught(r["rule"], r["class"])
        ],
    }


def table(result: dict[str, Any]) -> str:
    lines = ["| class | items | caught | recall | precision |", "|---|---|---|---|---|"]
    for label, row in result["classes"].items():
        lines.append(
            f"| {label} | {row['items']} | {row['caught']} | {row['recall']} | {row['precision']} |"
        )
    lines.append(f"\ngenuine facts not accepted: {result['genuine_not_accepted']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--limit", type=int, default=None, help="at most N items per class")
    parser.add_argument("--json", type=Path, default=None, help="write the full report here")
    args = parser.parse_args(argv)
    result = run(sliced(load(), args.limit))
    print(table(result))
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

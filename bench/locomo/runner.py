"""Run the LoCoMo retrieval benchmark: ingest every turn through the tools, ask every question.

Each conversation lives in its own workspace. Every turn goes through ``capture`` then
``request_admission`` (``Engine.handle``, the entry point the MCP tools call, or the MCP HTTP
endpoint itself with ``via_mcp``); every question with evidence (categories 1–4) goes through
``search`` with ``limit`` 10, once per profile. A returned record's turn is its ``dia_id``
citation locator.

recall@k = |evidence ∩ top-k turns| / |evidence| averaged over questions; MRR = mean of
1 / rank of the first evidence turn in the top 10 (0 when none is there).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .calls import PURPOSE, Client, value
from .dataset import CATEGORIES, CATEGORY_NAMES, Conversation, capture_arguments, dia_id_of

PROFILES = ("lexical-notime", "lexical", "semantic", "hybrid-notime", "hybrid")
DEPTH = 10
KS = (1, 5, 10)


# --------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------


def question_scores(ranked: Sequence[str], evidence: Sequence[str]) -> dict[str, float]:
    """recall@1/5/10 and reciprocal rank of one question's ranked turns."""
    wanted = set(evidence)
    scores = {f"recall@{k}": len(wanted & set(ranked[:k])) / len(wanted) for k in KS}
    first = next((i for i, turn in enumerate(ranked[:DEPTH], 1) if turn in wanted), None)
    scores["mrr"] = 1.0 / first if first else 0.0
    return scores


def _mean(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    keys = [f"recall@{k}" for k in KS] + ["mrr"]
    return {key: round(statistics.fmean(r[key] for r in rows), 4) if rows else 0.0 for key in keys}


def summarize(rows: Sequence[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    """Overall and per-category means of ``(category, scores)`` rows."""
    summary: dict[str, Any] = {**_mean([s for _, s in rows]), "questions": len(rows)}
    summary["per_category"] = {
        str(c): {
            "name": CATEGORY_NAMES[c],
            "questions": sum(1 for cat, _ in rows if cat == c),
            **_mean([s for cat, s in rows if cat == c]),
        }
        for c in CATEGORIES
    }
    return summary


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    profiles: dict[str, list[tuple[int, dict[str, float]]]] = field(default_factory=dict)
    # the same rows by conversation: the spread a mean hides
    by_conversation: dict[str, dict[str, list[dict[str, float]]]] = field(default_factory=dict)
    search_ms: dict[str, list[float]] = field(default_factory=dict)
    turns: int = 0
    accepted: int = 0
    ingest_s: float = 0.0
    rank_profiles: dict[str, set[str]] = field(default_factory=dict)


def workspace_of(conversation: Conversation) -> str:
    return f"ws-{conversation.name}"


def ingest(client: Client, conversation: Conversation, run: Run) -> None:
    workspace = workspace_of(conversation)
    started = time.perf_counter()
    for turn in conversation.turns:
        captured = value(
            client.call(workspace, "capture", capture_arguments(conversation.name, turn, PURPOSE)),
            "capture",
        )
        admitted = value(
            client.call(
                workspace,
                "request_admission",
                {
                    "candidate_id": captured["candidate_id"],
                    "idempotency_key": f"locomo-admit:{conversation.name}:{turn.dia_id}",
                },
            ),
            "request_admission",
        )
        run.turns += 1
        run.accepted += admitted["outcome"]["status"] == "accepted"
    run.ingest_s += time.perf_counter() - started


def ask(client: Client, profile: str, conversation: Conversation, run: Run) -> None:
    workspace = workspace_of(conversation)
    rows = run.profiles.setdefault(profile, [])
    timings = run.search_ms.setdefault(profile, [])
    for question in conversation.questions:
        arguments = {"query": question.question, "purpose_ref": PURPOSE, "limit": DEPTH}
        started = time.perf_counter()
        result = value(client.call(workspace, "search", arguments), "search")
        timings.append((time.perf_counter() - started) * 1000)
        receipt = result["rank_receipt"]
        run.rank_profiles.setdefault(profile, set()).add(
            f"{receipt['profile']}@{receipt['profile_version']}:{receipt['profile_config_digest']}"
        )
        ranked = [t for p in result["records"] if (t := dia_id_of(p["record"])) is not None]
        scores = question_scores(ranked, question.evidence)
        rows.append((question.category, scores))
        per_profile = run.by_conversation.setdefault(profile, {})
        per_profile.setdefault(conversation.name, []).append(scores)


def report(run: Run, conversations: Sequence[Conversation], via: str) -> dict[str, Any]:
    return {
        "profiles": {
            name: {
                **summarize(rows),
                "rank_receipt_profiles": sorted(run.rank_profiles.get(name, ())),
                "per_conversation": {
                    conversation: {**_mean(scores), "questions": len(scores)}
                    for conversation, scores in run.by_conversation.get(name, {}).items()
                },
            }
            for name, rows in run.profiles.items()
        },
        "throughput": {
            "turns": run.turns,
            "accepted": run.accepted,
            "seconds": round(run.ingest_s, 3),
            "capture_and_admission_per_s": round(run.turns / run.ingest_s, 2)
            if run.ingest_s
            else 0.0,
        },
        "latency_ms": {
            name: {
                "search_p50": round(percentile(ms, 50), 2),
                "search_p99": round(percentile(ms, 99), 2),
            }
            for name, ms in run.search_ms.items()
        },
        "dataset": {
            "conversations": [c.name for c in conversations],
            "questions": sum(len(c.questions) for c in conversations),
            "dropped_evidence_ids": sum(c.dropped_evidence for c in conversations),
        },
        "via": via,
    }


def run_benchmark(
    conversations: Sequence[Conversation],
    profiles: Sequence[str],
    *,
    via_mcp: bool = False,
    data_dir: Path | None = None,
    fusion: str = "minmax",
) -> dict[str, Any]:
    """Ingest every conversation once, then ask every question under each profile."""
    from .clients import open_clients  # the engram_memory imports happen here, not at import

    run = Run()
    with (
        _data_dir(data_dir) as directory,
        open_clients(directory, profiles, via_mcp, fusion) as clients,
    ):
        # Ingest once, through an engine that also writes vectors when a profile needs them.
        ingest_client = clients[
            next((p for p in ("hybrid", "hybrid-notime", "semantic") if p in profiles), profiles[0])
        ]
        for conversation in conversations:
            ingest(ingest_client, conversation, run)
        for profile in profiles:
            for conversation in conversations:
                ask(clients[profile], profile, conversation, run)
    result = report(run, conversations, "mcp-http" if via_mcp else "engine")
    result["fusion"] = fusion
    return result


@contextmanager
def _data_dir(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="engram-locomo-") as tmp:
        yield Path(tmp) / "data"


def table(result: dict[str, Any]) -> str:
    """The human-readable table of a report."""
    lines = [
        f"{'profile':<10} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'MRR':>6}  {'questions':>9}",
    ]
    for name, p in result["profiles"].items():
        lines.append(
            f"{name:<10} {p['recall@1']:>6.3f} {p['recall@5']:>6.3f} {p['recall@10']:>6.3f} "
            f"{p['mrr']:>6.3f}  {p['questions']:>9}"
        )
    lines.append("")
    lines.append(f"{'per category':<24} " + " ".join(f"{n:>17}" for n in result["profiles"]))
    for c in CATEGORIES:
        cells = []
        for p in result["profiles"].values():
            cat = p["per_category"][str(c)]
            cells.append(f"{cat['recall@5']:.3f}/{cat['recall@10']:.3f}/{cat['mrr']:.3f}")
        label = f"{c} {CATEGORY_NAMES[c]} (n={result['profiles'][next(iter(result['profiles']))]['per_category'][str(c)]['questions']})"
        lines.append(f"{label:<24} " + " ".join(f"{cell:>17}" for cell in cells))
    lines.append("(per category: recall@5/recall@10/MRR)")
    lines.append("")
    conversations = list(next(iter(result["profiles"].values())).get("per_conversation", {}))
    lines.append(
        f"{'per conversation R@10':<24} " + " ".join(f"{n:>17}" for n in result["profiles"])
    )
    for conversation in conversations:
        cells = [
            f"{p['per_conversation'][conversation]['recall@10']:.3f}"
            for p in result["profiles"].values()
        ]
        lines.append(f"{conversation:<24} " + " ".join(f"{cell:>17}" for cell in cells))
    lines.append("")
    t = result["throughput"]
    lines.append(
        f"ingest: {t['turns']} turns ({t['accepted']} accepted) in {t['seconds']} s = "
        f"{t['capture_and_admission_per_s']} capture+admission/s (via {result['via']})"
    )
    for name, lat in result["latency_ms"].items():
        lines.append(f"search {name}: p50 {lat['search_p50']} ms, p99 {lat['search_p99']} ms")
    return "\n".join(lines)

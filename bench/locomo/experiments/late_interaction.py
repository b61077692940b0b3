"""Offline variants on LoCoMo: late interaction (MaxSim over the shipped MiniLM's token
embeddings) and an entity channel, fused at score level with the engine's own two lists.

``python -m bench.locomo.experiments.late_interaction [DIR] [--json PATH]`` (needs the semantic
extra; about 8 minutes on 2 cores). One ingestion through the tools (profile ``hybrid-notime``);
every question's lexical and semantic lists and the semantic floor are captured where the engine
fuses them (a wrapper around ``semantic.fuse``); each variant is computed from them. The
recomputed baseline must equal the engine's own answer (it is printed beside it). Figures and
reading: ``bench/locomo/FINDINGS.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_memory.engine import lexical, semantic
from engram_memory.engine.ports import IndexHit

from ..calls import PURPOSE, value
from ..clients import open_clients
from ..dataset import CATEGORIES, capture_arguments, load_dir
from ..runner import question_scores, workspace_of

PROFILE = "hybrid-notime"
captured: list[tuple[list[IndexHit], list[IndexHit], float | None]] = []
original_fuse = semantic.fuse


def spy(
    lexical_hits: Sequence[IndexHit],
    semantic_hits: Sequence[IndexHit],
    fusion: semantic.Fusion,
    semantic_floor: float | None = None,
) -> list[IndexHit]:
    captured.append((list(lexical_hits), list(semantic_hits), semantic_floor))
    return original_fuse(lexical_hits, semantic_hits, fusion, semantic_floor)


Question = tuple[str, Any, list[IndexHit], list[IndexHit], float | None, list[str]]
Rows = list[tuple[str, int, dict[str, float]]]


def ingest_and_ask(
    conversations: Sequence[Any],
) -> tuple[list[Question], dict[str, str], dict[str, tuple[str, str]]]:
    """Every turn captured and admitted, every question searched: the questions (conv, question,
    lex, sem, floor, engine_ranked_dia), record_id -> dia_id and record_id -> (primary, context)."""
    questions: list[Question] = []
    turn_of: dict[str, str] = {}  # record_id -> dia_id (per conversation: key conv:rid)
    text_of: dict[str, tuple[str, str]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_clients(Path(tmp) / "d", [PROFILE], False) as clients,
    ):
        client = clients[PROFILE]
        for c in conversations:
            ws = workspace_of(c)
            for turn in c.turns:
                cap = value(
                    client.call(ws, "capture", capture_arguments(c.name, turn, PURPOSE)), "capture"
                )
                adm = value(
                    client.call(
                        ws,
                        "request_admission",
                        {
                            "candidate_id": cap["candidate_id"],
                            "idempotency_key": f"locomo-admit:{c.name}:{turn.dia_id}",
                        },
                    ),
                    "admission",
                )
                rid = adm["outcome"]["record_id"]
                turn_of[rid] = turn.dia_id
                text_of[rid] = (turn.primary, turn.context)
        for c in conversations:
            ws = workspace_of(c)
            for q in c.questions:
                captured.clear()
                res = value(
                    client.call(
                        ws, "search", {"query": q.question, "purpose_ref": PURPOSE, "limit": 10}
                    ),
                    "search",
                )
                ((lex, sem, floor),) = captured
                ranked = [p["record"]["citations"][0]["locator"]["value"] for p in res["records"]]
                questions.append((c.name, q, lex, sem, floor, ranked))
    return questions, turn_of, text_of


def token_vectors(emb: Any, texts: list[str]) -> list[np.ndarray]:
    """Token embeddings from the shipped encoder (last hidden state, each token L2-normalized)."""
    out = []
    for start in range(0, len(texts), 32):
        hidden, mask = emb._encode(texts[start : start + 32])  # the embedder's own pass
        for row, m in zip(hidden, mask, strict=True):
            v = row[m.astype(bool)]
            out.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12))
    return out


def maxsim(qv: np.ndarray, dv: np.ndarray) -> float:
    return float((qv @ dv.T).max(axis=1).sum())


def minmax(scores: dict[str, float], floor: float | None = None) -> dict[str, float]:
    if not scores:
        return {}
    lo = min(scores.values()) if floor is None else min(floor, *scores.values())
    hi = max(scores.values())
    return {k: (v - lo) / (hi - lo) if hi > lo else 1.0 for k, v in scores.items()}


def entity_scores(
    question: str, cands: list[str], text_of: dict[str, tuple[str, str]]
) -> dict[str, float] | None:
    """The entity channel: capitalized tokens after the first word, the share of them each
    candidate's text holds (None when the question names none)."""
    words = question.replace("?", " ").split()
    ents = [t for w in words[1:] for t in lexical.analyze(w) if w[:1].isupper()]
    ents = list(dict.fromkeys(ents))
    if not ents:
        return None
    ent = {}
    for r in cands:
        terms = set(lexical.analyze(text_of[r][0] + " " + text_of[r][1]))
        ent[r] = sum(e in terms for e in ents) / len(ents)
    return ent


class Variants:
    """Each variant's per-question scores, and the MaxSim cost per query."""

    def __init__(self, turn_of: dict[str, str], text_of: dict[str, tuple[str, str]]) -> None:
        self.turn_of, self.text_of = turn_of, text_of
        self.rows: dict[str, Rows] = {}
        self.cost_ms: list[float] = []

    def ranked_of(self, scores: dict[str, float]) -> list[str]:
        return [self.turn_of[r] for r, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]

    def add(self, name: str, conv: str, q: Any, scores: dict[str, float] | list[str]) -> None:
        ranked = scores if isinstance(scores, list) else self.ranked_of(scores)
        self.rows.setdefault(name, []).append(
            (conv, q.category, question_scores(ranked, q.evidence))
        )

    def score(self, question: Question, qv: np.ndarray, docs: dict[str, dict[str, Any]]) -> None:
        conv, q, lex, sem, floor, engine_ranked = question
        lexs = {h.record_id: h.score for h in lex}
        sems = {h.record_id: h.score for h in sem}
        cands = list(dict.fromkeys([*lexs, *sems]))
        ln, sn = minmax(lexs), minmax(sems, floor)
        base = {r: 0.5 * ln.get(r, 0) + 0.5 * sn.get(r, 0) for r in cands}
        self.add("baseline (engine)", conv, q, engine_ranked)
        self.add("baseline (recomputed)", conv, q, base)
        self.add("lexical alone", conv, q, lexs)
        for label, by_record in docs.items():
            t0 = time.perf_counter()
            ms = {r: maxsim(qv, by_record[r]) for r in cands}
            self.cost_ms.append((time.perf_counter() - t0) * 1000)
            mn = minmax(ms)
            self.add(f"MaxSim alone ({label})", conv, q, ms)
            lex_sem_max = {r: ln.get(r, 0) + sn.get(r, 0) + mn[r] for r in cands}
            self.add(f"(lex + sem + MaxSim {label}) / 3", conv, q, lex_sem_max)
            self.add(
                f"(lex + MaxSim {label}) / 2", conv, q, {r: ln.get(r, 0) + mn[r] for r in cands}
            )
        ent = entity_scores(q.question, cands, self.text_of)
        with_entities = (
            base if ent is None else {r: ln.get(r, 0) + sn.get(r, 0) + ent[r] for r in cands}
        )
        self.add("(lex + sem + entity) / 3", conv, q, with_entities)


def _mean(rows: Rows, key: str) -> float:
    return statistics.fmean(s[key] for *_, s in rows)


def report_of(variants: dict[str, Rows]) -> dict[str, Any]:
    """Each variant's recall@1/5/10 and MRR, recall@10 by conversation and category (printed)."""
    report = {}
    for name, rows in variants.items():
        overall = [round(_mean(rows, k), 3) for k in ("recall@1", "recall@5", "recall@10", "mrr")]
        by_conversation = {
            c: round(_mean([r for r in rows if r[0] == c], "recall@10"), 3)
            for c in sorted({r[0] for r in rows})
        }
        by_category = {
            cat: round(_mean([r for r in rows if r[1] == cat], "recall@10"), 3)
            for cat in CATEGORIES
        }
        report[name] = {
            "all": overall,
            "per_conversation_r10": by_conversation,
            "per_category_r10": by_category,
        }
        print(
            f"{name:<40} {overall}  conv {list(by_conversation.values())}"
            f"  cat {list(by_category.values())}"
        )
    return report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.locomo.experiments.late_interaction")
    parser.add_argument("directory", type=Path, nargs="?", default=Path("../shared/data/locomo"))
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the figures here")
    args = parser.parse_args()
    conversations = load_dir(args.directory)
    semantic.fuse = spy  # reads.py calls semantic.fuse through the module
    questions, turn_of, text_of = ingest_and_ask(conversations)
    print(f"{len(questions)} questions captured", flush=True)

    from engram_memory.adapters.embedder import load_local_embedder

    emb = load_local_embedder()
    rids = list(text_of)
    started = time.perf_counter()
    doc_a = dict(zip(rids, token_vectors(emb, [text_of[r][0] for r in rids]), strict=True))
    per_record_ms = (time.perf_counter() - started) * 1000 / len(rids)
    both = [text_of[r][0] + "\n" + text_of[r][1] for r in rids]
    doc_b = dict(zip(rids, token_vectors(emb, both), strict=True))
    mean_tokens = statistics.fmean(len(v) for v in doc_a.values())
    q_vecs = token_vectors(emb, [q.question for _, q, *_ in questions])

    variants = Variants(turn_of, text_of)
    docs = {"primary": doc_a, "primary+context": doc_b}
    for question, qv in zip(questions, q_vecs, strict=True):
        variants.score(question, qv, docs)
    report = report_of(variants.rows)
    costs = {
        "doc_token_embedding_ms_per_record": round(per_record_ms, 2),
        "mean_tokens_primary": round(mean_tokens, 1),
        "bytes_per_record_float16": round(mean_tokens * 384 * 2),
        "bytes_per_record_int8": round(mean_tokens * 384),
        "maxsim_ms_per_query_over_candidates": round(statistics.median(variants.cost_ms), 2),
        "candidates_per_query": round(
            statistics.fmean(
                len({h.record_id for h in lex} | {h.record_id for h in sem})
                for _, _, lex, sem, _, _ in questions
            ),
            1,
        ),
    }
    print(costs)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps({"variants": report, "costs": costs}, indent=1))


if __name__ == "__main__":
    main()

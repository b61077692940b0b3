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

import numpy as np

from engram_memory.engine import lexical, semantic
from engram_memory.engine.ports import IndexHit

from ..clients import open_clients
from ..dataset import CATEGORIES, capture_arguments, load_dir
from ..runner import PURPOSE, question_scores, value, workspace_of

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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.locomo.experiments.late_interaction")
    parser.add_argument("directory", type=Path, nargs="?", default=Path("../shared/data/locomo"))
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the figures here")
    args = parser.parse_args()
    conversations = load_dir(args.directory)
    semantic.fuse = spy  # reads.py calls semantic.fuse through the module
    questions = []  # (conv, question, lex, sem, floor, engine_ranked_dia)
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
    print(f"{len(questions)} questions captured", flush=True)

    # token embeddings from the shipped encoder (last hidden state, each token L2-normalized)
    from engram_memory.adapters.local.embedder import load_local_embedder

    emb = load_local_embedder()

    def token_vectors(texts: list[str]) -> list[np.ndarray]:
        out = []
        for start in range(0, len(texts), 32):
            hidden, mask = emb._encode(texts[start : start + 32])  # the embedder's own pass
            for row, m in zip(hidden, mask, strict=True):
                v = row[m.astype(bool)]
                out.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12))
        return out

    rids = list(text_of)
    started = time.perf_counter()
    doc_a = dict(zip(rids, token_vectors([text_of[r][0] for r in rids]), strict=True))
    per_record_ms = (time.perf_counter() - started) * 1000 / len(rids)
    doc_b = dict(
        zip(rids, token_vectors([text_of[r][0] + "\n" + text_of[r][1] for r in rids]), strict=True)
    )
    mean_tokens = statistics.fmean(len(v) for v in doc_a.values())
    q_vecs = token_vectors([q.question for _, q, *_ in questions])

    def maxsim(qv: np.ndarray, dv: np.ndarray) -> float:
        return float((qv @ dv.T).max(axis=1).sum())

    def minmax(scores: dict[str, float], floor: float | None = None) -> dict[str, float]:
        if not scores:
            return {}
        lo = min(scores.values()) if floor is None else min(floor, *scores.values())
        hi = max(scores.values())
        return {k: (v - lo) / (hi - lo) if hi > lo else 1.0 for k, v in scores.items()}

    def ranked_of(scores: dict[str, float]) -> list[str]:
        return [turn_of[r] for r, _ in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]

    variants: dict[str, list[tuple[str, int, dict[str, float]]]] = {}

    def add(name: str, conv: str, cat: int, ranked: list[str], evidence: Sequence[str]) -> None:
        variants.setdefault(name, []).append((conv, cat, question_scores(ranked, evidence)))

    cost_ms = []
    for (conv, q, lex, sem, floor, engine_ranked), qv in zip(questions, q_vecs, strict=True):
        lexs = {h.record_id: h.score for h in lex}
        sems = {h.record_id: h.score for h in sem}
        cands = list(dict.fromkeys([*lexs, *sems]))
        ln, sn = minmax(lexs), minmax(sems, floor)
        base = {r: 0.5 * ln.get(r, 0) + 0.5 * sn.get(r, 0) for r in cands}
        add("baseline (engine)", conv, q.category, engine_ranked, q.evidence)
        add("baseline (recomputed)", conv, q.category, ranked_of(base), q.evidence)
        add("lexical alone", conv, q.category, ranked_of(lexs), q.evidence)
        for label, docs in (("primary", doc_a), ("primary+context", doc_b)):
            t0 = time.perf_counter()
            ms = {r: maxsim(qv, docs[r]) for r in cands}
            cost_ms.append((time.perf_counter() - t0) * 1000)
            mn = minmax(ms)
            add(f"MaxSim alone ({label})", conv, q.category, ranked_of(ms), q.evidence)
            add(
                f"(lex + sem + MaxSim {label}) / 3",
                conv,
                q.category,
                ranked_of({r: ln.get(r, 0) + sn.get(r, 0) + mn[r] for r in cands}),
                q.evidence,
            )
            add(
                f"(lex + MaxSim {label}) / 2",
                conv,
                q.category,
                ranked_of({r: ln.get(r, 0) + mn[r] for r in cands}),
                q.evidence,
            )
        # entity channel: capitalized tokens after the first word
        words = q.question.replace("?", " ").split()
        ents = [t for w in words[1:] for t in lexical.analyze(w) if w[:1].isupper()]
        ents = list(dict.fromkeys(ents))
        if ents:
            ent = {}
            for r in cands:
                terms = set(lexical.analyze(text_of[r][0] + " " + text_of[r][1]))
                ent[r] = sum(e in terms for e in ents) / len(ents)
            add(
                "(lex + sem + entity) / 3",
                conv,
                q.category,
                ranked_of({r: ln.get(r, 0) + sn.get(r, 0) + ent[r] for r in cands}),
                q.evidence,
            )
        else:
            add("(lex + sem + entity) / 3", conv, q.category, ranked_of(base), q.evidence)

    def mean(rows: list[tuple[str, int, dict[str, float]]], key: str) -> float:
        return statistics.fmean(s[key] for *_, s in rows)

    report = {}
    for name, rows in variants.items():
        overall = [round(mean(rows, k), 3) for k in ("recall@1", "recall@5", "recall@10", "mrr")]
        by_conversation = {
            c: round(mean([r for r in rows if r[0] == c], "recall@10"), 3)
            for c in sorted({r[0] for r in rows})
        }
        by_category = {
            cat: round(mean([r for r in rows if r[1] == cat], "recall@10"), 3) for cat in CATEGORIES
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
    costs = {
        "doc_token_embedding_ms_per_record": round(per_record_ms, 2),
        "mean_tokens_primary": round(mean_tokens, 1),
        "bytes_per_record_float16": round(mean_tokens * 384 * 2),
        "bytes_per_record_int8": round(mean_tokens * 384),
        "maxsim_ms_per_query_over_candidates": round(statistics.median(cost_ms), 2),
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

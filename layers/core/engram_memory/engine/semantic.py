"""The semantic channel and hybrid ranking profile ``semantic_v1`` (CONTRACT.md §7.1).

**Record vectors.** A record's vector is the field-weighted mean of its components' embeddings,
with the lexical channel's field weights (primary 3.0, decision 2.0, evidence 1.5, context 1.0),
scaled to unit length: ``v = normalize(Σ w_field(c) · embed(c.text))``. The primary component
dominates as it does in BM25F, and context still pulls the vector toward what surrounds the
memory. Citations are left out: source refs are opaque identifiers, not language. The vector is
computed at admission and stored with the record's projection (``ProjectionDoc.vector``), so it is
removed with it on forget.

**Query.** The raw query text is embedded (no analyzer) and the vector index returns the scope's
records by cosine similarity, exactly (no approximate search), ties by ``record_id``.

**Fusion** (``EngineSettings.fusion``), over the two revalidated lists:

- ``minmax`` (the default): each channel's scores are min-max normalized over that channel's list
  (a record absent from a list scores 0 there; a list whose scores are all equal scores 1) and
  the record's score is their mean, ``0.5 · lexical + 0.5 · semantic``. The semantic list's floor
  is the similarity at rank ``NORMALIZATION_RANK`` (1,000; the scope's lowest when it holds fewer
  vectors), not the lowest of the hits the page ranks: a search ranks only ``max(100, 10 ×
  limit)`` hits per channel, and a floor that moved with that depth made the order depend on the
  page size. And a lexical hit the page's semantic list does not reach is scored by its own
  similarity (``VectorIndex.similarities``), not as absent (0): with every vector of a scope
  ranked, as before the depth fitted the page, no record was absent from the semantic list, and
  scoring them 0 cost 0.03 of recall@1 and MRR on LoCoMo (bench/locomo/FINDINGS.md). The vector
  index answers the floor and those similarities without returning the hits above them. This is the convex
  combination of normalized scores that Bruch, Gai and Ingber ("An Analysis of Fusion Functions
  for Hybrid Retrieval", 2023) found better than RRF: it keeps how far apart the scores are, where
  RRF keeps only their order, so a strong lexical match is not pulled down by a weak semantic
  rank. Equal weights, not tuned.
- ``rrf``: the contract's reciprocal rank fusion, ``Σ 1 / (60 + rank)``.

With ``semantic_mode = "semantic_only"`` (diagnostics and benchmarks) the semantic list alone is
ranked. Every choice here (model, record text weights, fusion, its constants, mode) is in
``profile_config`` and so in the rank receipt's ``profile_config_digest``. Ties always break by
``record_id`` ascending, so the order is deterministic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from engram_memory.contract.canonical import digest
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import Embedder, IndexHit, VectorIndex

PROFILE: Final = "semantic_v1"
PROFILE_VERSION: Final = "1.0.1"  # 1.0.0 normalized the semantic list over the page's depth
TIME_AWARE_PROFILE_VERSION: Final = "1.1.0"  # with engine/temporal.py; otherwise the same
# The semantic list's min-max floor: the similarity at this rank (or the scope's lowest), however
# deep the page's lists are. See the module docstring.
NORMALIZATION_RANK: Final = 1000
RRF_K: Final = 60
MINMAX_WEIGHTS: Final = (0.5, 0.5)  # lexical, semantic
RECORD_TEXT_WEIGHTS: Final[Mapping[str, float]] = {
    name: weight for name, weight in lexical.FIELD_WEIGHTS.items() if name != "citations"
}

Fusion = Literal["minmax", "rrf"]
SemanticMode = Literal["hybrid", "semantic_only"]


def record_texts(record: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Each component's text with its field weight (primary, else its kind)."""
    primary_id = record["primary_component_id"]
    return [
        (
            component["text"],
            RECORD_TEXT_WEIGHTS[
                "primary" if component["component_id"] == primary_id else component["kind"]
            ],
        )
        for component in record["components"]
    ]


def unit(vector: Sequence[float]) -> tuple[float, ...]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    return tuple(x / norm for x in vector) if norm > 0 else tuple(float(x) for x in vector)


def record_vector(embedder: Embedder, record: Mapping[str, Any]) -> tuple[float, ...]:
    """The record's unit-length vector (module docstring); raises ``EmbedderUnavailable``."""
    weighted = record_texts(record)
    vectors = embedder.embed([text for text, _ in weighted])
    total = [0.0] * embedder.dimensions
    for (_, weight), vector in zip(weighted, vectors, strict=True):
        for i, x in enumerate(vector):
            total[i] += weight * x
    return unit(total)


def _minmax(hits: Sequence[IndexHit], floor: float | None = None) -> dict[str, float]:
    if not hits:
        return {}
    low = min(h.score for h in hits) if floor is None else min(floor, *(h.score for h in hits))
    high = max(h.score for h in hits)
    span = high - low
    return {h.record_id: (h.score - low) / span if span > 0 else 1.0 for h in hits}


def normalization_floor(
    vectors: VectorIndex,
    scope: Scope,
    vector: Sequence[float],
    hits: Sequence[IndexHit],
    depth: int,
) -> float | None:
    """The semantic list's min-max floor (module docstring), asking the index only when the
    page's ``hits`` do not already hold it. Raises what the index raises."""
    if len(hits) < depth:  # every vector of the scope is a hit: the lowest is the last
        return hits[-1].score if hits else None
    if len(hits) >= NORMALIZATION_RANK:
        return hits[NORMALIZATION_RANK - 1].score
    return vectors.score_at(scope, vector, NORMALIZATION_RANK)


def completed(
    vectors: VectorIndex,
    scope: Scope,
    vector: Sequence[float],
    semantic_hits: Sequence[IndexHit],
    lexical_hits: Sequence[IndexHit],
) -> list[IndexHit]:
    """The semantic list with the lexical hits it does not reach, scored by their similarity
    (module docstring), best first. Raises what the index raises."""
    have = {hit.record_id for hit in semantic_hits}
    missing = [hit.record_id for hit in lexical_hits if hit.record_id not in have]
    extra = vectors.similarities(scope, vector, missing) if missing else {}
    merged = [*semantic_hits, *(IndexHit(rid, score) for rid, score in extra.items())]
    merged.sort(key=lambda hit: (-hit.score, hit.record_id))
    return merged


def fuse(
    lexical_hits: Sequence[IndexHit],
    semantic_hits: Sequence[IndexHit],
    fusion: Fusion,
    semantic_floor: float | None = None,
) -> list[IndexHit]:
    """One ranked list from the two channels' lists (module docstring); ties by ``record_id``.
    ``semantic_floor``: the semantic list's min-max floor (``normalization_floor``)."""
    scores: dict[str, float] = {}
    if fusion == "rrf":
        for hits in (lexical_hits, semantic_hits):
            for rank, hit in enumerate(hits, 1):
                scores[hit.record_id] = scores.get(hit.record_id, 0.0) + 1.0 / (RRF_K + rank)
    else:
        lists = ((lexical_hits, None), (semantic_hits, semantic_floor))
        for weight, (hits, floor) in zip(MINMAX_WEIGHTS, lists, strict=True):
            for record_id, value in _minmax(hits, floor).items():
                scores[record_id] = scores.get(record_id, 0.0) + weight * value
    fused = [IndexHit(record_id, score) for record_id, score in scores.items()]
    fused.sort(key=lambda hit: (-hit.score, hit.record_id))
    return fused


def profile_version(time_aware: bool) -> str:
    return TIME_AWARE_PROFILE_VERSION if time_aware else PROFILE_VERSION


def profile_config(
    model_id: str, mode: SemanticMode, fusion: Fusion, time_aware: bool = False
) -> dict[str, Any]:
    config = {
        "profile": PROFILE,
        "profile_version": profile_version(time_aware),
        "lexical_profile_config_digest": lexical.PROFILE_CONFIG_DIGEST,
        "embedder": model_id,
        "record_vector": "normalized-weighted-mean-of-component-embeddings",
        "record_text_weights": {name: str(w) for name, w in RECORD_TEXT_WEIGHTS.items()},
        "similarity": "cosine-exact",
        "mode": mode,
        "fusion": (
            {"method": "rrf", "k": RRF_K}
            if fusion == "rrf"
            else {
                "method": "minmax-convex",
                "weights": [str(w) for w in MINMAX_WEIGHTS],
                "semantic_floor": f"similarity-at-rank:{NORMALIZATION_RANK}",
                "semantic_list": "page-hits+lexical-hits-by-similarity",
            }
        ),
        "ties": "record_id_ascending",
    }
    if time_aware:
        from engram_memory.engine import temporal

        config["temporal"] = temporal.profile_config()
    return config


@functools.cache  # constants of this build and host: one digest per process, not per search
def profile_config_digest(
    model_id: str, mode: SemanticMode, fusion: Fusion, time_aware: bool = False
) -> str:
    return digest("rank-profile", profile_config(model_id, mode, fusion, time_aware))

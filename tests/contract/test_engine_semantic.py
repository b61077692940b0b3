"""The semantic channel and hybrid ranking (semantic_v1), over both adapter sets.

The engine runs with ``HashingEmbedder``, a deterministic fake (texts that share terms are
close); the real local model is exercised in ``tests/integration/test_local_embedder.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from engram_memory.contract.canonical import digest
from engram_memory.contract.outputs import SearchOutput
from engram_memory.engine import lexical, semantic
from engram_memory.engine.ports import IndexHit, VectorIndex

from engram_testing import (
    PURPOSE,
    Harness,
    HashingEmbedder,
    aws_harness,
    context,
    embedded_harness,
)

BOTH = {"lexical_and_semantic": {"minimum_channels": "lexical_and_semantic", "network": "forbid"}}


@pytest.fixture(params=["embedded", "aws"])
def semantic_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    embedder = HashingEmbedder(synonyms={"kitten": "cat", "rug": "mat"})
    build = embedded_harness if request.param == "embedded" else aws_harness
    h = build(tmp_path, embedder=embedder)
    try:
        yield h
    finally:
        h.close()


def search(h: Harness, query: str, **kw: Any) -> dict[str, Any]:
    return h.search(query, capability_policy=BOTH["lexical_and_semantic"], **kw)


def ids(value: dict[str, Any]) -> list[str]:
    return [p["record"]["record_id"] for p in value["records"]]


def test_hybrid_search_reports_the_semantic_profile_and_its_config_digest(
    semantic_harness: Harness,
) -> None:
    record_id = semantic_harness.remember("The cat sleeps on the mat by the door.")
    value = search(semantic_harness, "cat mat")
    SearchOutput.model_validate(value)
    assert ids(value) == [record_id]
    receipt = value["rank_receipt"]
    assert receipt["profile"] == "semantic_v1"
    assert receipt["profile_version"] == semantic.profile_version(True) == "1.1.0"
    assert receipt["profile_config_digest"] == semantic.profile_config_digest(
        HashingEmbedder.model_id, "hybrid", "minmax", True
    )
    assert receipt["profile_config_digest"] != lexical.PROFILE_CONFIG_DIGEST
    assert receipt["scoring_formula_ref"].startswith("minmax(")


def test_the_semantic_channel_finds_a_record_that_shares_no_word_with_the_query(
    semantic_harness: Harness,
) -> None:
    record_id = semantic_harness.remember("The cat sleeps on the mat by the door.")
    semantic_harness.remember("Quarterly budget review moved to Thursday.")
    value = search(semantic_harness, "kitten rug")  # no shared term; similar vectors
    assert ids(value)[0] == record_id


def test_ranking_is_deterministic_and_ties_break_by_record_id(semantic_harness: Harness) -> None:
    semantic_harness.without_quality_gate()
    twins = sorted(
        semantic_harness.remember("identical twin phrase about herons", key=f"twin-capture-{i:04d}")
        for i in range(3)
    )
    other = semantic_harness.remember("herons nest in the reeds every spring")
    first = search(semantic_harness, "twin herons")
    assert ids(first)[:3] == twins and ids(first)[3] == other
    again = search(semantic_harness, "twin herons")
    assert ids(again) == ids(first)
    assert again["rank_receipt"]["ordered_ids_digest"] == digest("ordered-ids", ids(first))


def test_a_forgotten_record_vector_is_gone_from_the_vector_index(
    semantic_harness: Harness,
) -> None:
    record_id = semantic_harness.remember("The cat sleeps on the mat by the door.")
    vectors = semantic_harness.engine.vectors
    assert vectors is not None
    scope = context().scope
    assert vectors.has_vector(scope, record_id)
    assert semantic_harness.forget(record_id)["ok"]
    semantic_harness.engine.drain_outbox()
    assert not vectors.has_vector(scope, record_id)
    assert vectors.nearest(scope, [1.0] + [0.0] * 63, 10) == []
    assert search(semantic_harness, "kitten rug")["records"] == []


def test_an_embedder_failure_is_ranking_unavailable_when_semantic_is_required(
    semantic_harness: Harness,
) -> None:
    record_id = semantic_harness.remember("The cat sleeps on the mat by the door.")
    embedder = semantic_harness.engine.embedder
    assert isinstance(embedder, HashingEmbedder)
    embedder.unavailable = True
    args = {"query": "cat", "purpose_ref": PURPOSE}
    required = {**args, "capability_policy": BOTH["lexical_and_semantic"]}
    assert semantic_harness.error("search", required) == "RANKING_UNAVAILABLE"
    # Only lexical required: the lexical ranking, and the receipt says so (no silent downgrade).
    value = semantic_harness.ok("search", args)
    assert ids(value) == [record_id]
    assert value["rank_receipt"]["profile"] == "offline_lexical_v1"
    assert value["rank_receipt"]["profile_config_digest"] == lexical.receipt_profile(True)[1]


def test_a_vector_index_failure_is_ranking_unavailable_when_semantic_is_required(
    tmp_path: Path,
) -> None:
    from engram_memory.engine.ports import IndexUnavailable

    h = embedded_harness(tmp_path, embedder=HashingEmbedder())
    try:
        h.remember("The cat sleeps on the mat by the door.")
        vectors: Any = h.engine.vectors

        def down(*_: Any) -> list[IndexHit]:
            raise IndexUnavailable("down")

        vectors.nearest = down
        required = {
            "query": "cat",
            "purpose_ref": PURPOSE,
            **{"capability_policy": BOTH["lexical_and_semantic"]},
        }
        assert h.error("search", required) == "RANKING_UNAVAILABLE"
    finally:
        h.close()


def test_without_an_embedder_lexical_and_semantic_is_ranking_unavailable(
    harness: Harness,
) -> None:
    harness.remember("The cat sleeps on the mat by the door.")
    assert harness.engine.embedder is None
    args = {
        "query": "cat",
        "purpose_ref": PURPOSE,
        "capability_policy": BOTH["lexical_and_semantic"],
    }
    assert harness.error("search", args) == "RANKING_UNAVAILABLE"
    assert harness.search("cat")["rank_receipt"]["profile"] == "offline_lexical_v1"


def test_semantic_only_mode_ranks_by_the_vectors_alone(tmp_path: Path) -> None:
    h = embedded_harness(tmp_path, embedder=HashingEmbedder(), semantic_mode="semantic_only")
    try:
        near = h.remember("herons nest in the reeds")
        far = h.remember("herons herons herons budget budget budget review")
        value = h.search("herons nest reeds")
        assert ids(value) == [near, far]
        assert value["rank_receipt"]["profile_config_digest"] == semantic.profile_config_digest(
            HashingEmbedder.model_id, "semantic_only", "minmax", True
        )
    finally:
        h.close()


def test_both_adapter_sets_rank_the_same(tmp_path: Path) -> None:
    texts = [
        "herons nest in the reeds every spring",
        "the reeds by the lake are cut in autumn",
        "a heron caught a fish near the reeds",
        "budget review on Thursday",
        "spring cleaning of the boat shed",
    ]
    orders = []
    for build in (embedded_harness, aws_harness):
        folder = tmp_path / build.__name__
        folder.mkdir()
        h = build(folder, embedder=HashingEmbedder())
        try:
            for i, text in enumerate(texts):
                h.remember(text, key=f"parity-capture-{i:04d}")
            orders.append(
                [
                    [p["record"]["record_id"] for p in search(h, q)["records"]]
                    for q in ("heron reeds", "spring", "lake autumn fish")
                ]
            )
        finally:
            h.close()
    assert orders[0] == orders[1]


# -- fusion, as pure functions -----------------------------------------------------------------


def hits(*pairs: tuple[str, float]) -> list[IndexHit]:
    return [IndexHit(record_id, score) for record_id, score in pairs]


def test_minmax_fusion_averages_normalized_scores_and_breaks_ties_by_record_id() -> None:
    lexical_hits = hits(("a", 10.0), ("b", 5.0), ("c", 0.0))
    semantic_hits = hits(("c", 0.9), ("b", 0.5), ("d", 0.1))
    fused = semantic.fuse(lexical_hits, semantic_hits, "minmax")
    assert [(h.record_id, round(h.score, 6)) for h in fused] == [
        ("a", 0.5),  # 0.5 · 1 + 0.5 · 0 (absent)
        ("b", 0.5),  # 0.5 · 0.5 + 0.5 · 0.5: tie with a, record_id ascending
        ("c", 0.5),  # 0.5 · 0 + 0.5 · 1
        ("d", 0.0),
    ]
    single = semantic.fuse(hits(("x", 3.0)), [], "minmax")
    assert single == [IndexHit("x", 0.5)]  # one score: normalized to 1


def test_rrf_fusion_sums_reciprocal_ranks_with_k_60() -> None:
    fused = semantic.fuse(hits(("a", 9.0), ("b", 1.0)), hits(("b", 0.9), ("c", 0.8)), "rrf")
    assert [h.record_id for h in fused] == ["b", "a", "c"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert (fused[1].score, fused[2].score) == pytest.approx((1 / 61, 1 / 62))
    tie = semantic.fuse(hits(("z", 1.0)), hits(("y", 1.0)), "rrf")
    assert [h.record_id for h in tie] == ["y", "z"]  # equal 1/61 each: record_id ascending


def test_a_record_vector_is_the_weighted_mean_of_its_components() -> None:
    embedder = HashingEmbedder()
    record = {
        "primary_component_id": "p",
        "components": [
            {"component_id": "p", "kind": "evidence", "text": "herons"},
            {"component_id": "c", "kind": "context", "text": "budget"},
        ],
    }
    vector = semantic.record_vector(embedder, record)
    (primary,), (context_vector,) = embedder.embed(["herons"]), embedder.embed(["budget"])
    expected = semantic.unit(
        [3.0 * a + 1.0 * b for a, b in zip(primary, context_vector, strict=True)]
    )
    assert vector == pytest.approx(expected)
    assert sum(x * x for x in vector) == pytest.approx(1.0)


class _FloorProbe:
    """A vector index that answers ``score_at`` and ``similarities`` and counts the calls."""

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.named: list[list[str]] = []

    def similarities(self, scope: Any, vector: Any, record_ids: list[str]) -> dict[str, float]:
        self.named.append(list(record_ids))
        return {rid: 0.125 for rid in record_ids if rid != "no-vector"}

    def score_at(self, scope: Any, vector: Any, rank: int) -> float:
        self.asked.append(rank)
        return -0.25


def test_the_semantic_floor_is_the_similarity_at_rank_1000_whatever_the_depth() -> None:
    probe = _FloorProbe()
    index = cast(VectorIndex, probe)  # the floor calls nothing else
    scope = context().scope
    hits = [IndexHit(f"mem_{i:04d}", 1.0 - i / 2000) for i in range(1200)]
    floor = semantic.normalization_floor
    assert floor(index, scope, [1.0], hits[:40], 100) == hits[39].score  # the scope's lowest
    assert floor(index, scope, [1.0], [], 100) is None
    assert floor(index, scope, [1.0], hits, 1200) == hits[999].score  # already in the page
    assert probe.asked == []
    assert floor(index, scope, [1.0], hits[:100], 100) == -0.25  # asked, one similarity
    assert probe.asked == [semantic.NORMALIZATION_RANK] == [1000]
    # With the floor, a list is normalized from it, not from its own lowest hit.
    fused = semantic.fuse([], [IndexHit("a", 0.5), IndexHit("b", 0.25)], "minmax", -0.5)
    assert [(h.record_id, h.score) for h in fused] == [("a", 0.5), ("b", 0.375)]


def test_the_first_page_is_the_same_whatever_the_page_size(tmp_path: Path) -> None:
    h = embedded_harness(tmp_path, embedder=HashingEmbedder())
    h.without_quality_gate()
    try:
        # More records than a page of 10 ranks per channel (100), fewer than a page of 50 (500).
        for i in range(160):
            h.remember(f"heron count {i}: reeds {i % 7}, budget {i % 11}, survey {i % 3}")
        for query in ("heron reeds 3 budget 5", "survey 2 heron", "budget 10 reeds"):
            ten = ids(search(h, query, limit=10))
            fifty = ids(search(h, query, limit=50))
            assert ten == fifty[:10]
    finally:
        h.close()


def test_lexical_hits_beyond_the_semantic_page_are_scored_by_their_similarity() -> None:
    probe = _FloorProbe()
    index = cast(VectorIndex, probe)  # completing a page calls nothing else
    scope = context().scope
    page = [IndexHit("a", 0.75), IndexHit("b", 0.25)]
    lexical_hits = [IndexHit("c", 9.0), IndexHit("a", 5.0), IndexHit("no-vector", 1.0)]
    merged = semantic.completed(index, scope, [1.0], page, lexical_hits)
    assert probe.named == [["c", "no-vector"]]  # only those the page does not hold
    assert merged == [IndexHit("a", 0.75), IndexHit("b", 0.25), IndexHit("c", 0.125)]
    assert semantic.completed(index, scope, [1.0], page, []) == page
    assert len(probe.named) == 1

"""The hot-path benchmark's seeding: the hybrid store seeded with remembered vectors is the store
the product makes when it embeds every record (same records, vectors, index, journal and search
results), and it passes the engine's own checks (journal verify, status, record bodies)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_locomo_bench import ANA_AND_BO

from bench.hotpath.corpus import Corpus
from bench.hotpath.stores import HYBRID, LEXICAL, WORKSPACE, RepeatedTexts, _seed_engine
from bench.locomo.calls import PURPOSE, value
from bench.locomo.clients import EngineClient
from bench.locomo.dataset import load
from engram_memory.adapters.embedder import semantic_extra_installed
from engram_memory.embedded.composition import EmbeddedHost, open_existing
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.journal import verify_journal
from engram_memory.engine.records import decode
from engram_memory.operator_plane.backup_checks import check_record_bodies
from engram_memory.operator_plane.inspection import status

TURNS = 6
MEMORIES = 15  # each turn two or three times: the repeats are what RepeatedTexts saves
QUERIES = (
    "Where did Ana adopt the kitten?",
    "What did Bo cook for dinner?",
    "Which book is Ana reading?",
    "When is the pottery class?",
)
TEXTS = (
    "I adopted a grey kitten from the shelter on Main Street.",
    "Bo cooked a spicy lentil soup for dinner last night.",
    "I'm reading a novel about a lighthouse keeper.",
    "The pottery class starts next Tuesday at six.",
    "We hiked to the waterfall and saw two herons.",
    "My sister moved to Lisbon for a job in design.",
)


def conversation() -> dict[str, Any]:
    return {
        **ANA_AND_BO,
        "session_1": [
            {"speaker": "Ana" if i % 2 else "Bo", "dia_id": f"D1:{i + 1}", "text": text}
            for i, text in enumerate(TEXTS)
        ],
        "qa": [
            {"question": q, "answer": "x", "evidence": ["D1:1"], "category": 4} for q in QUERIES
        ],
    }


@pytest.fixture
def corpus(tmp_path: Path) -> Corpus:
    path = tmp_path / "conv-1.json"
    path.write_text(json.dumps(conversation()), encoding="utf-8")
    found = Corpus([load(path)])
    assert found.distinct_turns == TURNS
    return found


class CountingEmbedder:
    """A deterministic stand-in that counts what it is asked to embed."""

    model_id = "counting"
    dimensions = 3

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        self.calls.append(tuple(texts))
        return [(float(len(text)), 1.0, 0.0) for text in texts]


def test_repeated_texts_embeds_each_distinct_list_once() -> None:
    inner = CountingEmbedder()
    remembering = RepeatedTexts(inner)
    first = remembering.embed(["a kitten", "context"])
    again = remembering.embed(["a kitten", "context"])
    other = remembering.embed(["a kitten"])
    assert first == again == inner.embed(["a kitten", "context"])
    assert other == [(8.0, 1.0, 0.0)]
    assert inner.calls.count(("a kitten", "context")) == 2  # once for RepeatedTexts, once here
    assert (remembering.calls, remembering.computed) == (3, 2)
    assert (remembering.model_id, remembering.dimensions) == ("counting", 3)


@contextmanager
def opened(data_dir: Path) -> Iterator[EmbeddedHost]:
    host = open_existing(data_dir)
    try:
        yield host
    finally:
        host.close()


def snapshot(data_dir: Path, record_ids: list[str], corpus: Corpus) -> dict[str, Any]:
    """What must not depend on how the store was seeded: per memory its record's content,
    digest and projections; the journal's operations; the engine's checks; search results as
    (score, turn) per query. Ids, times and receipts differ between any two seedings."""
    with opened(data_dir) as host:
        engine, store = host.engine, host.store
        scope = Scope(host.config.tenant_id, WORKSPACE)
        head = verify_journal(store, scope)  # `engram-memory verify`: dense, hash-chained
        operations = [decode(e.body)["operation"] for e in store.events(scope, 0, 10 * MEMORIES)]
        report = status(engine, scope, "test")
        rows = store.records_get(scope, record_ids)
        bodies = {rid: (row.body, row.record_digest) for rid, row in rows.items() if row.body}
        assert check_record_bodies(scope, bodies, host.vault.record_keys) == 0
        records = []
        for record_id in record_ids:
            row = rows[record_id]
            record = engine.body(scope, row)
            records.append(
                {
                    "state": row.state,
                    "payload_digest": row.payload_digest,
                    "fields": lexical.projection_fields(record),
                    "vector": store.vector_get(scope, record_id),
                    "in_index": store.lexical_contains(scope, record_id),
                }
            )
        turn_of = {rid: i % corpus.distinct_turns for i, rid in enumerate(record_ids)}
        client = EngineClient(engine, tenant=host.config.tenant_id)
        searches = []
        for query in QUERIES:
            found = value(
                client.call(WORKSPACE, "search", {"query": query, "purpose_ref": PURPOSE}),
                "search",
            )
            # Equal scores tie-break by record id, random per seeding: compare as (score, turn).
            searches.append(
                {
                    "hits": sorted(
                        (p["score"], turn_of[p["record"]["record_id"]]) for p in found["records"]
                    ),
                    "profile": found["rank_receipt"]["profile_config_digest"],
                }
            )
    return {
        "head": head.cursor,
        "operations": operations,
        "records": records,
        "candidates": report["candidates"],
        "record_states": report["records"],
        "outbox": report["outbox"],
        "index": {k: v for k, v in report["index"].items() if k != "surfaces"},
        "searches": searches,
    }


@pytest.mark.skipif(
    not semantic_extra_installed(), reason="the hybrid profile needs the semantic extra"
)
def test_remembered_vectors_seed_the_store_the_product_makes(
    corpus: Corpus, tmp_path: Path
) -> None:
    product = tmp_path / "product"
    seeded = tmp_path / "seeded"
    every_record = _seed_engine(
        product / "data", corpus, 0, MEMORIES, HYBRID, None, remember_vectors=False
    )
    remembered = _seed_engine(seeded / "data", corpus, 0, MEMORIES, HYBRID, None)
    expected = snapshot(product / "data", every_record, corpus)
    found = snapshot(seeded / "data", remembered, corpus)
    assert found == expected
    assert expected["head"] == 2 * MEMORIES  # a capture and an admission per memory
    assert expected["index"]["fresh"] is True
    assert expected["index"]["missing_from_index"] == 0
    assert expected["record_states"] == {"accepted_current": MEMORIES}
    assert all(r["vector"] is not None and r["in_index"] for r in expected["records"])
    assert any(s["hits"] for s in expected["searches"])


def test_lexical_seeding_passes_the_engines_checks(corpus: Corpus, tmp_path: Path) -> None:
    record_ids = _seed_engine(tmp_path / "data", corpus, 0, MEMORIES, LEXICAL, None)
    found = snapshot(tmp_path / "data", record_ids, corpus)
    assert found["head"] == 2 * MEMORIES
    assert found["index"]["fresh"] is True
    assert all(r["vector"] is None and r["in_index"] for r in found["records"])
    assert found["searches"][0]["hits"]

"""The embedded lexical index returns exactly what one ``ORDER BY score DESC, record_id ASC``
query returns, also when many matches tie at the depth (duplicated texts)."""

from __future__ import annotations

import math
import random
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_memory.adapters.local.sqlite import lexical_topk
from engram_memory.adapters.local.sqlite.fulltext import _BM25_ARGS, lexical_table_name
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import IndexHit, ProjectionChange, ProjectionDoc

SCOPE = Scope("tenant-a", "ws-lexical")
WORDS = [
    "backup",
    "calendar",
    "deploy",
    "flag",
    "release",
    "rota",
    "search",
    "staging",
    "train",
    "window",
]


def _plain(path: Path, terms: list[str], depth: int) -> list[IndexHit]:
    table = lexical_table_name(SCOPE)
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            f"SELECT record_id, -bm25({table}, {_BM25_ARGS}) AS score FROM {table} "
            f"WHERE {table} MATCH ? ORDER BY score DESC, record_id ASC LIMIT ?",
            (" OR ".join(f'"{t}"' for t in terms), depth),
        ).fetchall()
    conn.close()
    return [IndexHit(str(record_id), float(score)) for record_id, score in rows]


def test_top_hits_are_the_plain_query_with_ties_wider_and_narrower_than_the_slack(
    tmp_path: Path,
) -> None:
    path = tmp_path / "engram.db"
    store = SqliteStore(path)
    rng = random.Random(3)
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(2, 6))) for _ in range(60)]
    # Record ids in random order against insertion order (rowids), each text many times over,
    # and one text 200 times: ties at the depth both narrower and wider than the slack.
    entries = [(text, n) for n, text in enumerate(texts) for _ in range(4)]
    entries += [("backup window backup", 1000)] * 200
    rng.shuffle(entries)
    for index, (text, _) in enumerate(entries):
        record_id = f"mem_{rng.getrandbits(64):016x}_{index}"
        doc = ProjectionDoc(record_id, {"primary": text}, None)
        store.lexical_apply(SCOPE, ProjectionChange(upsert=doc))
    for terms in (["backup"], ["backup", "window"], ["deploy", "rota"], WORDS, ["absent"]):
        for depth in (1, 5, 50, 100, 300, 1000):
            assert store.lexical_search(SCOPE, terms, depth) == _plain(path, terms, depth)
    store.close()


# -- the pruned ranking (adapters/local/sqlite/lexical_topk.py) ------------------------------------------

COMMON = ["alice", "said", "today"]  # each in most rows: what pruning exists for
RARE = [f"word{n}" for n in range(12)]


def _store_of(path: Path, texts: list[dict[str, str]], seed: int) -> SqliteStore:
    store = SqliteStore(path)
    rng = random.Random(seed)
    for index, fields in enumerate(texts):
        record_id = f"mem_{rng.getrandbits(32):08x}_{index}"
        store.lexical_apply(SCOPE, ProjectionChange(upsert=ProjectionDoc(record_id, fields, None)))
    return store


def _same_ranking(found: list[IndexHit], plain: list[IndexHit]) -> None:
    """The same records in the same order; each score FTS5's own to a few ulps."""
    assert [hit.record_id for hit in found] == [hit.record_id for hit in plain]
    for hit, expected in zip(found, plain, strict=True):
        assert abs(hit.score - expected.score) <= 16 * math.ulp(expected.score)


fields_strategy = st.dictionaries(
    st.sampled_from(["primary", "decision", "evidence", "context", "citations"]),
    st.lists(st.sampled_from(COMMON * 6 + RARE + ["filler", "other"]), min_size=1, max_size=8).map(
        " ".join
    ),
    min_size=1,
    max_size=3,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    distinct=st.lists(fields_strategy, min_size=1, max_size=40),
    copies=st.lists(st.integers(1, 12), min_size=40, max_size=40),
    forgotten=st.sets(st.integers(0, 400), max_size=40),
    queries=st.lists(
        st.lists(st.sampled_from([*COMMON, *RARE, "absent"]), min_size=1, max_size=6, unique=True),
        min_size=1,
        max_size=6,
    ),
    depth=st.sampled_from([1, 3, 10, 40, 100]),
    seed=st.integers(0, 2**16),
    covers=st.sampled_from([0, 64]),
)
def test_the_pruned_top_is_the_plain_query_on_random_stores(
    distinct: list[dict[str, str]],
    copies: list[int],
    forgotten: set[int],
    queries: list[list[str]],
    depth: int,
    seed: int,
    covers: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Duplicated rows (ties as wide as 12), rows forgotten (the store's delete, so max(rowid)
    overstates the rows), a term in no row, single terms, queries of common terms only; rows
    found through sets of common terms, or (no such set allowed) through more rare terms."""
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_ROWS", 0)  # prune on a small store too
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_MATCHES", 0)
    monkeypatch.setattr(lexical_topk, "_MOST_COVERS", covers)
    texts = [fields for fields, n in zip(distinct, copies, strict=False) for _ in range(n)]
    random.Random(seed).shuffle(texts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "engram.db"
        store = _store_of(path, texts, seed)
        try:
            for index in sorted(forgotten):
                if index < len(texts):
                    record_id = _record_id_at(path, index)
                    if record_id is not None:
                        store.lexical_apply(SCOPE, ProjectionChange(delete_record_id=record_id))
            for terms in queries:
                _same_ranking(store.lexical_search(SCOPE, terms, depth), _plain(path, terms, depth))
        finally:
            store.close()


def _record_id_at(path: Path, rowid: int) -> str | None:
    table = lexical_table_name(SCOPE)
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            f"SELECT record_id FROM {table} WHERE rowid = ?", (rowid + 1,)
        ).fetchone()
    conn.close()
    return None if row is None else str(row[0])


def _refuse_plain(*args: object) -> lexical_topk.Ranked:
    raise AssertionError("the plain query ran: every match scored")


def test_a_rare_term_beside_a_common_one_scores_only_the_rare_terms_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name in every row and a word in a few: the best rows are found among the few (the
    plain query, which scores every row holding the name, never runs), and they are the plain
    query's, tied rows ordered by record_id."""
    texts = [{"primary": f"alice said filler {n % 7}"} for n in range(300)]
    texts += [{"primary": "alice painted sunrise"}] * 5 + [{"evidence": "painted lake"}] * 3
    store = _store_of(tmp_path / "engram.db", texts, seed=7)
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_ROWS", 0)
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_MATCHES", 0)
    expected = {
        depth: _plain(tmp_path / "engram.db", ["alice", "painted"], depth) for depth in (1, 4, 8)
    }
    monkeypatch.setattr(lexical_topk, "plain", _refuse_plain)
    try:
        for depth in (1, 4, 8):
            _same_ranking(store.lexical_search(SCOPE, ["alice", "painted"], depth), expected[depth])
    finally:
        store.close()


def test_pruning_keeps_ties_wider_than_the_slack_and_terms_it_cannot_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 identical rows holding the rare term (a tie at the depth wider than the slack), and a
    term that is not plain ASCII (its row count is not looked up: the plain query runs)."""
    texts = [{"primary": "alice said filler"}] * 300 + [{"primary": "alice café sunrise"}] * 200
    store = _store_of(tmp_path / "engram.db", texts, seed=11)
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_ROWS", 0)
    monkeypatch.setattr(lexical_topk, "PRUNE_FROM_MATCHES", 0)
    try:
        for terms in (["alice", "sunrise"], ["alice", "café"], ["sunrise"], ["alice"]):
            for depth in (1, 50, 150, 400):
                expected = _plain(tmp_path / "engram.db", terms, depth)
                _same_ranking(store.lexical_search(SCOPE, terms, depth), expected)
    finally:
        store.close()


def test_rows_closer_than_the_error_are_left_to_the_plain_query_unless_scored_alike() -> None:
    """Two scores within the subtraction's error keep their order only when both queries scored
    the rows alike (identical rows); otherwise their order is unknown and nothing is returned."""
    alike = [(1, 9.0, 12.0, 3.0), (2, 9.0, 12.0, 3.0), (3, 5.0, 8.0, 3.0)]
    assert lexical_topk._checked(alike, 2, 10, 1) == [(1, 9.0), (2, 9.0), (3, 5.0)]
    close = [(1, 9.0, 12.0, 3.0), (2, 9.0 - 1e-15, 11.0, 2.0 + 1e-15), (3, 5.0, 8.0, 3.0)]
    assert lexical_topk._checked(close, 2, 10, 1) is None
    # A row past the limit may be within the error of the depth-th: unknown too.
    cut = [(1, 9.0, 12.0, 3.0), (2, 7.0, 10.0, 3.0), (3, 7.0 - 1e-15, 9.0, 2.0 + 1e-15)]
    assert lexical_topk._checked(cut, 2, 3, 1) is None
    assert lexical_topk._checked([*cut[:2], (3, 6.0, 9.0, 3.0)], 2, 3, 1) is not None

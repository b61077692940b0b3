"""The embedded lexical index returns exactly what one ``ORDER BY score DESC, record_id ASC``
query returns, also when many matches tie at the depth (duplicated texts)."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

from engram_memory.adapters.local.sqlite_store import (
    _BM25_ARGS,
    SqliteStore,
    lexical_table_name,
)
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

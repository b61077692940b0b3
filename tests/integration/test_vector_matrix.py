"""The embedded vector index answers from an in-memory matrix exactly what a scan of every stored
vector answers, and sees writes made through another store on the same file."""

from __future__ import annotations

import operator
import random
from pathlib import Path

import pytest

from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.adapters.local.sqlite.vectors import unpack_vector, vector_table_name
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import IndexHit, ProjectionChange, ProjectionDoc
from engram_memory.engine.semantic import unit

from engram_testing import tool_missing

pytest.importorskip("numpy", reason="the semantic extra is not installed")

SCOPE = Scope("tenant-a", "ws-vectors")
DIMENSIONS = 384


def _vector(rng: random.Random) -> tuple[float, ...]:
    return unit([rng.gauss(0.0, 1.0) for _ in range(DIMENSIONS)])


def _scan(store_path: Path, query: tuple[float, ...], depth: int) -> list[IndexHit]:
    """The exact scan the index answered with before it had a matrix."""
    import sqlite3
    from array import array

    with sqlite3.connect(store_path) as conn:
        rows = conn.execute(f"SELECT record_id, vector FROM {vector_table_name(SCOPE)}").fetchall()
    conn.close()
    q = array("d", query)
    hits = [IndexHit(rid, sum(map(operator.mul, q, unpack_vector(blob)))) for rid, blob in rows]
    hits.sort(key=lambda hit: (-hit.score, hit.record_id))
    return hits[:depth]


def _upsert(store: SqliteStore, record_id: str, vector: tuple[float, ...]) -> None:
    doc = ProjectionDoc(record_id, {"primary": record_id}, vector)
    store.lexical_apply(SCOPE, ProjectionChange(upsert=doc))


def test_nearest_is_the_exact_scan_and_follows_writes_from_any_store(tmp_path: Path) -> None:
    path = tmp_path / "engram.db"
    rng = random.Random(7)
    searcher, writer = SqliteStore(path), SqliteStore(path)
    vectors = {f"mem_{i:04d}": _vector(rng) for i in range(600)}
    for record_id, vector in vectors.items():
        _upsert(writer, record_id, vector)
    # Near-ties: copies of one vector under other ids, so the order rests on record_id.
    for twin in ("mem_twin_b", "mem_twin_a"):
        _upsert(writer, twin, vectors["mem_0005"])
    queries = [_vector(rng) for _ in range(5)] + [vectors["mem_0005"]]
    for query in queries:
        for depth in (1, 10, 100, 1000):
            assert searcher.vector_nearest(SCOPE, query, depth) == _scan(path, query, depth)

    # Writes through the other store (a CLI, another server) are seen by the next search.
    writer.lexical_apply(SCOPE, ProjectionChange(delete_record_id="mem_0005"))
    _upsert(writer, "mem_new", queries[0])
    for query in queries:  # the floor of the hybrid ranking: the score at a rank, or the lowest
        everything = _scan(path, query, 10_000)
        for rank in (1, 10, 100, 602, 1000):
            at = everything[min(rank, len(everything)) - 1].score
            assert searcher.vector_score_at(SCOPE, query, rank) == pytest.approx(at, abs=1e-6)
    assert searcher.vector_score_at(Scope("t", "empty"), queries[0], 10) is None
    # The similarities of named records: nearest's own scores; ids without a vector left out.
    scores = {hit.record_id: hit.score for hit in _scan(path, queries[1], 10_000)}
    named = ["mem_0599", "mem_twin_a", "mem_0003", "no_such_record"]
    found = searcher.vector_similarities(SCOPE, queries[1], named)
    assert found == pytest.approx({rid: scores[rid] for rid in named[:3]}, abs=1e-12)
    assert searcher.vector_similarities(SCOPE, queries[1], []) == {}
    first = searcher.vector_nearest(SCOPE, queries[0], 10)
    assert first[0].record_id == "mem_new"
    assert all(
        hit.record_id != "mem_0005" for hit in searcher.vector_nearest(SCOPE, queries[-1], 50)
    )
    assert first == _scan(path, queries[0], 10)
    searcher.close()
    writer.close()


def test_the_product_runs_on_one_blas_thread() -> None:
    """NumPy's OpenBLAS would start a thread per core for the product; on busy cores those
    threads spin (vector_matrix's docstring). A search sets one thread, whatever was set before."""
    threadpoolctl = pytest.importorskip("threadpoolctl", reason="the semantic extra is missing")
    import numpy as np

    from engram_memory.adapters.local.sqlite.vector_matrix import VectorMatrices

    def blas_threads() -> list[int]:
        return [
            i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"
        ]

    np.ones((2, 2)) @ np.ones(2)  # the BLAS library is loaded
    if not blas_threads():
        tool_missing("a NumPy whose BLAS library threadpoolctl can see (it sets its threads)")
    rng = random.Random(3)
    rows = [(f"r{i}", np.asarray(_vector(rng), dtype="<f4").tobytes()) for i in range(50)]
    with threadpoolctl.threadpool_limits(limits=4, user_api="blas"):
        assert set(blas_threads()) == {4}
        hits = VectorMatrices().nearest("t", 1, lambda: rows, _vector(rng), 5)
        assert len(hits) == 5
        assert set(blas_threads()) == {1}


def test_a_stored_vector_takes_its_own_bytes_not_a_page(tmp_path: Path) -> None:
    """384 float32 are 1,536 bytes: kept on the table's pages, not an overflow page each."""
    import sqlite3

    path = tmp_path / "engram.db"
    store = SqliteStore(path)
    rng = random.Random(11)
    count = 300
    for i in range(count):
        _upsert(store, f"mem_{i:04d}", _vector(rng))
    store.close()
    table = vector_table_name(SCOPE)
    with sqlite3.connect(path) as conn:
        try:
            (used,) = conn.execute(
                "SELECT SUM(pgsize) FROM dbstat WHERE name = ? OR name LIKE ?",
                (table, f"sqlite_autoindex_{table}%"),
            ).fetchone()
        except sqlite3.OperationalError:
            tool_missing("a SQLite built with the dbstat virtual table")
    conn.close()
    # A vector a page (the WITHOUT ROWID layout) is >= 4,096 bytes each; on the table's pages
    # a vector with its id and index entry is about 1.6-2.1 KB.
    assert used / count < 2_600, used / count  # measured: 2,103 rowid, 4,697 WITHOUT ROWID

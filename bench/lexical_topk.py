"""The lexical query alone, pruned (``adapters/local/sqlite/lexical_topk.py``) beside the plain
one.

    python -m bench.lexical_topk --size 10000 [--replicate 10] [--queries 150] [--rounds 2]

On a copy of the cached hot-path store of ``--size`` records (``python -m bench.hotpath
--seed-only`` makes them), CPU per ``SqliteStore.lexical_search`` (LoCoMo questions, depth 100 as
a 10-record search asks) with the pruning whatever the store's size (``PRUNE_FROM_ROWS`` 0: what
that threshold is read from), then with the plain query only (the threshold out of reach),
alternating for ``--rounds`` rounds in one process; each search's hits are compared:
the same records in the same order, and how many scores differ and by how many ulps at most.
``--replicate F`` grows the copy's FTS table F-fold first (each row again under a new record id):
what the lexical query sees in a store of F × size records that cycles the same turns, as the
seeded stores do, without seeding them (100k records take 30+ minutes to seed).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from bench.hotpath.__main__ import DEFAULT_CACHE
from bench.hotpath.corpus import Corpus
from bench.hotpath.stores import LEXICAL, seeded_store
from bench.in_process import DEFAULT_LOCOMO
from engram_memory.adapters.local.sqlite import lexical_topk
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import IndexHit

DEPTH = 100


def replicate(path: Path, factor: int) -> None:
    with sqlite3.connect(path, isolation_level=None) as conn:
        (table,) = conn.execute("SELECT table_name FROM lexical_tables").fetchone()
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        (rows,) = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()  # noqa: S608
        conn.execute("BEGIN")
        for copy in range(1, factor):
            conn.execute(
                f"INSERT INTO {table} ({', '.join(columns)}) "  # noqa: S608 - our own names
                f"SELECT record_id || '_{copy}', {', '.join(columns[1:])} FROM {table} "
                "WHERE rowid <= ?",
                (rows,),
            )
        conn.execute(f"INSERT INTO {table} ({table}) VALUES ('optimize')")  # noqa: S608
        conn.execute("COMMIT")
    conn.close()


def searches(
    store: SqliteStore, scope: Scope, queries: list[list[str]]
) -> tuple[list[float], list[list[IndexHit]]]:
    cpu_ms: list[float] = []
    found: list[list[IndexHit]] = []
    for terms in queries:
        started = time.process_time()
        found.append(store.lexical_search(scope, terms, DEPTH))
        cpu_ms.append((time.process_time() - started) * 1000)
    return cpu_ms, found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lexical_topk", description=__doc__)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--replicate", type=int, default=1)
    parser.add_argument("--queries", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--store-cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument(
        "--min-matches",
        type=int,
        default=lexical_topk.PRUNE_FROM_MATCHES,
        help="the pruned side's floor of matches (PRUNE_FROM_MATCHES; 0 prunes every search)",
    )
    parser.add_argument("--seeded-with", metavar="FINGERPRINT", help="as python -m bench.hotpath's")
    args = parser.parse_args(argv)
    corpus = Corpus.load(args.locomo)
    cached = seeded_store(
        args.store_cache, corpus, args.size, LEXICAL, seeded_with=args.seeded_with
    )
    queries = [q for q in (lexical.query_terms(corpus.query(i)) for i in range(args.queries)) if q]
    pruning, matches = lexical_topk.PRUNE_FROM_ROWS, lexical_topk.PRUNE_FROM_MATCHES
    with tempfile.TemporaryDirectory(prefix="lexical-topk-") as tmp:
        path = Path(tmp) / "engram.db"
        shutil.copy(cached.data_dir / "engram.db", path)
        replicate(path, args.replicate)
        with sqlite3.connect(path) as conn:
            tenant, workspace, _ = conn.execute("SELECT * FROM lexical_tables").fetchone()
        conn.close()
        scope = Scope(tenant, workspace)
        store = SqliteStore(path)
        try:
            searches(store, scope, queries[:5])  # the page cache, the statements
            cpu: dict[str, list[float]] = {"pruned": [], "plain": []}
            found: dict[str, list[list[IndexHit]]] = {}
            for _ in range(args.rounds):
                for name, rows, least in (("pruned", 0, args.min_matches), ("plain", 2**62, 0)):
                    lexical_topk.PRUNE_FROM_ROWS = rows  # type: ignore[misc]
                    lexical_topk.PRUNE_FROM_MATCHES = least  # type: ignore[misc]
                    ms, found[name] = searches(store, scope, queries)
                    cpu[name] += ms
        finally:
            lexical_topk.PRUNE_FROM_ROWS = pruning  # type: ignore[misc]
            lexical_topk.PRUNE_FROM_MATCHES = matches  # type: ignore[misc]
            store.close()
    report(args.size * args.replicate, cpu, found["pruned"], found["plain"])
    return 0


def report(
    records: int,
    cpu: dict[str, list[float]],
    pruned: list[list[IndexHit]],
    plain: list[list[IndexHit]],
) -> None:
    orders = sum(
        [h.record_id for h in a] != [h.record_id for h in b]
        for a, b in zip(pruned, plain, strict=True)
    )
    pairs = [
        (a.score, b.score)
        for x, y in zip(pruned, plain, strict=True)
        for a, b in zip(x, y, strict=False)
    ]
    differ = [abs(a - b) / math.ulp(b) for a, b in pairs if a != b]
    for name, ms in cpu.items():
        print(
            f"{name} n={records}: CPU ms per search p50 {statistics.median(ms):.2f} "
            f"mean {statistics.fmean(ms):.2f} p90 {statistics.quantiles(ms, n=10)[-1]:.2f}"
        )
    print(
        f"searches whose records or order differ: {orders} of {len(plain)}; scores differing: "
        f"{len(differ)} of {len(pairs)}, by at most {max(differ, default=0):.0f} ulps"
    )


if __name__ == "__main__":
    raise SystemExit(main())

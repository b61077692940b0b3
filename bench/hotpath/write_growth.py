"""``python -m bench.hotpath.write_growth``: CPU per capture + admission pair by store size.

How a pair's engine CPU grows with the store (issue 39): for each size, the bench's cached seeded
store (``stores.seeded_store``, seeded first when missing) is copied to a tmpfs scratch, opened
with ``open_server`` as the MCP tools open it, and ``warmup + pairs`` new memories are captured
and admitted through ``Engine.handle`` (the memories after the seeded ones, as the hot path's
writes take them). CPU is ``time.process_time()`` over the timed pairs; the scratch is on tmpfs,
so fsyncs cost nothing and what is measured is the engine's CPU, not the disk's.

``--tables N``: instead, the store's two growing write-path tables alone, on a bare database in
tmpfs, N LoCoMo memories one transaction each: CPU per FTS5 insert (the analyzed fields) and per
near-duplicate lookup + band insert (``near_bands``), by stretch of the store's growth.

``--seeded-with FINGERPRINT``: the stores another version of the product seeded (a change that
leaves the store's format as it was need not reseed). ``--cprofile N``: also print the N functions with the most cumulative time under
``Engine.handle`` (one profile per size, a separate run of the same pairs on a fresh copy).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.in_process import DEFAULT_LOCOMO

from .corpus import Corpus
from .stores import _SCRATCH, LEXICAL, PROFILES, SeededStore, seeded_store

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO / "bench" / "results" / "hotpath-stores"


def _pairs(store: SeededStore, corpus: Corpus, warmup: int, pairs: int, profiler: Any) -> float:
    """CPU ms per timed pair on a fresh copy of ``store``."""
    from bench.locomo.calls import value
    from bench.locomo.clients import EngineClient
    from engram_memory.embedded.serve import open_server

    scratch = _SCRATCH if _SCRATCH.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="write-growth-", dir=scratch) as tmp:
        data = Path(tmp) / "data"
        shutil.copytree(store.data_dir, data)
        server = open_server(data)
        client = EngineClient(server.host.engine, tenant=server.surface.runtime.host.tenant_id)

        def pair(index: int) -> None:
            memory = corpus.memory(index)
            captured = value(
                client.call("ws-hotpath", "capture", memory.capture_arguments("g")), "c"
            )
            admitted = value(
                client.call(
                    "ws-hotpath",
                    "request_admission",
                    memory.admission_arguments(captured["candidate_id"], "g"),
                ),
                "request_admission",
            )
            if admitted["outcome"]["status"] != "accepted":
                raise RuntimeError(f"memory {index} was {admitted['outcome']['status']}")

        try:
            for index in range(store.size, store.size + warmup):
                pair(index)
            if profiler is not None:
                profiler.enable()
            cpu = time.process_time()
            for index in range(store.size + warmup, store.size + warmup + pairs):
                pair(index)
            cpu = time.process_time() - cpu
            if profiler is not None:
                profiler.disable()
        finally:
            server.close()
    return 1000 * cpu / pairs


def tables(corpus: Corpus, size: int) -> None:
    """``--tables``: the band lookup, the FTS5 insert, the band insert and the commit (its WAL
    write), µs of CPU by stretch."""
    import sqlite3

    from engram_memory.adapters.local.sqlite import near_bands
    from engram_memory.adapters.local.sqlite.connections import PAGE_CACHE_KIB
    from engram_memory.engine import lexical
    from engram_memory.engine.context import Scope

    scope = Scope("bench-tenant", "bench-workspace")

    scratch = _SCRATCH if _SCRATCH.is_dir() else None
    with tempfile.TemporaryDirectory(prefix="write-tables-", dir=scratch) as tmp:
        conn = sqlite3.connect(Path(tmp) / "tables.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
        conn.execute(
            "CREATE VIRTUAL TABLE lex USING fts5(record_id UNINDEXED, f_primary, f_context)"
        )
        near_bands.create(conn, "lex")
        spent = dict.fromkeys(("band lookup", "fts5 insert", "band insert", "commit"), 0.0)
        start = 0
        for index in range(size):
            turn = corpus.memory(index).turn
            fields = [" ".join(lexical.analyze(text)) for text in (turn.primary, turn.context)]
            text = turn.primary + "\n" + turn.context
            times = [time.process_time()]
            near_bands.alike(conn, scope, "lex", text, 8)
            times.append(time.process_time())
            conn.execute("BEGIN IMMEDIATE")
            rowid = conn.execute(
                "INSERT INTO lex VALUES (?, ?, ?)", (str(index), *fields)
            ).lastrowid
            times.append(time.process_time())
            near_bands.insert(conn, scope, "lex", int(rowid or 0), text)
            times.append(time.process_time())
            conn.execute("COMMIT")
            times.append(time.process_time())
            for name, before, after in zip(spent, times, times[1:], strict=False):
                spent[name] += after - before
            if index + 1 in (1000, 10000, 30000, 60000, 100000, size):
                each = ", ".join(
                    f"{k} {1e6 * v / (index + 1 - start):.0f} µs" for k, v in spent.items()
                )
                print(f"records {start}-{index + 1}: {each}", flush=True)
                spent = dict.fromkeys(spent, 0.0)
                start = index + 1
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hotpath.write_growth", description=__doc__
    )
    parser.add_argument("--sizes", default="1000,10000", help="store sizes (1000,10000)")
    parser.add_argument("--pairs", type=int, default=100, help="timed pairs per run (100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed pairs first (10)")
    parser.add_argument("--repetitions", type=int, default=3, help="runs per size, interleaved")
    parser.add_argument("--profile", choices=PROFILES, default=LEXICAL)
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N functions")
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--store-cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument(
        "--seeded-with",
        help="use the cached stores seeded by this product fingerprint (same store format)",
    )
    parser.add_argument("--tables", type=int, default=0, help="the two tables alone, N records")
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",") if part.strip()]
    corpus = Corpus.load(args.locomo)
    if args.tables:
        tables(corpus, args.tables)
        return 0
    stores = {}
    for size in sizes:
        started = time.perf_counter()
        stores[size] = seeded_store(
            args.store_cache, corpus, size, args.profile, seeded_with=args.seeded_with
        )
        print(f"store n{size}: ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    cpu: dict[int, list[float]] = {size: [] for size in sizes}
    for repetition in range(args.repetitions):
        order = sizes if repetition % 2 == 0 else list(reversed(sizes))
        for size in order:
            cpu[size].append(_pairs(stores[size], corpus, args.warmup, args.pairs, None))
            print(f"rep {repetition + 1} n{size}: {cpu[size][-1]:.2f} ms", file=sys.stderr)
    base = statistics.median(cpu[sizes[0]])
    for size in sizes:
        values = cpu[size]
        median = statistics.median(values)
        print(
            f"n{size}: CPU per pair {median:.2f} ms [{min(values):.2f}-{max(values):.2f}],"
            f" ×{median / base:.2f} of n{sizes[0]}"
        )
    for size in sizes if args.cprofile else ():
        profiler = cProfile.Profile()
        _pairs(stores[size], corpus, args.warmup, args.pairs, profiler)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(args.cprofile)
        print(f"--- cProfile n{size}, {args.pairs} pairs ---")
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What sealed record bodies cost, in process (issue 12): write, search and get on the embedded
engine, and the bytes a record takes on disk.

One fresh data directory; ``--records`` memories (LoCoMo turns, bench/hotpath's corpus) written
as capture + request_admission pairs through ``Engine.handle`` (no transport), timed as
pairs/s; then ``--searches`` searches (LoCoMo questions, limit 10) and as many gets, p50 and
p99; then the data directory's bytes (``engram.db``, its -wal, the key file) per record.

Wall time on a shared machine mostly measures the other processes; each figure is also given as
the process's CPU time (``time.process_time``), which they disturb far less. With sealed bodies,
``open_page_us`` is what opening one search page of 10 bodies costs (one key-store read and 20
AES-GCM operations), the part of a search that sealing adds.

Run the same script against another tree for a before/after comparison (the tree's package comes
first on the path)::

    python -m bench.sealed_bodies --records 1000
    PYTHONPATH=/tmp/before/layers/core python -m bench.sealed_bodies --records 1000

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.hotpath.corpus import Corpus
from bench.hotpath.stores import directory_bytes
from bench.in_process import DEFAULT_LOCOMO, bench_context, envelope, remember_all, seeding_policy
from bench.locomo.calls import PURPOSE
from bench.locomo.runner import percentile


def run(corpus: Corpus, records: int, searches: int) -> dict[str, Any]:
    import engram_memory
    from engram_memory.embedded.composition import init_data_dir, open_embedded

    with tempfile.TemporaryDirectory(prefix="engram-sealed-bench-") as tmp:
        data = Path(tmp) / "data"
        init_data_dir(data)
        host = open_embedded(data, policy=seeding_policy())
        try:
            engine = host.engine
            started, started_cpu = time.perf_counter(), time.process_time()
            record_ids = remember_all(engine, corpus.memories(0, records), "sealed")
            write_s = time.perf_counter() - started
            write_cpu_s = time.process_time() - started_cpu

            search_ms: list[float] = []
            search_cpu_ms: list[float] = []
            hits = 0
            for index in range(searches):
                query = {"query": corpus.query(index), "purpose_ref": PURPOSE, "limit": 10}
                began, began_cpu = time.perf_counter(), time.process_time()
                found = engine.handle("search", query, bench_context())
                search_ms.append((time.perf_counter() - began) * 1000)
                search_cpu_ms.append((time.process_time() - began_cpu) * 1000)
                hits += len(envelope(found)["output"]["value"]["records"])
            get_ms: list[float] = []
            for index in range(searches):
                record_id = record_ids[(index * 7919) % len(record_ids)]
                began = time.perf_counter()
                got = engine.handle(
                    "get", {"record_id": record_id, "purpose_ref": PURPOSE}, bench_context()
                )
                get_ms.append((time.perf_counter() - began) * 1000)
                assert envelope(got)["ok"], got
            open_page_us = _open_page_us(host, record_ids[:10])
        finally:
            host.close()
        database = directory_bytes(data / "engram.db")
        keys = directory_bytes(data / "keys")
        return {
            "package": str(Path(engram_memory.__file__).parent),
            "records": records,
            "pairs_per_s": round(records / write_s, 1),
            "pair_cpu_ms": round(write_cpu_s * 1000 / records, 3),
            "search_p50_ms": round(statistics.median(search_ms), 3),
            "search_cpu_p50_ms": round(statistics.median(search_cpu_ms), 3),
            "search_p99_ms": round(percentile(search_ms, 99), 3),
            "search_hits": hits,
            "get_p50_ms": round(statistics.median(get_ms), 3),
            "open_page_us": open_page_us,
            "engram_db_bytes": database,
            "keys_bytes": keys,
            "bytes_per_record": round((database + keys) / records, 1),
            "engram_db_bytes_per_record": round(database / records, 1),
        }


def _open_page_us(host: Any, record_ids: list[str]) -> float | None:
    """Median microseconds to open the bodies of ``record_ids`` together (None before sealing)."""
    engine = host.engine
    bodies = getattr(engine, "bodies", None)
    if bodies is None:
        return None
    scope = host.store.scopes()[0]
    rows = list(host.store.records_get(scope, record_ids).values())
    timings = []
    for _ in range(200):
        began = time.perf_counter()
        opened = bodies(scope, rows)
        timings.append((time.perf_counter() - began) * 1_000_000)
        assert len(opened) == len(rows)
    return round(statistics.median(timings), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    args = parser.parse_args(argv)
    report = run(Corpus.load(args.locomo), args.records, args.searches)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

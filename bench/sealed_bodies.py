"""What sealed record bodies cost, in process (issue 12): write, search and get on the embedded
engine, and the bytes a record takes on disk.

One fresh data directory; ``--records`` memories (LoCoMo turns, bench/hotpath's corpus) written
as capture + request_admission pairs through ``Engine.handle`` (no transport), timed as
pairs/s; then ``--searches`` searches (LoCoMo questions, limit 10) and as many gets, p50 and
p99; then the data directory's bytes (``engram.db``, its -wal, the key file) per record.

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
from bench.locomo.runner import PURPOSE, percentile

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LOCOMO = REPO.parent / "shared" / "data" / "locomo"


def _context() -> Any:
    from engram_memory.engine.context import TrustedContext, new_audit_id

    return TrustedContext(
        tenant_id="local",
        workspace_id="default",
        principal="bench-agent",
        purpose_ref=PURPOSE,
        audit_id=new_audit_id(),
    )


def run(corpus: Corpus, records: int, searches: int) -> dict[str, Any]:
    import engram_memory
    from engram_memory.bootstrap import init_data_dir, open_embedded

    with tempfile.TemporaryDirectory(prefix="engram-sealed-bench-") as tmp:
        data = Path(tmp) / "data"
        init_data_dir(data)
        host = open_embedded(data)
        try:
            engine = host.engine
            record_ids: list[str] = []
            started = time.perf_counter()
            for memory in corpus.memories(0, records):
                arguments = memory.capture_arguments("sealed")
                captured = engine.handle("capture", arguments, _context())
                assert captured["ok"], captured
                candidate_id = captured["output"]["value"]["candidate_id"]
                admitted = engine.handle(
                    "request_admission",
                    memory.admission_arguments(candidate_id, "sealed"),
                    _context(),
                )
                outcome = admitted["output"]["value"]["outcome"]
                assert outcome["status"] == "accepted", outcome
                record_ids.append(outcome["record_id"])
            write_s = time.perf_counter() - started

            search_ms: list[float] = []
            hits = 0
            for index in range(searches):
                query = {"query": corpus.query(index), "purpose_ref": PURPOSE, "limit": 10}
                began = time.perf_counter()
                found = engine.handle("search", query, _context())
                search_ms.append((time.perf_counter() - began) * 1000)
                hits += len(found["output"]["value"]["records"])
            get_ms: list[float] = []
            for index in range(searches):
                record_id = record_ids[(index * 7919) % len(record_ids)]
                began = time.perf_counter()
                got = engine.handle(
                    "get", {"record_id": record_id, "purpose_ref": PURPOSE}, _context()
                )
                get_ms.append((time.perf_counter() - began) * 1000)
                assert got["ok"], got
        finally:
            host.close()
        database = directory_bytes(data / "engram.db")
        keys = directory_bytes(data / "keys")
        return {
            "package": str(Path(engram_memory.__file__).parent),
            "records": records,
            "pairs_per_s": round(records / write_s, 1),
            "search_p50_ms": round(statistics.median(search_ms), 3),
            "search_p99_ms": round(percentile(search_ms, 99), 3),
            "search_hits": hits,
            "get_p50_ms": round(statistics.median(get_ms), 3),
            "engram_db_bytes": database,
            "keys_bytes": keys,
            "bytes_per_record": round((database + keys) / records, 1),
            "engram_db_bytes_per_record": round(database / records, 1),
        }


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

"""``python -m bench.hotpath.inprocess``: CPU per search on the cached hot-path stores, in process.

What a served search costs the server, without the transport and the client: ``Engine.handle``
and the envelope's JSON (``envelope_json``), timed with ``time.process_time`` (CPU: on a loaded
machine the wall clock measures the neighbours). Each size runs on a fresh copy of its cached
store (``python -m bench.hotpath --seed-only`` makes them), the first ``WARM_UP`` searches
untimed (lazy imports, the page cache). ``--cprofile N`` profiles the N largest store's
searches and prints CPU by function, the figures the growth with store size is read from.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import pickle
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bench.in_process import DEFAULT_LOCOMO
from bench.locomo.calls import PURPOSE, value
from bench.locomo.runner import percentile

from .corpus import SEARCH_LIMIT, Corpus, Memory
from .sessions import WARM_UP_CALLS, Plan, Session, _ms_since
from .stores import DATA, LEXICAL, PROFILES, WORKSPACE, SeededStore, seeded_store

WARM_UP = 5


def measure(
    data_dir: Path, corpus: Corpus, queries: int, profiler: cProfile.Profile | None = None
) -> dict[str, Any]:
    """CPU (and wall) ms per search over ``queries`` LoCoMo questions on the store in ``data_dir``."""
    from bench.locomo.clients import EngineClient
    from engram_memory.contract.envelope import envelope_json
    from engram_memory.embedded.composition import open_existing

    host = open_existing(data_dir)
    try:
        client = EngineClient(host.engine, tenant=host.config.tenant_id)

        def search(query: str) -> tuple[int, str]:
            envelope = client.call(
                WORKSPACE, "search", {"query": query, "purpose_ref": PURPOSE, "limit": SEARCH_LIMIT}
            )
            envelope_json(envelope)
            found = value(envelope, "search")
            return len(found["records"]), found["rank_receipt"]["profile"]

        for i in range(WARM_UP):
            search(corpus.query(queries + i))
        cpu_ms: list[float] = []
        wall_ms: list[float] = []
        results: list[int] = []
        profiles: set[str] = set()
        for i in range(queries):
            query = corpus.query(i)
            started, started_cpu = time.perf_counter(), time.process_time()
            if profiler is not None:
                profiler.enable()
            count, profile = search(query)
            if profiler is not None:
                profiler.disable()
            cpu_ms.append((time.process_time() - started_cpu) * 1000)
            wall_ms.append((time.perf_counter() - started) * 1000)
            results.append(count)
            profiles.add(profile)
    finally:
        host.close()
    return {
        "searches": queries,
        "cpu_ms": {
            "p50": round(percentile(cpu_ms, 50), 2),
            "p99": round(percentile(cpu_ms, 99), 2),
            "mean": round(statistics.fmean(cpu_ms), 2),
        },
        "wall_ms": {
            "p50": round(percentile(wall_ms, 50), 2),
            "p99": round(percentile(wall_ms, 99), 2),
        },
        "mean_results": round(statistics.fmean(results), 2),
        "rank_profiles": sorted(profiles),
    }


def engine_session(data_dir: Path, store: SeededStore, plan: Plan) -> Session:
    """``plan`` (searches, gets, capture + admission pairs) through ``Engine.handle`` in process,
    wall clock as the served sessions time their calls: the engine's share of each tool
    (``runner.split``). "start" is opening the server (``open_server``) and its engine."""
    from bench.locomo.clients import EngineClient
    from engram_memory.embedded.serve import open_server

    from .sessions import ENGINE

    session = Session(ENGINE)
    started = time.perf_counter()
    server = open_server(data_dir)
    try:
        client = EngineClient(server.host.engine, tenant=server.surface.runtime.host.tenant_id)
        session.start_connect_s = time.perf_counter() - started

        def call(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            found: dict[str, Any] = value(client.call(WORKSPACE, tool, arguments), tool)
            return found

        _engine_reads(call, store, plan, session)
        _engine_writes(call, plan, session)
    finally:
        server.close()
    return session


_Call = Callable[[str, dict[str, Any]], dict[str, Any]]
_T = TypeVar("_T")


def _engine_reads(call: _Call, store: SeededStore, plan: Plan, session: Session) -> None:
    def search(query: str) -> int:
        arguments = {"query": query, "purpose_ref": PURPOSE, "limit": SEARCH_LIMIT}
        return len(call("search", arguments)["records"])

    def get(index: int) -> None:
        call("get", {"record_id": store.record_ids[index], "purpose_ref": PURPOSE})

    for query in plan.queries[:WARM_UP_CALLS]:
        search(query)
    for memory in plan.gets[:WARM_UP_CALLS]:
        get(memory.index)
    session.cpu_ms["search"] = _timed(
        plan.queries, lambda query: session.search_results.append(search(query)), session.search_ms
    )
    session.cpu_ms["get"] = _timed(plan.gets, lambda memory: get(memory.index), session.get_ms)


def _engine_writes(call: _Call, plan: Plan, session: Session) -> None:
    def write(memory: Memory) -> float:
        begun = time.perf_counter()
        captured = call("capture", memory.capture_arguments(plan.run_id))
        first_ms = _ms_since(begun)
        admission = memory.admission_arguments(captured["candidate_id"], plan.run_id)
        if call("request_admission", admission)["outcome"]["status"] != "accepted":
            raise RuntimeError(f"engine session: memory {memory.index} was not accepted")
        return first_ms

    for memory in plan.warm_writes:
        write(memory)
    session.cpu_ms["pair"] = _timed(
        plan.writes,
        lambda memory: session.first_write_ms.append(write(memory)),
        session.write_pair_ms,
    )


def _timed(items: Sequence[_T], run: Callable[[_T], object], durations: list[float]) -> float:
    """``run`` on each item, each call's wall ms appended to ``durations``: the CPU per call."""
    since = time.process_time()
    for item in items:
        begun = time.perf_counter()
        run(item)
        durations.append(_ms_since(begun))
    return _cpu_per_call(since, len(items))


def _cpu_per_call(since: float, calls: int) -> float:
    """This process's CPU per call since ``since`` (``time.process_time``), as the served
    sessions read their server's (``sessions.cpu_per_call``)."""
    return round((time.process_time() - since) * 1000 / calls, 3) if calls else 0.0


def main(argv: list[str] | None = None) -> int:
    from .__main__ import DEFAULT_CACHE, _sizes  # the CLI's, imported only when run as one

    parser = argparse.ArgumentParser(
        prog="python -m bench.hotpath.inprocess",
        description="CPU per search (Engine.handle + envelope JSON) on the cached hot-path stores.",
    )
    parser.add_argument("--sizes", type=_sizes, default=_sizes("1000,10000"))
    parser.add_argument("--profile", choices=PROFILES, default=LEXICAL)
    parser.add_argument("--queries", type=int, default=100, help="timed searches per size")
    parser.add_argument(
        "--cprofile", type=int, default=0, metavar="N", help="print the N top functions by CPU"
    )
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument("--store-cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--seeded-with", metavar="FINGERPRINT", help="as python -m bench.hotpath's")
    parser.add_argument("--session", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.session is not None:
        # One engine session for ``sessions.run_session``: its (store, plan), pickled beside
        # the data directory it runs on; the Session as one JSON line.
        store, plan = pickle.loads(args.session.read_bytes())  # noqa: S301 - our parent's
        session = engine_session(args.session.parent / DATA, store, plan)
        print(json.dumps(dataclasses.asdict(session) | {"rank_profiles": []}))
        return 0
    corpus = Corpus.load(args.locomo)
    sizes = sorted(args.sizes)
    found: dict[int, dict[str, Any]] = {}
    for size in sizes:
        store = seeded_store(
            args.store_cache, corpus, size, args.profile, seeded_with=args.seeded_with
        )
        profiler = (
            cProfile.Profile(time.process_time) if args.cprofile and size == sizes[-1] else None
        )
        with tempfile.TemporaryDirectory(prefix="hotpath-inprocess-") as tmp:
            copy = Path(tmp) / DATA
            shutil.copytree(store.data_dir, copy)
            found[size] = measure(copy, corpus, args.queries, profiler)
        print(f"{args.profile} n={size}: {found[size]}", flush=True)
        if profiler is not None:
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(args.cprofile)
            stats.sort_stats("cumulative").print_stats(args.cprofile)
            print(out.getvalue())
    first = found[sizes[0]]["cpu_ms"]["p50"]
    for size in sizes[1:]:
        growth = found[size]["cpu_ms"]["p50"] / first if first else float("inf")
        print(f"CPU p50 growth n={size} / n={sizes[0]}: {growth:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The hot-path run: seeded stores per size, interleaved sessions per repetition, the report."""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.locomo.runner import percentile

from .corpus import Corpus
from .floor import write_payloads
from .sessions import (
    ENGINE,
    ENGRAM_HTTP,
    ENGRAM_STDIO,
    ENGRAM_STDIO_GATE,
    ENGRAM_STDIO_NOTIME,
    FLOOR_OF,
    PEER,
    PEER_PACKAGE,
    WARM_UP_CALLS,
    Plan,
    Session,
    run_session,
)
from .stores import LEXICAL, SeededStore, directory_bytes, fingerprint, seeded_store

OURS = (ENGRAM_STDIO, ENGRAM_HTTP, ENGRAM_STDIO_NOTIME, ENGRAM_STDIO_GATE)
DEFAULT_OURS = (ENGRAM_STDIO, ENGRAM_HTTP)
# metric -> True when higher is better (ratios are always ours / peer)
RATIO_METRICS = {
    "search_p50_ms": False,
    "search_p99_ms": False,
    "get_p50_ms": False,
    "get_p99_ms": False,
    "start_connect_s": False,
    "ping_p50_ms": False,
    "pairs_per_s": True,
}
PEER_SINGLE_WRITE = "pairs_per_s_vs_peer_single_write"
# The split of each of our servers' figures per tool: label -> metric (``split``): the wall
# clock's p50, and the server process's CPU per call (the engine's: its own process's).
SPLIT_METRICS = {
    "search p50": "search_p50_ms",
    "get p50": "get_p50_ms",
    "capture+admission pair p50": "pair_p50_ms",
    "search CPU": "search_cpu_ms",
    "get CPU": "get_cpu_ms",
    "capture+admission pair CPU": "pair_cpu_ms",
}
SPLIT_PARTS = ("floor", "engine", "surface")


@dataclass(frozen=True)
class Counts:
    repetitions: int = 3
    pings: int = 20
    queries: int = 100
    gets: int = 100
    writes: int = 30


class PeerUnavailable(RuntimeError):
    """node or npm is missing, or the pinned server-memory could not be installed."""


def ensure_peer() -> Path:
    """The pinned ``@modelcontextprotocol/server-memory`` entry point (``npm ci`` when missing)."""
    entry = PEER_PACKAGE / "dist" / "index.js"
    if entry.exists() and installed_peer_version() == pinned_peer_version():
        return entry
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        raise PeerUnavailable("node and npm are needed for @modelcontextprotocol/server-memory")
    folder = Path(__file__).parent
    done = subprocess.run(  # noqa: S603 - a fixed command on the pinned lock file
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=folder,
        env={**os.environ, "NO_UPDATE_NOTIFIER": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 or not entry.exists():
        raise PeerUnavailable(f"npm ci failed in {folder}: {done.stderr.strip()[-500:]}")
    return entry


def pinned_peer_version() -> str:
    lock = json.loads((Path(__file__).parent / "package-lock.json").read_text(encoding="utf-8"))
    version: str = lock["packages"]["node_modules/@modelcontextprotocol/server-memory"]["version"]
    return version


def installed_peer_version() -> str | None:
    manifest = PEER_PACKAGE / "package.json"
    if not manifest.exists():
        return None
    version: str = json.loads(manifest.read_text(encoding="utf-8"))["version"]
    return version


# -- arithmetic ---------------------------------------------------------------------------------


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median and range of per-repetition values."""
    return {
        "per_repetition": list(values),
        "median": round(statistics.median(values), 4),
        "min": min(values),
        "max": max(values),
    }


def ratio(ours: float, peer: float) -> float:
    return round(ours / peer, 4) if peer else float("inf")


def session_metrics(session: Session) -> dict[str, Any]:
    """The figures of one session (rounded; ratios are computed from these)."""
    pair_s = sum(session.write_pair_ms) / 1000
    first_s = sum(session.first_write_ms) / 1000
    metrics: dict[str, Any] = {
        "start_connect_s": round(session.start_connect_s, 3),
        "ping_p50_ms": round(percentile(session.ping_ms, 50), 3),
        "search_p50_ms": round(percentile(session.search_ms, 50), 3),
        "search_p99_ms": round(percentile(session.search_ms, 99), 3),
        "search_mean_results": round(statistics.fmean(session.search_results), 2)
        if session.search_results
        else 0.0,
        "get_p50_ms": round(percentile(session.get_ms, 50), 3),
        "get_p99_ms": round(percentile(session.get_ms, 99), 3),
        "pair_p50_ms": round(percentile(session.write_pair_ms, 50), 3),
        **{
            f"{phase}_cpu_ms": session.cpu_ms.get(phase, 0.0)
            for phase in ("search", "get", "pair", "start")
        },
        "pairs_per_s": round(len(session.write_pair_ms) / pair_s, 3) if pair_s else 0.0,
        "single_writes_per_s": round(len(session.first_write_ms) / first_s, 3) if first_s else 0.0,
        "rank_profiles": sorted(session.rank_profiles),
        "searches": len(session.search_ms),
        "gets": len(session.get_ms),
        "writes": len(session.write_pair_ms),
    }
    if session.envelope:
        sent, text = session.envelope["response_bytes"], session.envelope["text_bytes"]
        metrics["envelope"] = {
            "response_bytes": sent,
            "text_bytes": text,
            "bytes_per_result": round(sent / 10, 1),
            "times_text": round(sent / text, 2) if text else None,
        }
    return metrics


def repetition_ratios(servers: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """ours / peer for every ratio metric and each of our transports, in one repetition."""
    peer = servers[PEER]
    ratios: dict[str, dict[str, float]] = {}
    for ours in OURS:
        if ours not in servers:
            continue
        mine = servers[ours]
        row = {name: ratio(mine[name], peer[name]) for name in RATIO_METRICS}
        row[PEER_SINGLE_WRITE] = ratio(mine["pairs_per_s"], peer["single_writes_per_s"])
        ratios[ours] = row
    return ratios


def split(ours: float, floor: float, engine: float) -> dict[str, float]:
    """``ours`` as SDK floor + engine + surface (the rest), each part ≥ 0 and the three summing
    to ``ours``: the floor is taken first and the engine from what is left, so on a noisy
    machine where the measured floor + engine exceed ours the surface is 0 and the parts say
    so (``measured_floor``, ``measured_engine`` keep the raw figures)."""
    floor_part = min(floor, ours)
    engine_part = min(engine, ours - floor_part)
    return {
        "ours": ours,
        "floor": floor_part,
        "engine": engine_part,
        "surface": max(ours - floor_part - engine_part, 0.0),  # never -0.0 from rounding
        "measured_floor": floor,
        "measured_engine": engine,
    }


def repetition_split(servers: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Each of our servers' p50 per tool split against its transport's floor and the engine,
    in one repetition."""
    found: dict[str, dict[str, dict[str, float]]] = {}
    for ours in OURS:
        floor = FLOOR_OF[ours]
        if ours in servers and floor in servers and ENGINE in servers:
            found[ours] = {
                label: split(servers[ours][m], servers[floor][m], servers[ENGINE][m])
                for label, m in SPLIT_METRICS.items()
            }
    return found


def split_summary(repetitions: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The split of the medians over the repetitions (parts sum to our median), and each part's
    range over the repetitions' own splits (the noise)."""
    found: dict[str, dict[str, dict[str, Any]]] = {}
    for ours in repetitions[0].get("split", {}):
        found[ours] = {}
        for label, metric in SPLIT_METRICS.items():
            medians = {
                name: statistics.median(r["servers"][name][metric] for r in repetitions)
                for name in (ours, FLOOR_OF[ours], ENGINE)
            }
            cell: dict[str, Any] = split(medians[ours], medians[FLOOR_OF[ours]], medians[ENGINE])
            cell["ranges"] = {
                part: [
                    min(r["split"][ours][label][part] for r in repetitions),
                    max(r["split"][ours][label][part] for r in repetitions),
                ]
                for part in SPLIT_PARTS
            }
            found[ours][label] = cell
    return found


def disk_report(store: SeededStore, corpus: Corpus) -> dict[str, Any]:
    """Bytes on disk per record: whole data directory / records, and beyond the memory text."""
    text = sum(m.text_bytes for m in corpus.memories(0, store.size))
    ours = directory_bytes(store.data_dir)
    peer = directory_bytes(store.peer_file)
    files = {
        str(p.relative_to(store.data_dir)): p.stat().st_size
        for p in sorted(store.data_dir.rglob("*"))
        if p.is_file()
    }
    return {
        "records": store.size,
        "text_bytes_per_record": round(text / store.size, 1),
        "engram": {
            "bytes": ours,
            "per_record": round(ours / store.size, 1),
            "beyond_text_per_record": round((ours - text) / store.size, 1),
            "files": files,
        },
        PEER: {
            "bytes": peer,
            "per_record": round(peer / store.size, 1),
            "beyond_text_per_record": round((peer - text) / store.size, 1),
        },
    }


# -- calibration --------------------------------------------------------------------------------


def start_ms(command: Sequence[str], times: int = 5) -> float:
    """Median wall time of running ``command`` to completion."""
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)  # noqa: S603
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 2)


def calibration(with_peer: bool) -> dict[str, Any]:
    found: dict[str, Any] = {"python_c_pass_ms": start_ms([sys.executable, "-c", "pass"])}
    node = shutil.which("node")
    if with_peer and node is not None:
        found["node_e_0_ms"] = start_ms([node, "-e", "0"])
    return found


# -- the run ------------------------------------------------------------------------------------


def plan_for(
    corpus: Corpus, size: int, counts: Counts, repetition: int, floor_payloads: Path | None = None
) -> Plan:
    chooser = random.Random(size)  # the same reads in every repetition and for every server
    return Plan(
        pings=counts.pings,
        queries=[corpus.query(i) for i in range(counts.queries)],
        gets=[corpus.memory(i) for i in chooser.sample(range(size), min(counts.gets, size))],
        writes=corpus.memories(size, size + counts.writes),
        ten=corpus.memories(0, min(10, size)),
        run_id=f"r{repetition}",
        floor_payloads=floor_payloads,
        warm_writes=corpus.memories(size + counts.writes, size + counts.writes + WARM_UP_CALLS),
    )


def _report_header(
    corpus: Corpus,
    counts: Counts,
    servers: list[str],
    profile: str,
    with_peer: bool,
    seeded_with: str | None,
) -> dict[str, Any]:
    """The report before any measurement: the machine, the calibration, what is compared."""
    return {
        "machine": {"cpus": os.cpu_count(), "load_average_before": os.getloadavg()},
        "calibration": calibration(with_peer),
        "profile": profile,
        "counts": counts.__dict__,
        "servers": servers,
        "peer": {
            "package": "@modelcontextprotocol/server-memory",
            "version": installed_peer_version(),
        }
        if with_peer
        else None,
        "dataset": {"conversations": corpus.names, "distinct_turns": corpus.distinct_turns},
        "sizes": {},
        "stores_seeded_with": seeded_with or fingerprint(corpus),
    }


def servers_for(ours: Sequence[str], *, with_peer: bool, with_floor: bool) -> list[str]:
    """Ours, then (``with_floor``) the floor of each of our transports and the engine in
    process, then the peer."""
    floors = list(dict.fromkeys(FLOOR_OF[name] for name in ours)) if with_floor else []
    return [*ours, *floors, *([ENGINE] if with_floor else []), *([PEER] if with_peer else [])]


def run(
    corpus: Corpus,
    sizes: Sequence[int],
    counts: Counts,
    *,
    cache_root: Path,
    profile: str = LEXICAL,
    with_peer: bool = True,
    with_floor: bool = True,
    ours: Sequence[str] = DEFAULT_OURS,
    seeded_with: str | None = None,
    log: Any = sys.stderr,
) -> dict[str, Any]:
    """Every size's store is seeded (or found) first, and the floor's payloads taken from it;
    then each repetition runs every size in turn, so the sizes compare under the same load
    (``growth``: search p50 at each size over the smallest's, per repetition)."""
    servers = servers_for(ours, with_peer=with_peer, with_floor=with_floor)
    if with_peer:
        ensure_peer()
    report = _report_header(corpus, counts, servers, profile, with_peer, seeded_with)
    stores = {}
    for size in sizes:
        print(f"store of {size} records", file=log, flush=True)
        stores[size] = seeded_store(cache_root, corpus, size, profile, log, seeded_with)
    repetitions: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
    with tempfile.TemporaryDirectory(prefix="hotpath-") as tmp:
        payloads = {
            size: write_payloads(
                stores[size], plan_for(corpus, size, counts, 0), Path(tmp) / f"floor-{size}"
            )
            if with_floor
            else None
            for size in sizes
        }
        for repetition in range(counts.repetitions):
            for size in sizes:
                plan = plan_for(corpus, size, counts, repetition, payloads[size])
                turn = repetition % len(servers)
                order = servers[turn:] + servers[:turn]  # interleaved: each leads in turn
                measured = {}
                for name in order:
                    print(f"  repetition {repetition + 1}, {size}: {name}", file=log, flush=True)
                    session = run_session(name, Path(tmp) / name, stores[size], plan)
                    measured[name] = session_metrics(session)
                entry: dict[str, Any] = {"order": order, "servers": measured}
                if with_peer:
                    entry["ratios"] = repetition_ratios(measured)
                if with_floor:
                    entry["split"] = repetition_split(measured)
                repetitions[size].append(entry)
                load = os.getloadavg()
                entry["load_average_after"] = load
    for size in sizes:
        report["sizes"][str(size)] = _size_report(stores[size], corpus, repetitions[size], servers)
    report["growth"] = growth(repetitions, sizes, [s for s in servers if s != PEER])
    report["machine"]["load_average_after"] = os.getloadavg()
    return report


def growth(
    repetitions: dict[int, list[dict[str, Any]]], sizes: Sequence[int], servers: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Per server and larger size: search p50 and p99 and the write pair's server CPU there
    over the smallest size's, each ratio taken within one repetition (the same load), median
    and range."""
    smallest = min(sizes)
    found: dict[str, dict[str, Any]] = {}
    for server in servers:
        per_size: dict[str, Any] = {}
        for size in sizes:
            if size == smallest:
                continue
            pairs = list(zip(repetitions[smallest], repetitions[size], strict=True))
            per_size[str(size)] = {
                metric: spread(
                    [
                        ratio(big["servers"][server][metric], small["servers"][server][metric])
                        for small, big in pairs
                    ]
                )
                for metric in ("search_p50_ms", "search_p99_ms", "pair_cpu_ms")
                if small_has(repetitions[smallest], server, metric)
            }
        found[server] = {"over": smallest, "sizes": per_size}
    return found


def small_has(repetitions: Sequence[dict[str, Any]], server: str, metric: str) -> bool:
    """Whether every repetition measured ``metric`` for ``server`` (the engine in process has
    no server CPU)."""
    return all(r["servers"][server].get(metric) is not None for r in repetitions)


def _size_report(
    store: SeededStore, corpus: Corpus, repetitions: list[dict[str, Any]], servers: list[str]
) -> dict[str, Any]:
    summary = {
        name: {
            metric: spread([r["servers"][name][metric] for r in repetitions])
            for metric in (
                *RATIO_METRICS,
                "pair_p50_ms",
                "search_cpu_ms",
                "get_cpu_ms",
                "pair_cpu_ms",
                "start_cpu_ms",
                "single_writes_per_s",
                "search_mean_results",
            )
        }
        for name in servers
    }
    found: dict[str, Any] = {
        "seed": {
            "seconds": store.seed_seconds,
            "grown_from": store.seeded_from,
            "engine_pairs_per_s": round((store.size - store.seeded_from) / store.seed_seconds, 2)
            if store.seed_seconds
            else None,
        },
        "disk": disk_report(store, corpus),
        "repetitions": repetitions,
        "summary": summary,
    }
    if ENGRAM_STDIO in servers and ENGRAM_STDIO_NOTIME in servers:
        # What time-aware ranking costs: the same transport with and without it, per repetition.
        found["time_aware_over_notime"] = {
            metric: spread(
                [
                    ratio(
                        r["servers"][ENGRAM_STDIO][metric],
                        r["servers"][ENGRAM_STDIO_NOTIME][metric],
                    )
                    for r in repetitions
                ]
            )
            for metric in ("search_p50_ms", "search_p99_ms")
        }
    if repetitions[0].get("split"):
        found["split"] = split_summary(repetitions)
    if PEER in servers:
        found["ratios"] = {
            ours: {
                metric: spread([r["ratios"][ours][metric] for r in repetitions])
                for metric in [*RATIO_METRICS, PEER_SINGLE_WRITE]
            }
            for ours in OURS
            if ours in servers
        }
    return found

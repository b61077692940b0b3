"""``python -m bench.hotpath [--sizes 1000,10000] [--quick] [--json PATH]``: the hot-path benchmark."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.in_process import DEFAULT_LOCOMO
from bench.output import write_json

from .corpus import Corpus
from .report import table
from .runner import DEFAULT_OURS, OURS, Counts, PeerUnavailable, run
from .stores import LEXICAL, PROFILES, StoreMissing, seeded_store

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = REPO / "bench" / "results" / "hotpath-stores"
QUICK = Counts(repetitions=3, pings=10, queries=20, gets=20, writes=5)
QUICK_SIZES = "300"


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 10:
        raise argparse.ArgumentTypeError("sizes are comma-separated record counts, each ≥ 10")
    return sizes


def _transports(text: str) -> list[str]:
    chosen = [f"engram-{part.strip()}" for part in text.split(",") if part.strip()]
    if not chosen or any(name not in OURS for name in chosen):
        raise argparse.ArgumentTypeError(
            "transports are stdio, http, stdio-notime (stdio without time-aware ranking),"
            " stdio-gate (stdio with the admission quality gate on), comma-separated"
        )
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.hotpath",
        description="Hot path through MCP (stdio and HTTP) beside @modelcontextprotocol/server-memory.",
    )
    parser.add_argument("--sizes", type=_sizes, help="store sizes (default 1000,10000)")
    parser.add_argument("--quick", action="store_true", help=f"a small run (sizes {QUICK_SIZES})")
    parser.add_argument("--repetitions", type=int, help="interleaved repetitions (default 3)")
    parser.add_argument("--queries", type=int, help="timed searches per session (default 100)")
    parser.add_argument("--gets", type=int, help="timed gets per session (default 100)")
    parser.add_argument("--writes", type=int, help="timed writes per session (default 30)")
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default=LEXICAL,
        help="our search profile: the host default (lexical) or hybrid (needs the semantic extra)",
    )
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO, help="LoCoMo folder")
    parser.add_argument(
        "--store-cache", type=Path, default=DEFAULT_CACHE, help="where seeded stores are kept"
    )
    parser.add_argument(
        "--without-peer",
        action="store_true",
        help="run without server-memory (no ratios); only for machines without node/npm",
    )
    parser.add_argument(
        "--without-floor",
        action="store_true",
        help="skip the SDK floor servers and the engine in process (no split of our time)",
    )
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the report here")
    parser.add_argument(
        "--transports",
        type=_transports,
        default=list(DEFAULT_OURS),
        help="our servers to measure, comma-separated: stdio, http, stdio-gate (stdio with the"
        " admission quality gate on), stdio-notime (stdio with"
        " search.time_aware false, to read what time-aware ranking costs); default stdio,http",
    )
    parser.add_argument(
        "--seeded-with",
        metavar="FINGERPRINT",
        help="measure on the cached stores seeded by this product source (the <profile>-FINGERPRINT"
        " folder of the store cache) instead of the current source's: only for a change that"
        " cannot change what is stored",
    )
    parser.add_argument(
        "--seed-only",
        action="store_true",
        help="seed (or find) the cached stores of --sizes and stop: nothing is measured",
    )
    return parser


def _seed_only(args: argparse.Namespace, corpus: Corpus, sizes: list[int]) -> None:
    """Seed (or find) the cached store of each size and say where it is."""
    for size in sorted(sizes):
        store = seeded_store(args.store_cache, corpus, size, args.profile)
        added = store.size - store.seeded_from
        rate = added / store.seed_seconds if store.seed_seconds else 0.0
        print(
            f"{args.profile} n={size}: {store.root}"
            f" (grown from {store.seeded_from} at {rate:.1f} pairs/s)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    base = QUICK if args.quick else Counts()
    counts = Counts(
        repetitions=args.repetitions or base.repetitions,
        pings=base.pings,
        queries=args.queries or base.queries,
        gets=args.gets or base.gets,
        writes=args.writes or base.writes,
    )
    sizes = args.sizes or _sizes(QUICK_SIZES if args.quick else "1000,10000")
    corpus = Corpus.load(args.locomo)
    if args.seed_only:
        _seed_only(args, corpus, sizes)
        return 0
    try:
        report = run(
            corpus,
            sizes,
            counts,
            cache_root=args.store_cache,
            profile=args.profile,
            with_peer=not args.without_peer,
            with_floor=not args.without_floor,
            ours=args.transports,
            seeded_with=args.seeded_with,
        )
    except PeerUnavailable as error:
        parser.error(f"{error} (or pass --without-peer)")
    except StoreMissing as error:
        parser.error(str(error))
    report["command"] = "python -m bench.hotpath " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    print(table(report))
    write_json(args.json_path, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.soak [--minutes 10] [--clients 32] [--json PATH]`` (see ``bench.soak``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.output import write_json
from engram_memory.embedded.memory_trace import TRACE_DIR_ENV, TRACE_EVERY_ENV, TRACE_FRAMES_ENV

from .flatness import PASS
from .runner import MIX, READ_ONLY_FRACTION, REVISIONS, Traffic, run_soak, table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Soak: many MCP clients of mixed traffic against engram-memory serve.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="duration (default 10)")
    parser.add_argument("--seconds", type=float, help="duration in seconds (overrides --minutes)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json", type=Path, help="also write the full report here")
    parser.add_argument(
        "--revision",
        choices=[*REVISIONS, "both"],
        default="both",
        help="the clients' protocol revision (default both, half each)",
    )
    parser.add_argument(
        "--tools",
        help="comma-separated tools to call, with their usual weights (default all six)",
    )
    parser.add_argument(
        "--read-only-fraction",
        type=float,
        default=READ_ONLY_FRACTION,
        help="the last part of the run, as a fraction of it, that sends only search and get"
        f" (default {READ_ONLY_FRACTION}; 0: none)",
    )
    parser.add_argument(
        "--require-flat",
        action="store_true",
        help="exit 1 unless the flatness verdict is PASS (by default the verdict is only printed)",
    )
    parser.add_argument(
        "--trace-memory",
        type=Path,
        metavar="DIR",
        help="have the server write tracemalloc snapshots to DIR (a diagnostic: slower)",
    )
    parser.add_argument("--trace-every", type=float, default=60.0, help="seconds between snapshots")
    parser.add_argument(
        "--trace-frames",
        type=int,
        default=1,
        help="tracemalloc frames per allocation; 0: no tracemalloc, only RSS, malloc, SQLite"
        " and object counts (default 1)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    if seconds <= 0 or args.clients < 1:
        parser.error("the duration and the number of clients must be positive")
    tools = args.tools.split(",") if args.tools else list(MIX)
    if not tools or not set(tools) <= set(MIX):
        parser.error(f"--tools takes names among {', '.join(MIX)}")
    if not 0 <= args.read_only_fraction < 1:
        parser.error("--read-only-fraction is at least 0 and below 1")
    revisions = REVISIONS if args.revision == "both" else (args.revision,)
    traffic = Traffic(
        revisions=revisions,
        mix={tool: MIX[tool] for tool in tools},
        read_only_fraction=args.read_only_fraction,
    )
    env = None
    if args.trace_memory is not None:
        env = {
            TRACE_DIR_ENV: str(args.trace_memory.resolve()),
            TRACE_EVERY_ENV: str(args.trace_every),
            TRACE_FRAMES_ENV: str(args.trace_frames),
        }
    result = run_soak(
        seconds=seconds, clients=args.clients, seed=args.seed, traffic=traffic, server_env=env
    )
    print(table(result))
    write_json(args.json, result)
    print(json.dumps({key: value for key, value in result.items() if key != "server"}))
    sys.stdout.flush()
    if args.require_flat and result["flatness"]["verdict"] != PASS:
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

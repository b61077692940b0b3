"""``python -m bench.soak [--minutes 10] [--clients 32] [--json PATH]`` (see ``bench.soak``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .runner import run_soak, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Soak: many MCP clients of mixed traffic against engram-memory serve.",
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="duration (default 10)")
    parser.add_argument("--seconds", type=float, help="duration in seconds (overrides --minutes)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json", type=Path, help="also write the full report here")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    if seconds <= 0 or args.clients < 1:
        parser.error("the duration and the number of clients must be positive")
    result = run_soak(seconds=seconds, clients=args.clients, seed=args.seed)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({key: value for key, value in result.items() if key != "server"}))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m bench.locomo DIR [--profile lexical|semantic|hybrid|all] [--json PATH] [--via-mcp]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.output import write_json

from .dataset import load_dir
from .runner import PROFILES, run_benchmark, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.locomo",
        description="LoCoMo retrieval benchmark: recall@1/5/10 and MRR of evidence turns.",
    )
    parser.add_argument("directory", type=Path, help="folder of LoCoMo conv-*.json files")
    parser.add_argument("--profile", choices=[*PROFILES, "all"], default="all")
    parser.add_argument("--json", type=Path, dest="json_path", help="also write the report here")
    parser.add_argument(
        "--via-mcp",
        action="store_true",
        help="call the tools through the embedded MCP HTTP endpoint instead of Engine.handle",
    )
    parser.add_argument(
        "--fusion",
        choices=["minmax", "rrf"],
        default="minmax",
        help="how hybrid fuses the two lists (the host's search.fusion; default minmax)",
    )
    parser.add_argument(
        "--data-dir", type=Path, help="keep the engine's data here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    conversations = load_dir(args.directory)
    if not conversations:
        parser.error(f"no *.json conversation in {args.directory}")
    profiles = list(PROFILES) if args.profile == "all" else [args.profile]
    result = run_benchmark(
        conversations,
        profiles,
        via_mcp=args.via_mcp,
        data_dir=args.data_dir,
        fusion=args.fusion,
    )
    print(table(result))
    write_json(args.json_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

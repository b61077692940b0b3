"""``python -m bench.soak.memory DIR [--top 25] [--by lineno|traceback] [--from N]``: what grew.

Reads the tracemalloc snapshots a server wrote with ``ENGRAM_MEMORY_TRACE_DIR`` (``python -m
bench.soak --trace-memory DIR``), prints RSS, traced bytes, SQLite's and malloc's figures per snapshot (``rss.tsv``), then the
allocation sites whose live memory grew most from snapshot ``--from`` (default 1: the first one
after warm-up) to the last. Traced bytes flat while RSS grows means the growth is not in Python
objects (native allocations or allocator fragmentation).
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path

IGNORED = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
    tracemalloc.Filter(False, "<unknown>"),
)


def growth(first: Path, last: Path, *, key: str, top: int) -> list[str]:
    """The ``top`` allocation sites by growth from ``first`` to ``last``, one line each."""
    before = tracemalloc.Snapshot.load(str(first)).filter_traces(IGNORED)
    after = tracemalloc.Snapshot.load(str(last)).filter_traces(IGNORED)
    lines = []
    for stat in after.compare_to(before, key)[:top]:
        lines.append(
            f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} blocks"
            f" (now {stat.size / 1024:.1f} KiB)"
        )
        frames = stat.traceback.format(limit=8 if key == "traceback" else 1, most_recent_first=True)
        lines.extend("    " + frame.strip() for frame in frames if frame.strip())
    return lines


def census_growth(first: Path, last: Path, *, top: int) -> list[str]:
    """The ``top`` object types by growth in count from census ``first`` to ``last``."""
    before = json.loads(first.read_text(encoding="utf-8"))
    after = json.loads(last.read_text(encoding="utf-8"))
    grown = sorted(after, key=lambda name: after[name] - before.get(name, 0), reverse=True)
    return [
        f"{after[name] - before.get(name, 0):+9d}  (now {after[name]:>8d})  {name}"
        for name in grown[:top]
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak.memory", description=__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--by", choices=["lineno", "traceback", "filename"], default="lineno")
    parser.add_argument("--from", dest="start", type=int, default=1, help="snapshot index")
    args = parser.parse_args(argv)
    rss = args.directory / "rss.tsv"
    if rss.exists():
        print("t_s\tRSS\ttraced\tsqlite\tmalloc in use\tmalloc free  (MiB)")
        for row in rss.read_text(encoding="utf-8").splitlines():
            elapsed, rss_kib, *figures = row.split("\t")
            mib = [f"{int(figure) / 2**20:.1f}" if int(figure) >= 0 else "-" for figure in figures]
            print("\t".join([elapsed, f"{int(rss_kib) / 1024:.1f}", *mib]))
    snapshots = sorted(args.directory.glob("snapshot-*.pickle"))
    if len(snapshots) >= 2:
        first = snapshots[min(args.start, len(snapshots) - 2)]
        print(f"\ngrowth from {first.name} to {snapshots[-1].name}, by {args.by}:")
        print("\n".join(growth(first, snapshots[-1], key=args.by, top=args.top)))
    censuses = sorted(args.directory.glob("census-*.json"))
    if len(censuses) >= 2:
        start = censuses[min(args.start, len(censuses) - 2)]
        print(f"\nobjects by type, from {start.name} to {censuses[-1].name}:")
        print("\n".join(census_growth(start, censuses[-1], top=args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

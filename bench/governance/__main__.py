"""``python -m bench.governance [--count N] [--quick] [--no-peers] [--json PATH] [--keep DIR]``.

The governance benchmark in one command: admission (``admission``), forgetting
(``forgetting``), isolation (``isolation``) and the two peers deleting the same canaries
(``peers``); one table, ours beside the peers.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.governance import admission, forgetting, isolation, peers
from bench.governance.canaries import canaries
from bench.output import write_json

PEERS = tuple(peers.PEERS)
# The side-by-side rows: (label, our channel, the peers' channel); None: the side has none.
ROWS: tuple[tuple[str, str | None, str | None], ...] = (
    ("search tool", "search", "search"),
    ("get / open tool", "get", "get"),
    ("store files, server running (raw bytes)", "data_dir_live", "files_live"),
    ("store files, server stopped (raw bytes)", "data_dir_stopped", "files_stopped"),
    ("lexical index (FTS5 MATCH + vocabulary)", "fts_index", None),
    ("vector index", "vector_index", None),
    ("backup / copy taken before, plaintext bytes", "backup_plaintext", "copy_before_delete"),
    ("that backup restored beside today's keys", "backup_with_live_keys", "copy_before_delete"),
    ("that backup beside a keys/ copy kept from before", "backup_with_old_keys", None),
    ("export taken before (plaintext by design)", "export_before", None),
    ("export taken after", "export_after", None),
)


def _cell(channels: dict[str, Any], name: str | None, fallback: str) -> str:
    if name is None or name not in channels:
        return fallback
    row = channels[name]
    return f"{row['found']}/{row.get('of', '')}".rstrip("/")


def side_by_side(ours: dict[str, Any], theirs: dict[str, Any], count: int) -> str:
    """The forgetting table: canaries still found after each side's own forget/delete."""
    header = [
        "| after forget / delete: canaries found | Engram Memory | " + " | ".join(PEERS) + " |"
    ]
    lines = [*header, "|---|---|" + "---|" * len(PEERS)]
    for label, mine, their in ROWS:
        cells = [_cell(ours["channels"], mine, "—")]
        for peer in PEERS:
            report = theirs.get(peer, {})
            if "unavailable" in report:
                cells.append("not run")
                continue
            channels = {k: {**v, "of": count} for k, v in report.get("channels", {}).items()}
            cells.append(_cell(channels, their, "n/a"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def isolation_table(result: dict[str, Any]) -> str:
    lines = ["| isolation probe | probes | found | answers |", "|---|---|---|---|"]
    for name, row in result["callers"].items():
        codes = ", ".join(f"{code} {n}" for code, n in row["codes"].items())
        lines.append(f"| {name} | {row['probes']} | {row['found']} | {codes} |")
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    ours = report["forgetting"]
    gate = report["admission"]
    out = [
        side_by_side(ours, report["peers"], report["count"]),
        "",
        f"Forgetting: {ours['forgotten']} records forgotten, {ours['withdrawn']} candidates"
        f" withdrawn, {ours['approvals_asked']} approvals given in the client's form;"
        f" receipts {ours['answers']}; all projections cleared {ours['cleared_ms']} ms after"
        f" the first forget (semantic channel: {'on' if ours['semantic'] else 'off'}).",
        "",
        isolation_table(report["isolation"]),
        f"owner's records intact after the probes: {report['isolation']['owner_records_intact']}",
        "",
        admission.table(gate),
    ]
    for peer, row in report["peers"].items():
        if "unavailable" in row:
            out.append(f"{peer}: not run ({row['unavailable'].splitlines()[0]})")
        elif row.get("files_holding"):
            out.append(f"{peer}: files holding canaries after stop: {row['files_holding']}")
    return "\n".join(out)


def run(count: int, admission_limit: int | None, work: Path, with_peers: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"count": count}
    report["admission"] = admission.run(admission.sliced(admission.load(), admission_limit))
    report["forgetting"] = forgetting.run(count, work / "forgetting")
    report["isolation"] = isolation.run(count, work / "isolation")
    report["peers"] = (
        peers.run(canaries(count, "forget"), work / "peers")
        if with_peers
        else {peer: {"unavailable": "--no-peers"} for peer in PEERS}
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The governance benchmark (issue 27).")
    parser.add_argument("--count", type=int, default=100, help="canaries per run (default 100)")
    parser.add_argument("--quick", action="store_true", help="10 canaries, 4 items per class")
    parser.add_argument("--no-peers", action="store_true", help="skip server-memory, basic-memory")
    parser.add_argument("--json", type=Path, default=None, help="write the full report here")
    parser.add_argument("--keep", type=Path, default=None, help="work in DIR and keep its files")
    args = parser.parse_args(argv)
    count, limit = (10, 4) if args.quick else (args.count, None)
    if count < 2:
        parser.error("--count needs at least 2 canaries (half forgotten, half withdrawn)")
    with tempfile.TemporaryDirectory(prefix="engram-governance-") as tmp:
        work = args.keep or Path(tmp)
        report = run(count, limit, work, not args.no_peers)
    print(summary(report))
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
# The side-by-side rows: (label, embedded channel, cloud channel, the peers' channel); None:
# that side has no such channel.
ROWS: tuple[tuple[str, str | None, str | None, str | None], ...] = (
    ("search tool", "search", "search", "search"),
    ("get / open tool", "get", "get", "get"),
    (
        "store files / table, server running (raw bytes)",
        "data_dir_live",
        "canonical_table",
        "files_live",
    ),
    ("store files, server stopped (raw bytes)", "data_dir_stopped", None, "files_stopped"),
    ("key store: a forgotten record's key still there", None, "key_table", None),
    ("lexical index (FTS5 / OpenSearch stand-in)", "fts_index", "projection", None),
    ("vector index", "vector_index", None, None),
    (
        "backup / copy taken before: plaintext bytes",
        "backup_plaintext",
        "table_copy_plaintext",
        "copy_before_delete",
    ),
    (
        "that copy, opened with today's keys",
        "backup_with_live_keys",
        "table_copy_with_live_keys",
        "copy_before_delete",
    ),
    ("that copy beside a keys/ copy kept from before", "backup_with_old_keys", None, None),
    ("export taken before (plaintext by design)", "export_before", None, None),
    ("export taken after", "export_after", None, None),
)


def _cell(report: dict[str, Any], name: str | None, of: int | None = None) -> str:
    if "unavailable" in report:
        return "not run"
    channels = report.get("channels", {})
    if name is None or name not in channels:
        return "n/a"
    row = channels[name]
    return f"{row['found']}/{row.get('of', of)}"


def side_by_side(report: dict[str, Any]) -> str:
    """The forgetting table: canaries still found after each side's own forget/delete."""
    sides = ["Engram Memory (embedded)", "Engram Memory (cloud, moto)", *PEERS]
    lines = [
        "| after forget / delete: canaries found | " + " | ".join(sides) + " |",
        "|---|" + "---|" * len(sides),
    ]
    count = report["count"]
    for label, embedded, cloud_channel, peer_channel in ROWS:
        cells = [
            _cell(report["forgetting"], embedded),
            _cell(report["cloud"], cloud_channel),
            *(_cell(report["peers"].get(peer, {}), peer_channel, count) for peer in PEERS),
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def isolation_table(result: dict[str, Any]) -> str:
    lines = ["| isolation probe | probes | found | answers |", "|---|---|---|---|"]
    for name, row in result["callers"].items():
        codes = ", ".join(f"{code} {n}" for code, n in row["codes"].items())
        lines.append(f"| {name} | {row['probes']} | {row['found']} | {codes} |")
    return "\n".join(lines)


def _cloud_line(cloud: dict[str, Any]) -> str:
    if "unavailable" in cloud:
        return f"Cloud: not run ({cloud['unavailable']})."
    return (
        f"Cloud (moto): receipts {cloud['answers']}; the OpenSearch stand-in held none of them"
        f" {cloud['cleared_ms']} ms after the first forget (outbox drained after each)."
    )


def summary(report: dict[str, Any]) -> str:
    ours = report["forgetting"]
    gate = report["admission"]
    out = [
        side_by_side(report),
        "",
        f"Forgetting: {ours['forgotten']} records forgotten, {ours['withdrawn']} candidates"
        f" withdrawn, {ours['approvals_asked']} approvals given in the client's form;"
        f" receipts {ours['answers']}; all projections cleared {ours['cleared_ms']} ms after"
        f" the first forget (semantic channel: {'on' if ours['semantic'] else 'off'}).",
        _cloud_line(report["cloud"]),
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


def _cloud(count: int, work: Path) -> dict[str, Any]:
    from bench.governance import cloud

    work.mkdir(parents=True)
    try:
        return cloud.run(count, work)
    except ImportError as error:  # moto and the tests' helpers: the dev install
        return {"unavailable": f"the cloud run needs the dev extras: {error}"}


def run(count: int, admission_limit: int | None, work: Path, with_peers: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"count": count}
    report["admission"] = admission.run(admission.sliced(admission.load(), admission_limit))
    report["forgetting"] = forgetting.run(count, work / "forgetting")
    report["cloud"] = _cloud(count, work / "cloud")
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

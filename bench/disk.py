"""Where the embedded store's bytes go (issue 14's disk target): bytes per record by SQLite table
and index, the audit log and the key store, after ``--records`` memories written through the
engine.

One fresh data directory; LoCoMo memories (bench/hotpath's corpus) written as capture +
request_admission pairs through ``Engine.handle`` (no transport), the outbox drained (queued key
destructions) and the host closed (the WAL checkpointed and truncated), as a server leaves it.
``engram.db`` is broken down with SQLite's ``dbstat`` virtual table (bytes of the pages each
table or index holds, and of the payload in them); a per-scope FTS5 table's shadow tables are
reported under the name ``lex_*`` with their suffix, as are vector tables (``vec_*``).

``--before TREE`` runs the same measurement on another source tree in a subprocess (its package
first on the path) and prints the two side by side::

    git archive main | tar -x -C /tmp/before
    python -m bench.disk --records 1000 --before /tmp/before

Prints one JSON object (``--json FILE`` also writes it) and, with ``--before``, a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.hotpath.corpus import Corpus
from bench.in_process import DEFAULT_LOCOMO, remember_all, seeding_policy
from bench.output import write_json

REPO = Path(__file__).resolve().parent.parent
_SCOPED = re.compile(r"^(lex|vec)_[0-9a-f]{32}")


def seed(data: Path, corpus: Corpus, records: int) -> None:
    """``records`` memories captured and admitted through the engine, as a server leaves them."""
    from engram_memory.embedded.composition import init_data_dir, open_embedded

    init_data_dir(data)
    host = open_embedded(data, policy=seeding_policy())
    try:
        engine = host.engine
        remember_all(engine, corpus.memories(0, records), "disk")
        while engine.drain_outbox():
            pass
    finally:
        host.close()


def table_bytes(database: Path) -> dict[str, dict[str, int]]:
    """Pages and payload bytes of each table and index of ``database`` (``dbstat``)."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT name, SUM(pgsize), SUM(payload), SUM(unused) FROM dbstat GROUP BY name"
        ).fetchall()
    finally:
        conn.close()
    breakdown: dict[str, dict[str, int]] = {}
    for name, pages, payload, unused in rows:
        key = _SCOPED.sub(lambda m: f"{m.group(1)}_*", str(name))
        entry = breakdown.setdefault(key, {"bytes": 0, "payload": 0, "unused": 0})
        entry["bytes"] += int(pages)
        entry["payload"] += int(payload)
        entry["unused"] += int(unused)
    return breakdown


def measure(data: Path, records: int, text_bytes: int) -> dict[str, Any]:
    import engram_memory

    files = {
        str(p.relative_to(data)): p.stat().st_size for p in sorted(data.rglob("*")) if p.is_file()
    }
    total = sum(files.values())
    tables = table_bytes(data / "engram.db")
    return {
        "package": str(Path(engram_memory.__file__).parent),
        "records": records,
        "text_bytes_per_record": round(text_bytes / records, 1),
        "bytes_per_record": round(total / records, 1),
        "beyond_text_per_record": round((total - text_bytes) / records, 1),
        "files_per_record": {name: round(size / records, 1) for name, size in files.items()},
        "tables_per_record": {
            name: {k: round(v / records, 1) for k, v in entry.items()}
            for name, entry in sorted(tables.items(), key=lambda item: -item[1]["bytes"])
        },
    }


def run(corpus: Corpus, records: int) -> dict[str, Any]:
    text = sum(m.text_bytes for m in corpus.memories(0, records))
    with tempfile.TemporaryDirectory(prefix="engram-disk-bench-") as tmp:
        data = Path(tmp) / "data"
        seed(data, corpus, records)
        return measure(data, records, text)


def _before(tree: Path, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "layers" / "core"), str(REPO)])
    out = subprocess.run(  # noqa: S603 - this interpreter, this module
        [sys.executable, "-m", "bench.disk", *argv],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    report: dict[str, Any] = json.loads(out)
    return report


def _grouped(files: dict[str, float]) -> dict[str, float]:
    """Bytes per record by file, the audit log's sealed segments summed as one."""
    grouped: dict[str, float] = {}
    for name, size in files.items():
        key = re.sub(r"\.\d{6}(\.gz)?$", ".<n>.gz", name)
        grouped[key] = round(grouped.get(key, 0.0) + size, 1)
    return grouped


def side_by_side(before: dict[str, Any], after: dict[str, Any]) -> str:
    """A Markdown table: bytes per record of each file and table (of half a byte or more),
    before and after."""
    lines = ["| bytes per record | before | after |", "|---|---|---|"]

    def row(label: str, old: float | None, new: float | None) -> None:
        if max(old or 0.0, new or 0.0) < 0.5:
            return

        def fmt(v: float | None) -> str:
            return "" if v is None else f"{v:,.0f}"

        lines.append(f"| {label} | {fmt(old)} | {fmt(new)} |")

    row("whole data directory", before["bytes_per_record"], after["bytes_per_record"])
    row("beyond the text", before["beyond_text_per_record"], after["beyond_text_per_record"])
    old_f, new_f = _grouped(before["files_per_record"]), _grouped(after["files_per_record"])
    for name in sorted(set(old_f) | set(new_f)):
        row(f"file `{name}`", old_f.get(name), new_f.get(name))
    old_t, new_t = before["tables_per_record"], after["tables_per_record"]
    for name in sorted(set(old_t) | set(new_t), key=lambda n: -old_t.get(n, new_t.get(n))["bytes"]):
        row(
            f"table `{name}`",
            old_t[name]["bytes"] if name in old_t else None,
            new_t[name]["bytes"] if name in new_t else None,
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    parser.add_argument(
        "--before", type=Path, help="another source tree to measure beside this one"
    )
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    report = run(Corpus.load(args.locomo), args.records)
    if args.before is not None:
        before = _before(
            args.before, ["--records", str(args.records), "--locomo", str(args.locomo)]
        )
        report = {"before": before, "after": report, "table": side_by_side(before, report)}
    write_json(args.json, report)
    json.dump(report, sys.stdout, indent=2)
    print()
    if args.before is not None:
        print(report["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

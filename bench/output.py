"""What benchmarks print and write: ``--json PATH``'s report (indented, one final newline) and
Markdown tables (the form docs/benchmarks.md quotes them in)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def write_json(path: Path | None, report: Any) -> None:
    """The report as JSON at ``path`` (nothing when no path was given)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def markdown_table(columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table: ``columns`` are (heading, alignment) with alignment ``"l"`` or ``"r"``."""
    lines = [
        "| " + " | ".join(heading for heading, _ in columns) + " |",
        "|" + "|".join("---:" if align == "r" else "---" for _, align in columns) + "|",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)

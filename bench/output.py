"""What every benchmark's ``--json PATH`` writes: the full report, indented, one final newline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path | None, report: Any) -> None:
    """The report as JSON at ``path`` (nothing when no path was given)."""
    if path is not None:
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

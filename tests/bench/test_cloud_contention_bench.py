"""The cloud contention benchmark on a small run: its table and JSON hold every writer count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cloud_contention import main


def test_the_contention_bench_reports_each_writer_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rows.json"
    assert main(["--writers", "1,3", "--rounds", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [row["writers"] for row in rows] == [1, 3]
    for row in rows:
        assert row["calls"] == 2 * row["writers"]  # a capture and an admission each
        assert sum(row["codes"].values()) == row["calls"]
        assert row["ok"] == row["codes"].get("OK", 0)
        assert row["failed_share"] == round((row["calls"] - row["ok"]) / row["calls"], 4)
    assert rows[0]["conflicts_per_success"] == 0.0  # one writer never contends
    table = capsys.readouterr().out
    assert "| writers |" in table and "| 3 |" in table

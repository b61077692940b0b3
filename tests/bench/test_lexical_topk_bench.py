"""``python -m bench.lexical_topk`` on a small seeded store, replicated: it times both sides and
finds the pruned searches' records and order to be the plain query's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hotpath_seeding import conversation

from bench import lexical_topk


def test_the_bench_times_both_sides_and_finds_the_same_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    locomo = tmp_path / "locomo"
    locomo.mkdir()
    (locomo / "conv-1.json").write_text(json.dumps(conversation()), encoding="utf-8")
    argv = ["--size", "12", "--replicate", "30", "--queries", "4", "--rounds", "1"]
    argv += ["--locomo", str(locomo), "--store-cache", str(tmp_path / "stores")]
    assert lexical_topk.main([*argv, "--min-matches", "0"]) == 0
    out = capsys.readouterr().out
    assert "pruned n=360: CPU ms per search p50" in out
    assert "plain n=360: CPU ms per search p50" in out
    assert "searches whose records or order differ: 0 of 4;" in out

"""bench.hotpath.write_growth --tables: the growing write-path tables measured on a real bare
database, one line per stretch, the band lookup finding the earlier copies of a repeated turn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hotpath_writes_bench import ONE_SESSION

from bench.hotpath import write_growth
from bench.hotpath.corpus import Corpus
from engram_memory.adapters.local.sqlite import near_bands


def test_tables_reports_each_part_by_stretch_and_finds_the_repeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    locomo = tmp_path / "locomo"
    locomo.mkdir()
    (locomo / "conv-1.json").write_text(json.dumps(ONE_SESSION))
    found: list[set[str]] = []
    alike = near_bands.alike

    def counted(*args: object) -> list[tuple[str, float]]:
        hits = alike(*args)  # type: ignore[arg-type]
        found.append({record_id for record_id, _ in hits})
        return hits

    monkeypatch.setattr(near_bands, "alike", counted)
    write_growth.tables(Corpus.load(locomo), 9)

    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("records 0-9: band lookup ")
    for part in ("fts5 insert", "band insert", "commit"):
        assert part in line
    # Three turns, memory i is turn i mod 3 (its record named i): each earlier copy is found.
    assert found[0] == set()
    for index in range(3, 9):
        assert {str(i) for i in range(index % 3, index, 3)} <= found[index], index

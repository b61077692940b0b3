"""bench.disk: bytes per record by table, index and file, from a store seeded through the engine."""

from __future__ import annotations

import json
from pathlib import Path

from bench.disk import run, side_by_side
from bench.hotpath.corpus import Corpus
from bench.locomo.dataset import load


def _corpus(tmp_path: Path) -> Corpus:
    turns = [
        {"speaker": "Ana", "dia_id": f"D1:{i}", "text": f"The kitten did thing number {i} today."}
        for i in range(1, 9)
    ]
    conversation = {
        "speaker_a": "Ana",
        "speaker_b": "Bo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": turns,
        "qa": [
            {
                "question": "What did the kitten do?",
                "answer": "x",
                "evidence": ["D1:1"],
                "category": 4,
            }
        ],
    }
    path = tmp_path / "conv-1.json"
    path.write_text(json.dumps(conversation))
    return Corpus([load(path)])


def test_the_breakdown_names_each_table_and_stays_within_the_file(tmp_path: Path) -> None:
    report = run(_corpus(tmp_path), 12)
    assert report["records"] == 12
    tables = report["tables_per_record"]
    assert {"records", "journal_events", "ledger", "candidates", "lex_*_data"} <= set(tables)
    # dbstat counts the pages of tables and indexes: the file also holds its free list.
    assert (
        sum(entry["bytes"] for entry in tables.values()) <= report["files_per_record"]["engram.db"]
    )
    beyond = report["bytes_per_record"] - report["text_bytes_per_record"]
    assert abs(report["beyond_text_per_record"] - beyond) < 0.2
    table = side_by_side(report, report)
    assert "| table `records` |" in table and "| file `engram.db` |" in table

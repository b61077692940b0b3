"""bench.hotpath.writes: syncs counted between the markers, by the file they flushed, and a
child that really captures and admits through the engine."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path

import pytest
from test_locomo_bench import ANA_AND_BO

from bench.hotpath import writes

ONE_SESSION = {
    **ANA_AND_BO,
    "session_1": [
        {"speaker": "Ana", "dia_id": "D1:1", "text": "The greenhouse fan is on a timer now."},
        {"speaker": "Bo", "dia_id": "D1:2", "text": "Good, the tomatoes were overheating."},
        {"speaker": "Ana", "dia_id": "D1:3", "text": "It runs from ten until four."},
    ],
    "qa": [
        {"question": "When does the fan run?", "answer": "x", "evidence": ["D1:3"], "category": 1}
    ],
}

TRACE = f"""\
1234  fsync(3</d/data/keys/candidate-keys.db-wal>) = 0
1234  readlink("{writes._MARK_START}", 0x7ffd, 1023) = -1 ENOENT (No such file or directory)
1234  fsync(3</d/data/keys/candidate-keys.db-wal>) = 0
1235  fdatasync(7</d/data/engram.db-wal> <unfinished ...>
1234  fsync(9</d/data/audit/audit-2026-12-04.jsonl>) = 0
1235  <... fdatasync resumed>) = 0
1234  fsync(4</d/data/keys/candidate-keys.db>) = 0
1234  fsync(11</d/data/other.bin>) = 0
1234  readlink("{writes._MARK_STOP}", 0x7ffd, 1023) = -1 ENOENT (No such file or directory)
1234  fsync(7</d/data/engram.db-wal>) = 0
"""


def test_syncs_are_counted_between_the_markers_by_file() -> None:
    assert writes.count_syncs(TRACE) == {
        "key file": 2,
        "store": 1,
        "audit": 1,
        "other (other.bin)": 1,
    }


def test_a_child_captures_and_admits_and_reports_its_cpu(tmp_path: Path) -> None:
    locomo = tmp_path / "locomo"
    locomo.mkdir()
    (locomo / "conv-1.json").write_text(json.dumps(ONE_SESSION))

    result = writes.child(tmp_path / "data", locomo, warmup=range(1), pairs=2, run="test")

    assert result["cpu_ms_per_pair"] > 0
    assert result["pairs_per_s"] > 0
    assert Path(result["package"]).name == "engram_memory"


def test_a_child_through_the_stdio_server_reports_the_servers_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locomo = tmp_path / "locomo"
    locomo.mkdir()
    # Ten distinct turns: the server's default policy holds a turn seen before.
    facts = [
        "The greenhouse fan is on a timer now.",
        "The tomatoes were overheating in July.",
        "Bo repainted the shed a dark green colour.",
        "Ana ordered forty litres of compost from the co-op.",
        "The rain barrel overflowed during the storm on Sunday.",
        "Bo fixed the broken hinge on the north gate.",
        "The basil seedlings go out after the last frost.",
        "Ana swapped zucchini seeds with the neighbours.",
        "The irrigation pump needs a new filter every spring.",
        "Bo keeps the garden journal on the kitchen shelf.",
    ]
    turns = [
        {"speaker": "Ana" if i % 2 else "Bo", "dia_id": f"D1:{i + 1}", "text": fact}
        for i, fact in enumerate(facts)
    ]
    (locomo / "conv-1.json").write_text(json.dumps({**ONE_SESSION, "session_1": turns}))
    monkeypatch.setenv("PYTHONPATH", str(Path(writes.__file__).resolve().parents[2]))
    data = tmp_path / "run" / "data"
    data.parent.mkdir()

    # The server's CPU is read in /proc's 10 ms ticks: 8 pairs (~6 ms each) always show.
    result = writes.child(data, locomo, warmup=range(1, 2), pairs=8, run="test", through="stdio")

    assert result["cpu_ms_per_pair"] > 0
    assert result["server_user_ms_per_pair"] > 0
    assert result["client_cpu_ms_per_pair"] > 0
    assert result["pairs_per_s"] > 0
    # The warm-up memory and the timed ones became records, in the server's store.
    with contextlib.closing(sqlite3.connect(data / "engram.db")) as store:
        assert store.execute("SELECT count(*) FROM records").fetchone() == (9,)

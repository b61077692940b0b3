"""The opt-in memory trace (``embedded.memory_trace``) and its reader (``bench.soak.memory``)."""

from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from bench.soak import memory
from engram_memory.embedded import memory_trace
from engram_memory.embedded.memory_trace import (
    TRACE_DIR_ENV,
    TRACE_EVERY_ENV,
    TRACE_FRAMES_ENV,
    start_from_environment,
)

WAIT_S = 120.0


def _trace_thread() -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == "engram-memory-trace")


def test_unset_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_DIR_ENV, raising=False)
    assert start_from_environment() is None
    assert not any(t.name == "engram-memory-trace" for t in threading.enumerate())


def test_the_trace_writes_figures_and_snapshots_and_the_reader_diffs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    was_tracing = tracemalloc.is_tracing()
    monkeypatch.setenv(TRACE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(TRACE_EVERY_ENV, "0.05")
    monkeypatch.setenv(TRACE_FRAMES_ENV, "1")
    stop = start_from_environment()
    assert stop is not None
    thread = _trace_thread()
    held = []
    deadline = time.monotonic() + WAIT_S
    try:
        while len(list(tmp_path.glob("snapshot-*.pickle"))) < 3 and time.monotonic() < deadline:
            held.append(bytearray(4096))
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(WAIT_S)
        if not was_tracing:
            tracemalloc.stop()
    assert held

    rows = [line.split("\t") for line in (tmp_path / "rss.tsv").read_text().splitlines()]
    assert len(rows) >= 3 and all(len(row) == 6 for row in rows)
    for elapsed, rss_kib, _traced, _sqlite, malloc_used, _malloc_free in rows:
        assert int(elapsed) >= 0 and int(rss_kib) > 0
        assert int(malloc_used) != 0
    # Tracing starts after the first interval (start-up is not traced): bytes from then on.
    assert all(int(traced) > 0 for _, _, traced, *_ in rows[2:])
    if not was_tracing:
        assert [int(row[2]) for row in rows[:2]] == [0, 0]
        assert len(list(tmp_path.glob("snapshot-*.pickle"))) == len(rows) - 2
    assert len(list(tmp_path.glob("census-*.json"))) == len(rows)

    assert memory.main([str(tmp_path), "--from", "0", "--top", "5"]) == 0
    out = capsys.readouterr().out
    assert "growth from snapshot-" in out and "objects by type, from census-" in out
    assert "KiB" in out


def test_the_census_counts_live_objects_by_type() -> None:
    class Marker:
        pass

    kept = [Marker() for _ in range(25)]
    census = memory_trace.object_census()
    assert census[f"{__name__}.{Marker.__qualname__}"] == len(kept)

"""bench.startup: one run of each figure against this environment's console script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import startup

NAMES = ["python -c pass", "engram-memory --help", "stdio initialize"]


def test_one_run_of_each_figure_is_timed_beside_the_interpreter_and_written_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "startup.json"
    assert startup.main(["--runs", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "load average" in out and all(f"| {name} |" in out for name in NAMES)

    written = json.loads(path.read_text(encoding="utf-8"))
    assert written["runs"] == 1
    figures = {figure["name"]: figure for figure in written["figures"]}
    assert list(figures) == NAMES
    for figure in figures.values():
        assert figure["runs"] == 1
        assert 0 < figure["min_s"] <= figure["median_s"] <= figure["max_s"]
    # The targets ride along with their figures; the interpreter's floor has none.
    assert [figures[name]["target_s"] for name in NAMES] == [None, 0.5, 1.5]


def test_fewer_than_one_run_is_refused() -> None:
    with pytest.raises(SystemExit) as refused:
        startup.main(["--runs", "0"])
    assert refused.value.code == 2

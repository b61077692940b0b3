"""The embedded default from the command line: init, the six-tool tour, the journal check."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from engram_memory.embedded.cli import main


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_creates_a_private_data_directory_and_is_idempotent(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    assert main(["init", "--data-dir", str(data)]) == 0
    assert _mode(data) == 0o700 and _mode(data / "keys") == 0o700
    assert _mode(data / "keys" / "master.key") == 0o600
    assert (data / "engram.db").exists() and (data / "keys" / "candidate-keys.db").exists()


def test_the_tour_walks_the_six_tools_and_audits_without_content(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    assert main(["tour", "--data-dir", str(data), "--yes"]) == 0
    out = capsys.readouterr().out
    for step in ("capture", "request_admission", "search", "get", "withdraw", "forget"):
        assert f"=== {step}" in out
    assert '"status": "accepted"' in out
    assert '"to_state": "withdrawn"' in out and '"to_state": "tombstoned"' in out
    assert '"code": "NOT_FOUND"' in out  # get after forget
    lines = [json.loads(line) for line in (data / "audit.log").read_text().splitlines()]
    assert {line["tool"] for line in lines} == {
        "capture",
        "request_admission",
        "search",
        "get",
        "withdraw",
        "forget",
    }
    assert all(line["audit_id"].startswith("aud_") for line in lines)
    assert "WAL mode" not in (data / "audit.log").read_text()
    assert main(["verify", "--data-dir", str(data)]) == 0


def test_the_tour_declines_when_nobody_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("builtins.input", lambda _prompt: "n")
    assert main(["tour", "--data-dir", str(tmp_path / "data")]) == 0
    assert '"code": "gate_failed"' in capsys.readouterr().out


def test_the_database_and_its_wal_are_owner_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert main(["tour", "--data-dir", str(data), "--yes"]) == 0
    for name in ("engram.db", "engram.db-wal", "engram.db-shm"):
        path = data / name
        if path.exists():
            assert _mode(path) == 0o600, name

"""Health that tells the truth (issue 24): ``admin status`` and ``verify`` open every pending
candidate and every record body (a stated sample by default, all with ``--full``) and name the
unreadable ones by id — never their content — with exit code 1.

Before, they checked only that a candidate's key row existed: a key wrapped under another master
key (the rotate-while-serving fault) or a wrong master key passed as ``ok``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest
from test_serve_day_one import init

from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import open_embedded
from engram_memory.engine.context import TrustedContext
from engram_memory.operator_plane import inspection

from engram_testing import capture_args, context, handled

Capture = pytest.CaptureFixture[str]
SECRET_TEXT = "Health: the team lunch moved to Thursdays at noon, room Kestrel."


def _ctx() -> TrustedContext:
    return context(
        principal="agent-health", tenant="local", workspace="default", purpose="purpose:general"
    )


def _captured(data: Path, text: str, key: str, *, admit: bool = False) -> str:
    """A candidate captured (and admitted when ``admit``); the candidate's or record's id."""
    host = open_embedded(data)
    try:
        arguments = capture_args(text, key=key, valid_from=int(time.time() * 1000) - 60_000)
        captured = handled(host.engine, "capture", arguments, _ctx())
        candidate_id: str = captured["output"]["value"]["candidate_id"]
        if not admit:
            return candidate_id
        admission = {"candidate_id": candidate_id, "idempotency_key": f"{key}-admit"}
        admitted = handled(host.engine, "request_admission", admission, _ctx())
        record_id: str = admitted["output"]["value"]["outcome"]["record_id"]
        return record_id
    finally:
        host.close()


def _key_ref(data: Path, candidate_id: str) -> str:
    with sqlite3.connect(data / "engram.db") as conn:
        (key_ref,) = conn.execute(
            "SELECT key_ref FROM candidates WHERE candidate_id = ?", (candidate_id,)
        ).fetchone()
    conn.close()
    return str(key_ref)


def _checks(capsys: Capture, data: Path, *extra: str) -> list[tuple[int, str]]:
    """``admin status`` and ``verify`` (with ``extra``): each one's exit code and stderr."""
    results = []
    for argv in (
        ["admin", "status", "--data-dir", str(data), *extra],
        ["verify", "--data-dir", str(data), "--workspace", "default", *extra],
    ):
        code = main(argv)
        captured = capsys.readouterr()
        assert SECRET_TEXT not in captured.out + captured.err  # ids, never content
        results.append((code, captured.err))
    return results


@pytest.fixture
def data(tmp_path: Path) -> Path:
    init(tmp_path / "data")  # the real command, in its own process
    return tmp_path / "data"


def test_a_healthy_data_directory_is_ok_and_says_what_it_opened(
    data: Path, capsys: Capture
) -> None:
    _captured(data, SECRET_TEXT, "health-check-key-0001")
    _captured(data, "Health: an admitted note.", "health-check-key-0002", admit=True)
    assert main(["verify", "--data-dir", str(data), "--workspace", "default"]) == 0
    out = capsys.readouterr().out
    assert "1 pending candidate(s) and 1 record(s) opened" in out, out
    assert _checks(capsys, data, "--full") == [(0, ""), (0, "")]


def test_a_candidate_whose_key_is_destroyed_is_named_and_fails_the_checks(
    data: Path, capsys: Capture
) -> None:
    broken = _captured(data, SECRET_TEXT, "health-check-key-0011")
    _captured(data, "Health: a candidate that opens.", "health-check-key-0012")
    with sqlite3.connect(data / "keys" / "candidate-keys.db") as conn:
        conn.execute("DELETE FROM data_keys WHERE key_ref = ?", (_key_ref(data, broken),))
    conn.close()
    for code, err in _checks(capsys, data):
        assert code == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"{broken} (BLOB_MISSING)" in lines[0], err


def test_a_wrong_master_key_is_named_candidate_by_candidate_and_record_by_record(
    data: Path, capsys: Capture
) -> None:
    """What a server left wrapping under a rotated-away master key looks like after a restart:
    keys that exist but do not unwrap. Before, status said ``key_store.health: ok``."""
    pending = _captured(data, SECRET_TEXT, "health-check-key-0021")
    record = _captured(data, "Health: an admitted note.", "health-check-key-0022", admit=True)
    (data / "keys" / "master.key").write_bytes(os.urandom(32))
    for code, err in _checks(capsys, data):
        assert code == 1
        assert f"{pending} (JOURNAL_CORRUPT)" in err and f"{record} (JOURNAL_CORRUPT)" in err, err
    capsys.readouterr()


def test_the_default_check_is_a_stated_sample_and_full_opens_everything(
    data: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _captured(data, "Health: the first candidate.", "health-check-key-0031")
    second = _captured(data, SECRET_TEXT, "health-check-key-0032")
    broken = max(first, second)  # candidates are listed in id order: the sample misses this one
    with sqlite3.connect(data / "keys" / "candidate-keys.db") as conn:
        conn.execute("DELETE FROM data_keys WHERE key_ref = ?", (_key_ref(data, broken),))
    conn.close()
    monkeypatch.setattr(inspection, "HEALTH_SAMPLE", 1)
    assert main(["verify", "--data-dir", str(data), "--workspace", "default"]) == 0
    assert "(the first 1 of each (--full: all))" in capsys.readouterr().out
    for code, err in _checks(capsys, data, "--full"):
        assert code == 1 and f"{broken} (BLOB_MISSING)" in err, err

"""Crash-safe operator transactions (issue 24): rotate, backup, restore, tokens revoke.

Each operation runs as the real command line in a child process that kills itself (SIGKILL,
``operator_plane/crash_points.py``) at one of its named steps; every step of every operation is a
case. Afterwards the data directory is whole — the old state or the new one — `verify` agrees,
every capture and record acknowledged before the operation opens (and the record is found), and
running the operation again finishes it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from engram_memory.embedded.backup import backup
from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import holds_memories, open_embedded
from engram_memory.embedded.host_file import load_host_config
from engram_memory.embedded.issuer_keys import local_verifier
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.ports import SealedBlob
from engram_memory.engine.records import decode
from engram_memory.operator_plane.crash_points import FAULT_ENV, STEPS

from engram_testing import capture_args, context, handled

REPO = Path(__file__).resolve().parents[2]
SCOPE = Scope("local", "default")
CASES = [(operation, step) for operation, steps in STEPS.items() for step in steps]


def _ctx(*_client: int) -> TrustedContext:
    """An agent's context in the embedded host's default scope."""
    return context(tenant=SCOPE.tenant_id, workspace=SCOPE.workspace_id)


@dataclass(frozen=True)
class Acknowledged:
    """What the agents were told is kept: pending candidates and records, id -> text."""

    pending: dict[str, str]
    records: dict[str, str]


def _seeded(data: Path) -> Acknowledged:
    """An initialised data directory holding two pending captures and two records."""
    assert main(["init", "--data-dir", str(data)]) == 0
    pending: dict[str, str] = {}
    records: dict[str, str] = {}
    host = open_embedded(data)
    try:
        now_ms = int(time.time() * 1000)
        for i, text in enumerate(
            [
                "Crash drill: the on-call phone is in the blue drawer.",
                "Crash drill: the release train leaves on Thursdays.",
                "Crash drill: pending note about the quarterly review.",
                "Crash drill: pending note about the office plants.",
            ]
        ):
            args = capture_args(text, key=f"crash-drill-{i:08d}", valid_from=now_ms - 60_000)
            captured = handled(host.engine, "capture", args, _ctx())
            candidate_id = captured["output"]["value"]["candidate_id"]
            if i >= 2:
                pending[candidate_id] = text
                continue
            admission = {"candidate_id": candidate_id, "idempotency_key": f"crash-admit-{i:08d}"}
            admitted = handled(host.engine, "request_admission", admission, _ctx())
            records[admitted["output"]["value"]["outcome"]["record_id"]] = text
    finally:
        host.close()
    return Acknowledged(pending, records)


def _assert_whole(data: Path, acknowledged: Acknowledged) -> None:
    """`verify` agrees, every acknowledged candidate and record opens, each record is found."""
    assert main(["verify", "--data-dir", str(data)]) == 0
    host = open_embedded(data)
    try:
        for candidate_id, text in acknowledged.pending.items():
            row = host.store.candidate_get(SCOPE, candidate_id)
            assert row is not None and row.state == "pending"
            opened = decode(
                host.vault.open(SCOPE, candidate_id, SealedBlob(row.key_ref, row.sealed))
            )
            assert opened["record"]["components"][0]["text"] == text
        for record_id, text in acknowledged.records.items():
            got = handled(
                host.engine,
                "get",
                {"record_id": record_id, "purpose_ref": "purpose:general"},
                _ctx(),
            )
            assert got["output"]["value"]["record"]["components"][0]["text"] == text
            found = handled(
                host.engine, "search", {"query": text, "purpose_ref": "purpose:general"}, _ctx()
            )
            hits = [packet["record"]["record_id"] for packet in found["output"]["value"]["records"]]
            assert record_id in hits
    finally:
        host.close()


def _killed_at(step: str, *argv: str) -> None:
    """Run ``engram-memory ARGV`` in a child process that dies at ``step``."""
    env = {**os.environ, FAULT_ENV: step}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    done = subprocess.run(  # noqa: S603 - our interpreter on our own entry point
        [sys.executable, "-m", "engram_memory.entry", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, f"{step} was never reached: {done.stderr[-2000:]}"


def _admin(data: Path, *words: str) -> list[str]:
    return ["admin", *words, "--data-dir", str(data), "--operator", "ops-carol"]


def _token(data: Path, capsys: pytest.CaptureFixture[str]) -> str:
    minted = [
        "token",
        *("--data-dir", str(data), "--principal", "agent-alice", "--workspace", "default"),
        *("--purpose", "purpose:general", "--tools", "search,get"),
    ]
    capsys.readouterr()
    assert main(minted) == 0
    return capsys.readouterr().out.strip()


def _verifies(data: Path, token: str) -> bool:
    config = load_host_config(data).serving_on("127.0.0.1", 8765)
    return bool(local_verifier(data, config).verify(token))


def _crashed_rotation(data: Path, step: str, capsys: pytest.CaptureFixture[str]) -> Path:
    token = _token(data, capsys)
    _killed_at(step, *_admin(data, "keys", "rotate"))
    assert _verifies(data, token)  # the issuer key: the old one, or retired and still trusted
    return data


def _crashed_backup(data: Path, step: str) -> Path:
    target = data.parent / "shelf" / "engram.backup"
    target.parent.mkdir()
    _killed_at(step, *_admin(data, "backup", str(target)))
    named = [path.name for path in target.parent.iterdir() if not path.name.startswith(".")]
    assert named == ([target.name] if step == "backup.in_place" else [])  # all or nothing
    if not named:  # the old state: no backup yet, run it again (it clears what was left)
        assert main(_admin(data, "backup", str(target))) == 0
        assert [path.name for path in target.parent.iterdir()] == [target.name]
    restored = data.parent / "restored"
    restored.mkdir()
    shutil.copytree(data / "keys", restored / "keys")
    assert main(["admin", "restore", str(target), "--data-dir", str(restored)]) == 0
    return restored


def _crashed_restore(data: Path, step: str) -> Path:
    backup_file = data.parent / "engram.backup"
    backup(data, backup_file, "ops-carol")
    target = data.parent / "restored"
    target.mkdir()
    shutil.copytree(data / "keys", target / "keys")
    _killed_at(step, *_admin(target, "restore", str(backup_file)))
    if step != "restore.in_place":
        assert not holds_memories(target)  # the old state: nothing restored yet, run it again
        assert main(["admin", "restore", str(backup_file), "--data-dir", str(target)]) == 0
    assert sorted(path.name for path in target.iterdir() if path.name.startswith(".")) == []
    return target


def _crashed_revocation(data: Path, step: str) -> Path:
    _killed_at(step, *_admin(data, "tokens", "revoke", "--principal", "agent-alice"))
    host = open_embedded(data)
    try:
        issued_before = int(time.time() * 1000) - 60_000
        assert host.store.credential_revoked("local", "jti-before", "agent-alice", issued_before)
    finally:
        host.close()
    return data


@pytest.mark.parametrize(("operation", "step"), CASES)
def test_an_operator_transaction_killed_at_any_step_loses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], operation: str, step: str
) -> None:
    data = tmp_path / "data"
    acknowledged = _seeded(data)
    if operation == "rotate":
        whole = _crashed_rotation(data, step, capsys)
    elif operation == "backup":
        whole = _crashed_backup(data, step)
    elif operation == "restore":
        whole = _crashed_restore(data, step)
    else:
        whole = _crashed_revocation(data, step)
    _assert_whole(whole, acknowledged)
    _assert_whole(data, acknowledged)
    if operation == "rotate":  # and the rotation, run again, completes
        assert main(_admin(data, "keys", "rotate")) == 0
        _assert_whole(data, acknowledged)

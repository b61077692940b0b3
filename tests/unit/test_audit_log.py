"""The embedded audit log: every line durable before ``record`` returns, syncs shared by callers."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from engram_memory.adapters.local.audit import JsonlAuditLog, audit_lines
from engram_memory.engine.ports import AuditEvent


def _event(number: int) -> AuditEvent:
    return AuditEvent(
        audit_id=f"aud_{number}",
        at_ms=1_700_000_000_000 + number,
        tenant_id="t",
        workspace_id="w",
        principal="p",
        agent_id=None,
        session_id=None,
        tool="search",
        ok=True,
        code="OK",
        target=None,
        digests={},
    )


def test_concurrent_callers_share_a_sync_and_each_returns_after_its_line_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.log"
    log = JsonlAuditLog(path)
    synced: list[set[str]] = []  # the audit ids on disk at each fsync
    first_sync_entered = threading.Event()
    others_queued = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append({json.loads(line)["audit_id"] for line in path.read_text().splitlines()})
        if len(synced) == 1:  # hold the first sync until every other caller has queued its line
            first_sync_entered.set()
            assert others_queued.wait(10)

    monkeypatch.setattr(os, "fsync", fsync)
    returned_after_sync: dict[str, bool] = {}

    def record(number: int) -> None:
        log.record(_event(number))
        returned_after_sync[f"aud_{number}"] = any(f"aud_{number}" in ids for ids in synced)

    leader = threading.Thread(target=record, args=(0,))
    leader.start()
    assert first_sync_entered.wait(10)
    followers = [threading.Thread(target=record, args=(n,)) for n in range(1, 9)]
    for thread in followers:
        thread.start()
    while sum(len(b.lines) for b in [log._open] if b is not None) < 8:
        threading.Event().wait(0.001)
    others_queued.set()
    for thread in [leader, *followers]:
        thread.join(10)

    assert len(synced) == 2  # one sync for the first line, one for the eight that queued meanwhile
    assert returned_after_sync == {f"aud_{n}": True for n in range(9)}
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(line["audit_id"] for line in lines) == sorted(f"aud_{n}" for n in range(9))
    assert log.read() == lines


def test_a_failed_sync_is_every_waiting_caller_s_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = JsonlAuditLog(tmp_path / "audit.log")

    def fsync(fd: int) -> Any:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="I/O error"):
        log.record(_event(1))
    monkeypatch.undo()
    log.record(_event(2))  # the log is usable again once the disk is
    assert [line["audit_id"] for line in log.read()][-1] == "aud_2"


def test_a_full_log_is_sealed_into_gzip_segments_and_read_back_in_order(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = JsonlAuditLog(path, segment_bytes=2_000)
    for number in range(60):
        log.record(_event(number))
    segments = sorted(p.name for p in tmp_path.glob("audit.log.[0-9]*"))
    assert len(segments) >= 5 and all(name.endswith(".gz") for name in segments)
    assert all((tmp_path / name).read_bytes()[:2] == b"\x1f\x8b" for name in segments)
    assert all(os.stat(tmp_path / name).st_mode & 0o077 == 0 for name in segments)
    assert path.stat().st_size < 2_000
    assert [line["audit_id"] for line in log.read()] == [f"aud_{n}" for n in range(60)]
    plain = sum(len(json.dumps(line, separators=(",", ":"))) + 1 for line in log.read())
    on_disk = sum(p.stat().st_size for p in tmp_path.glob("audit.log*"))
    assert on_disk < plain / 2


def test_a_segment_left_plain_by_a_crash_is_read_once_and_sealed_later(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = JsonlAuditLog(path, segment_bytes=2_000)
    for number in range(3):
        log.record(_event(number))
    path.rename(tmp_path / "audit.log.000001")  # renamed, then the process died
    for number in range(3, 40):
        log.record(_event(number))
    assert [line["audit_id"] for line in log.read()] == [f"aud_{n}" for n in range(40)]
    assert not (tmp_path / "audit.log.000001").exists()
    assert (tmp_path / "audit.log.000001.gz").exists()


def test_writers_on_one_log_lose_and_repeat_no_line(tmp_path: Path) -> None:
    # Several writers as several processes (a flock per open file conflicts within one process
    # too), sealing often: the sealing of one must not run beside the sealing of another.
    path = tmp_path / "audit.log"
    writers = [JsonlAuditLog(path, segment_bytes=800) for _ in range(4)]
    failures: list[BaseException] = []

    def write(which: int) -> None:
        try:
            for number in range(60):
                writers[which].record(_event(which * 1000 + number))
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=write, args=(which,)) for which in range(len(writers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    ids = [line["audit_id"] for line in writers[0].read()]
    assert sorted(ids) == sorted(f"aud_{w * 1000 + n}" for w in range(4) for n in range(60))
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".gz")) == [
        "audit.log",
        "audit.log.lock",
    ]


def test_a_reader_beside_a_sealing_writer_reads_every_line_once(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    writer = JsonlAuditLog(path, segment_bytes=600)
    stop = threading.Event()
    problems: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                ids = [json.loads(line)["audit_id"] for line in audit_lines(path) if line.strip()]
            except (OSError, ValueError) as error:
                problems.append(repr(error))
                continue
            if len(ids) != len(set(ids)):
                problems.append("a line read twice")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for number in range(150):
            writer.record(_event(number))
    finally:
        stop.set()
        reader.join(30)
    assert problems == []
    assert [line["audit_id"] for line in writer.read()] == [f"aud_{n}" for n in range(150)]

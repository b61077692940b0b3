"""Room reserved in an empty -wal (``adapters/local/wal_space.py``): zeros SQLite writes its
frames over, read back as nothing, and never laid over a -wal that holds anything."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from engram_memory.adapters.local import wal_space


def _database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS notes (n INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # an empty -wal, as an open or a scrub leaves
    return conn


def _wal(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def _crash_copy(path: Path, into: Path) -> Path:
    """The database and its -wal as a crash leaves them (no close, no checkpoint), without the
    -shm: opening the copy recovers the -wal from its bytes."""
    into.mkdir()
    for name in (path.name, path.name + "-wal"):
        shutil.copyfile(path.with_name(name), into / name)
    return into / path.name


def _notes(path: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return conn.execute("SELECT n, body FROM notes ORDER BY n").fetchall()
    finally:
        conn.close()


def test_an_empty_wal_is_filled_with_zeros_and_has_not_started(tmp_path: Path) -> None:
    conn = _database(tmp_path / "db.sqlite3")
    assert _wal(tmp_path / "db.sqlite3").stat().st_size == 0

    assert wal_space.reserve(conn) is True

    wal = _wal(tmp_path / "db.sqlite3")
    assert wal.read_bytes() == bytes(wal_space.RESERVED_BYTES)
    assert wal_space.started(str(wal)) is False
    assert not conn.in_transaction  # the write lock it held is released
    conn.close()


def test_commits_land_in_the_room_without_growing_the_wal(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    conn = _database(path)
    wal_space.reserve(conn)

    for n in range(20):
        conn.execute("INSERT INTO notes VALUES (?, ?)", (n, f"note {n}"))

    assert _wal(path).stat().st_size == wal_space.RESERVED_BYTES  # overwritten, not grown
    assert wal_space.started(str(_wal(path))) is True
    assert _notes(_crash_copy(path, tmp_path / "crashed")) == [(n, f"note {n}") for n in range(20)]
    conn.close()


def test_a_crash_right_after_the_fill_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    conn = _database(path)
    conn.execute("INSERT INTO notes VALUES (1, 'kept')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    wal_space.reserve(conn)

    # A -wal of zeros (no header, no frame) recovers as empty.
    assert _notes(_crash_copy(path, tmp_path / "crashed")) == [(1, "kept")]
    conn.close()


def test_a_wal_holding_frames_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    conn = _database(path)
    conn.execute("INSERT INTO notes VALUES (1, 'in the wal')")
    before = _wal(path).read_bytes()
    statements: list[str] = []
    conn.set_trace_callback(statements.append)

    assert wal_space.reserve(conn) is False

    assert _wal(path).read_bytes() == before
    # Not even the write lock asked for (a serving process may hold it): only the path read.
    assert statements == ["PRAGMA database_list"]
    conn.close()


def test_no_room_is_made_while_another_writer_holds_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    conn = _database(path)
    conn.execute("PRAGMA busy_timeout=50")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        assert wal_space.reserve(conn) is False  # gives up: the room is an optimization
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert _wal(path).stat().st_size == 0
    assert not conn.in_transaction
    conn.close()


@pytest.mark.parametrize("target", [":memory:", ""])
def test_a_database_without_a_file_has_no_wal_to_reserve(target: str) -> None:
    conn = sqlite3.connect(target, isolation_level=None)
    assert wal_space.wal_path(conn) is None
    assert wal_space.reserve(conn) is False
    conn.close()


def test_a_missing_wal_has_not_started(tmp_path: Path) -> None:
    assert wal_space.started(str(tmp_path / "absent-wal")) is False

"""The embedded host's two -wal files keep room ahead of their commits (``wal_space``): when the
store and the key file open, and after a forget's scrubs truncated them, their -wal is zeros
that the next captures and admissions overwrite instead of growing the file; what they wrote
there is read back after a crash."""

from __future__ import annotations

import shutil
from pathlib import Path

from engram_memory.adapters.local import wal_space
from engram_memory.embedded.composition import open_embedded
from engram_memory.operator_plane.decisions import forget_record

from engram_testing import PURPOSE, context, handled, remember_in

STORE_WAL = "engram.db-wal"
KEYS_WAL = "keys/candidate-keys.db-wal"


def _size(data_dir: Path, wal: str) -> int:
    path = data_dir / wal
    return path.stat().st_size if path.exists() else 0


def test_both_wals_open_with_room_and_captures_do_not_grow_the_key_file_s(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    open_embedded(data_dir).close()  # a store made (its first writes grew the -wal), and closed

    host = open_embedded(data_dir)
    try:
        for wal in (STORE_WAL, KEYS_WAL):
            assert (data_dir / wal).read_bytes() == bytes(wal_space.RESERVED_BYTES), wal
        notes = (
            "Ada ships the parser on Monday.",
            "The backup drill is every Thursday.",
            "Bob prefers tea over coffee.",
            "The staging database moved to Frankfurt.",
            "Quarterly review slides live in the shared drive.",
        )
        for n, note in enumerate(notes):
            remember_in(host.engine, note, f"room-{n:020d}")
        assert _size(data_dir, KEYS_WAL) == wal_space.RESERVED_BYTES  # overwritten, not grown
        assert wal_space.started(str(data_dir / KEYS_WAL))
    finally:
        host.close()


def test_a_forget_leaves_both_wals_scrubbed_and_reserved_again(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    host = open_embedded(data_dir)
    try:
        record_id = remember_in(
            host.engine, "A note to be forgotten soon.", "forgotten-00000000001"
        )
        forget_record(host.engine, context().scope, record_id, "ops-carol", "obsolete")
        # Truncated by the scrubs, then zero-filled: the key file's -wal is zeros; the store's
        # holds the forget's last commits (the outbox settled) at its start, in the room.
        assert (data_dir / KEYS_WAL).read_bytes() == bytes(wal_space.RESERVED_BYTES)
        assert _size(data_dir, STORE_WAL) == wal_space.RESERVED_BYTES
    finally:
        host.close()


def test_writes_into_the_room_survive_a_crash(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    open_embedded(data_dir).close()
    host = open_embedded(data_dir)
    try:
        record_id = remember_in(
            host.engine, "Written into reserved room, then a crash.", "crash-000000000000001"
        )
        # The files as a crash leaves them (nothing closed or checkpointed), without the -shm:
        # opening the copy recovers both -wal files from their bytes.
        crashed = tmp_path / "crashed"
        shutil.copytree(data_dir, crashed, ignore=shutil.ignore_patterns("*-shm", "*.lock"))
    finally:
        host.close()
    reopened = open_embedded(crashed)
    try:
        got = handled(
            reopened.engine, "get", {"record_id": record_id, "purpose_ref": PURPOSE}, context()
        )
        assert got["ok"], got
        text = got["output"]["value"]["record"]["components"][0]["text"]
        assert text == "Written into reserved room, then a crash."  # body key and body both read
    finally:
        reopened.close()

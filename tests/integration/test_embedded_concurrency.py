"""Concurrent callers on one embedded store: dense cursors, one commit per key, no lost writes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engram_memory.engine.journal import verify_journal

from engram_testing import capture_args, context, embedded_harness


def test_concurrent_captures_get_dense_cursors_and_a_valid_chain(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    try:

        def capture(i: int) -> dict:  # type: ignore[type-arg]
            return harness.ok(
                "capture", capture_args(f"parallel note {i}", key=f"parallel-key-{i:06d}")
            )

        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(capture, range(40)))
        cursors = sorted(int(r["cursor"]) for r in results)
        assert cursors == list(range(1, 41))
        assert verify_journal(harness.store, context().scope).cursor == 40
    finally:
        harness.close()


def test_the_same_key_raced_from_many_threads_commits_exactly_once(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    try:
        args = capture_args(key="raced-key-00000001")
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(lambda _: harness.ok("capture", args), range(16)))
        statuses = sorted(r["status"] for r in results)
        assert statuses.count("committed_pending") == 1
        assert statuses.count("duplicate_exact") == 15
        assert len({r["candidate_id"] for r in results}) == 1
        assert harness.store.head(context().scope).cursor == 1
    finally:
        harness.close()


def test_racing_forgets_of_one_record_tombstone_it_once(tmp_path: Path) -> None:
    harness = embedded_harness(tmp_path)
    try:
        record_id = harness.remember()
        with ThreadPoolExecutor(max_workers=6) as pool:
            envelopes = list(
                pool.map(lambda i: harness.forget(record_id, key=f"race-forget-{i:06d}"), range(6))
            )
        codes = sorted("OK" if e["ok"] else e["error"]["code"] for e in envelopes)
        assert codes == ["ALREADY_TERMINAL"] * 5 + ["OK"]
        assert verify_journal(harness.store, context().scope).cursor == 3
    finally:
        harness.close()


def test_two_processes_writing_one_scope_keep_the_journal_dense(tmp_path: Path) -> None:
    """Two engines on one database file stand in for two server processes: only the optimistic
    head check inside the commit keeps them apart (no shared in-process lock)."""
    first = embedded_harness(tmp_path)
    second = embedded_harness(tmp_path)
    try:

        def capture(i: int) -> dict:  # type: ignore[type-arg]
            harness = first if i % 2 else second
            return harness.ok(
                "capture", capture_args(f"two process note {i}", key=f"two-proc-key-{i:06d}")
            )

        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(capture, range(24)))
        assert sorted(int(r["cursor"]) for r in results) == list(range(1, 25))
        assert verify_journal(first.store, context().scope).cursor == 24
    finally:
        first.close()
        second.close()

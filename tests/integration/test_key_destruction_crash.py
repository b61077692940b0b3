"""Crash-safety of the candidate key's destruction (``adapters/local/key_durability.py``).

An admitted candidate's key lives until the record it became is forgotten (a backup taken while
it was pending must still open it). The key file's DELETE does not sync at its own commit: the
scrub checkpoint that follows syncs the -wal and then the database file. A real engine in a
child process captures, admits and forgets, and is killed (SIGKILL: nothing closed, nothing
flushed by Python) at four points: after capture answered (its keys written in one sync), after
the forget answered, before the candidate key's destruction ran, and between the DELETE and the
checkpoint. Reopened, the record is forgotten, and the candidate's key is gone from every file of
the data directory (at once, or once the outbox item left by the crash is drained), so the
candidate's ciphertext, in any backup, cannot be opened again.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engram_memory.embedded.composition import open_embedded
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import KeyDestroyed, SealedBlob
from engram_memory.operator_plane.decisions import forget_record

from engram_testing import PURPOSE, context, killed_child

REPO = Path(__file__).resolve().parents[2]
TEXT = "The crash drill: the admitted record survives and the candidate key does not."

_CHILD = textwrap.dedent(
    """
    import json, os, signal, sqlite3, sys
    from pathlib import Path

    from engram_memory.adapters.local import vault as vault_module
    from engram_memory.embedded.composition import open_embedded
    from engram_memory.operator_plane.decisions import forget_record
    from engram_testing import capture_args, context

    data_dir, crash = Path(sys.argv[1]), sys.argv[2]
    host = open_embedded(data_dir)
    ctx = context()

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if crash == "before-destroy":
        vault_module.LocalVault.destroy = lambda self, key_ref: die()
    elif crash == "mid-scrub":
        def delete_then_die(conn, statement, parameters):
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(statement, tuple(parameters))
            die()
        vault_module.delete_and_scrub = delete_then_die

    captured = host.call("capture", capture_args(sys.argv[3], key="crash-capture-000000000001"), ctx)
    candidate_id = captured["output"]["value"]["candidate_id"]
    conn = sqlite3.connect(data_dir / "engram.db")
    (key_ref, sealed) = conn.execute(
        "SELECT key_ref, sealed FROM candidates WHERE candidate_id = ?", (candidate_id,)
    ).fetchone()
    conn.close()
    conn = sqlite3.connect(data_dir / "keys" / "candidate-keys.db")
    (wrapped,) = conn.execute(
        "SELECT wrapped FROM data_keys WHERE key_ref = ?", (key_ref,)
    ).fetchone()
    conn.close()
    print(json.dumps({
        "candidate_id": candidate_id, "key_ref": key_ref,
        "sealed": bytes(sealed).hex(), "wrapped": bytes(wrapped).hex(),
    }), flush=True)
    if crash == "after-capture":
        die()
    admitted = host.call(
        "request_admission",
        {"candidate_id": candidate_id, "idempotency_key": "crash-admit-000000000001"},
        ctx,
    )
    outcome = admitted["output"]["value"]["outcome"]
    forget_record(host.engine, ctx.scope, outcome["record_id"], "ops-carol", "obsolete")
    print(json.dumps(outcome), flush=True)
    die()
    """
)


def _crash(data_dir: Path, crash: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    lines = killed_child(["-c", _CHILD, str(data_dir), crash, TEXT])
    sealed = json.loads(lines[0])
    answer = json.loads(lines[1]) if len(lines) > 1 else None
    return sealed, answer


def _killed_before_answering(data_dir: Path, crash: str) -> dict[str, Any]:
    """Run the child to a crash point before the admission and the forget answered; what the
    capture sealed."""
    sealed, answer = _crash(data_dir, crash)
    assert answer is None
    return sealed


def _files_holding(data_dir: Path, needle: bytes) -> list[str]:
    return sorted(
        str(path.relative_to(data_dir))
        for path in data_dir.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    )


def _key_row(data_dir: Path, key_ref: str) -> bool:
    conn = sqlite3.connect(data_dir / "keys" / "candidate-keys.db")
    try:
        row = conn.execute("SELECT 1 FROM data_keys WHERE key_ref = ?", (key_ref,)).fetchone()
    finally:
        conn.close()
    return row is not None


def _assert_forgotten_and_candidate_shredded(
    data_dir: Path, sealed: dict[str, Any], record_id: str
) -> None:
    host = open_embedded(data_dir)
    try:
        envelope = host.call("get", {"record_id": record_id, "purpose_ref": PURPOSE}, context())
        assert envelope["error"]["code"] == "NOT_FOUND", envelope
        left = host.store.outbox_pending(100)
        assert [i for i in left if i.kind != "audit_line"] == []  # nothing left to do
        host.engine.drain_outbox()  # but the killed child's audit lines, written once
        assert host.store.outbox_pending(100) == []
        scope = Scope(context().tenant_id, context().workspace_id)
        blob = SealedBlob(sealed["key_ref"], bytes.fromhex(sealed["sealed"]))
        with pytest.raises(KeyDestroyed):
            host.vault.open(scope, sealed["candidate_id"], blob)
    finally:
        host.close()
    assert not _key_row(data_dir, sealed["key_ref"])
    assert _files_holding(data_dir, bytes.fromhex(sealed["wrapped"])) == []


def test_killed_after_the_forget_answered_the_key_is_already_gone(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sealed, answer = _crash(data_dir, "after-answer")

    assert answer is not None and answer["status"] == "accepted"
    # Before anything reopens the data directory: no file holds the wrapped key any more.
    assert not _key_row(data_dir, sealed["key_ref"])
    assert _files_holding(data_dir, bytes.fromhex(sealed["wrapped"])) == []
    _assert_forgotten_and_candidate_shredded(data_dir, sealed, answer["record_id"])


def _queued_key_destruction(data_dir: Path, sealed: dict[str, Any]) -> str:
    """After a crash inside the forget: the candidate key's destruction is still queued, the
    drainer runs it; the record's id."""
    host = open_embedded(data_dir)
    try:
        pending = [i.target for i in host.store.outbox_pending(100) if i.kind == "destroy_key"]
        assert pending == [sealed["key_ref"]]
        assert host.engine.drain_outbox() >= 1
        candidate = host.store.candidate_get(
            Scope(context().tenant_id, context().workspace_id), sealed["candidate_id"]
        )
        assert candidate is not None
        return candidate.record_id
    finally:
        host.close()


def test_killed_before_the_key_destruction_ran_the_outbox_destroys_it_after_restart(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    sealed = _killed_before_answering(data_dir, "before-destroy")
    assert _key_row(data_dir, sealed["key_ref"])  # the key outlived the crash...
    record_id = _queued_key_destruction(data_dir, sealed)  # ...its destruction did not
    _assert_forgotten_and_candidate_shredded(data_dir, sealed, record_id)


def test_killed_after_capture_answered_the_candidate_is_admitted_after_restart(
    tmp_path: Path,
) -> None:
    # The seal's keys were durable in one sync of a fresh -wal before capture answered.
    data_dir = tmp_path / "data"
    sealed = _killed_before_answering(data_dir, "after-capture")
    host = open_embedded(data_dir)
    try:
        admitted = host.call(
            "request_admission",
            {"candidate_id": sealed["candidate_id"], "idempotency_key": "crash-admit-000000000001"},
            context(),
        )
        outcome = admitted["output"]["value"]["outcome"]
        assert outcome["status"] == "accepted"
        got = host.call(
            "get", {"record_id": outcome["record_id"], "purpose_ref": PURPOSE}, context()
        )
        assert got["output"]["value"]["record"]["components"][0]["text"] == TEXT
        assert _key_row(data_dir, sealed["key_ref"])  # kept while the record lives
        forget_record(host.engine, context().scope, outcome["record_id"], "ops", "obsolete")
    finally:
        host.close()
    _assert_forgotten_and_candidate_shredded(data_dir, sealed, outcome["record_id"])


def test_killed_between_the_delete_and_the_scrub_the_outbox_finishes_the_scrub(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    sealed = _killed_before_answering(data_dir, "mid-scrub")
    # Not scrubbed yet: the older page images still hold the wrapped key...
    assert _files_holding(data_dir, bytes.fromhex(sealed["wrapped"])) != []
    record_id = _queued_key_destruction(data_dir, sealed)  # ...so the drainer scrubs again
    _assert_forgotten_and_candidate_shredded(data_dir, sealed, record_id)

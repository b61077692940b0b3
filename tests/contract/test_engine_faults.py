"""Fault injection at the store and the vault: nothing half-written, the right codes, clean retries."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from engram_memory.adapters.local.sqlite.commit import CommitStep
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import SealedBlob, Vault, VaultUnavailable

from engram_testing import Harness, ScriptedPolicy, capture_args, context, embedded_harness

# The commit steps a promotion passes before its commit (a tombstone and an approval are a
# forget's). An embedded promotion queues nothing (its index is in the store, the candidate's
# key stays): the outbox step is a rejection's, which queues both keys' destruction; the commit
# itself and what follows it have tests of their own below.
PROMOTION_STEPS = [
    step
    for step in get_args(CommitStep)
    if step not in ("tombstone", "approval", "outbox", "commit", "after_commit")
]


class Fault:
    """Raises a SQLite I/O error at one named commit step, once."""

    def __init__(self) -> None:
        self.step: str | None = None

    def __call__(self, step: str) -> None:
        if step == self.step:
            self.step = None
            raise sqlite3.OperationalError("disk I/O error")


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[tuple[Harness, Fault]]:
    fault = Fault()
    harness = embedded_harness(tmp_path, fault_hook=fault)
    yield harness, fault
    harness.close()


@pytest.mark.parametrize("step", PROMOTION_STEPS)
def test_a_store_failure_at_any_step_of_a_promotion_leaves_every_table_unchanged(
    faulty: tuple[Harness, Fault], step: str
) -> None:
    harness, fault = faulty
    captured = harness.capture()
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-fault-00001"}
    before = harness.store.table_snapshot()
    fault.step = step
    envelope = harness.call("request_admission", args)
    assert (
        envelope["error"]["code"] == "STORE_UNAVAILABLE" and envelope["error"]["retriable"] is True
    )
    assert harness.store.table_snapshot() == before
    assert harness.store.candidate_get(context().scope, captured["candidate_id"]).state == "pending"
    retry = harness.ok("request_admission", args)
    assert retry["outcome"]["status"] == "accepted"


def test_a_store_failure_queuing_a_rejections_key_destruction_leaves_every_table_unchanged(
    faulty: tuple[Harness, Fault],
) -> None:
    harness, fault = faulty
    harness.engine.policy = ScriptedPolicy("reject")
    captured = harness.capture()
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-fault-00003"}
    before = harness.store.table_snapshot()
    fault.step = "outbox"
    assert harness.call("request_admission", args)["error"]["code"] == "STORE_UNAVAILABLE"
    assert harness.store.table_snapshot() == before
    assert harness.ok("request_admission", args)["outcome"]["status"] == "rejected"


def test_an_unknown_commit_outcome_after_commit_resolves_to_the_committed_output(
    faulty: tuple[Harness, Fault],
) -> None:
    harness, fault = faulty
    captured = harness.capture()
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-fault-00002"}
    fault.step = "after_commit"
    envelope = harness.call("request_admission", args)
    assert envelope["error"] == {
        "code": "MUTATION_OUTCOME_UNKNOWN",
        "message": envelope["error"]["message"],
        "retriable": True,
    }
    head = harness.store.head(context().scope)
    retry = harness.ok("request_admission", args)
    assert retry["replayed"] is True and retry["outcome"]["status"] == "accepted"
    assert harness.store.head(context().scope) == head  # applied exactly once
    assert harness.get(retry["outcome"]["record_id"])["ok"]


def test_an_unknown_commit_outcome_that_did_not_commit_executes_once_on_retry(
    faulty: tuple[Harness, Fault],
) -> None:
    harness, fault = faulty
    fault.step = "commit"
    envelope = harness.call("capture", capture_args())
    assert envelope["error"]["code"] == "MUTATION_OUTCOME_UNKNOWN"
    assert harness.store.head(context().scope).cursor == 0
    retry = harness.ok("capture", capture_args())
    assert retry["status"] == "committed_pending" and retry["cursor"] == "1"
    assert harness.ok("capture", capture_args())["status"] == "duplicate_exact"


@pytest.mark.parametrize(
    "step", ["ledger", "event", "record", "tombstone", "projection", "approval"]
)
def test_a_store_failure_during_forget_leaves_the_record_readable(
    faulty: tuple[Harness, Fault], step: str
) -> None:
    harness, fault = faulty
    record_id = harness.remember()
    before = harness.store.table_snapshot()
    fault.step = step
    assert (
        harness.forget(record_id, key="forget-fault-0001")["error"]["code"] == "STORE_UNAVAILABLE"
    )
    assert harness.store.table_snapshot() == before
    assert harness.get(record_id)["ok"]
    assert harness.forget(record_id, key="forget-fault-0001")["ok"]


def test_a_capture_whose_commit_fails_leaves_no_orphan_key(faulty: tuple[Harness, Fault]) -> None:
    harness, fault = faulty
    fault.step = "event"
    assert harness.call("capture", capture_args())["error"]["code"] == "STORE_UNAVAILABLE"
    import sqlite3 as sq

    with sq.connect(harness.vault._path) as conn:
        assert conn.execute("SELECT count(*) FROM data_keys").fetchone()[0] == 0


class FlakyVault:
    """Wraps a vault and fails chosen operations with VaultUnavailable."""

    def __init__(self, inner: Vault) -> None:
        self.inner = inner
        self.fail: set[str] = set()

    def seal(self, scope: Scope, candidate_id: str, plaintext: bytes) -> SealedBlob:
        if "seal" in self.fail:
            raise VaultUnavailable("down")
        return self.inner.seal(scope, candidate_id, plaintext)

    def open(self, scope: Scope, candidate_id: str, blob: SealedBlob) -> bytes:
        if "open" in self.fail:
            raise VaultUnavailable("down")
        return self.inner.open(scope, candidate_id, blob)

    def destroy(self, key_ref: str) -> None:
        if "destroy" in self.fail:
            raise VaultUnavailable("down")
        self.inner.destroy(key_ref)

    def key_exists(self, key_ref: str) -> bool:
        return self.inner.key_exists(key_ref)


def test_a_vault_outage_at_seal_is_store_unavailable_and_writes_nothing(harness: Harness) -> None:
    flaky = FlakyVault(harness.vault)
    harness.engine.vault = flaky
    flaky.fail = {"seal"}
    assert harness.error("capture", capture_args()) == "STORE_UNAVAILABLE"
    assert harness.store.head(context().scope).cursor == 0


def test_a_vault_outage_at_open_keeps_the_candidate_pending(harness: Harness) -> None:
    captured = harness.capture()
    flaky = FlakyVault(harness.vault)
    harness.engine.vault = flaky
    flaky.fail = {"open"}
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-vault-00001"}
    assert harness.error("request_admission", args) == "STORE_UNAVAILABLE"
    assert harness.store.candidate_get(context().scope, captured["candidate_id"]).state == "pending"


def test_key_destruction_reports_pending_honestly_and_completes_later(harness: Harness) -> None:
    captured = harness.capture()
    flaky = FlakyVault(harness.vault)
    harness.engine.vault = flaky
    flaky.fail = {"destroy"}
    value = harness.withdraw(captured["candidate_id"], key="withdraw-vault-001")["output"]["value"]
    assert value["key_destruction"] == "pending"
    flaky.fail = set()
    assert harness.engine.drain_outbox() == 1
    replay = harness.withdraw(captured["candidate_id"], key="withdraw-vault-001")["output"]["value"]
    assert replay["key_destruction"] == "complete"

"""The DynamoDB store on moto: conditions, conflict reasons, S3 blobs, failure mapping, no Scans.

Store-level tests drive ``DynamoStore`` with hand-built change sets; the engine-level ones run
the AWS adapter set (``aws_harness``) through the same faults the embedded fault suite injects,
here through botocore's event hooks on the store's clients.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from aws_testing import (
    BUCKET,
    KEY_TABLE,
    REGION,
    TABLE,
    MemoryLexicalIndex,
    another_engine,
    inject,
    moto_aws,
    provision,
)
from aws_testing import (
    client_error as aws_client_error,
)
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from store_rows import candidate, ledger, record

from engram_memory.adapters.aws.client_config import CONNECT_TIMEOUT_S
from engram_memory.adapters.aws.dynamo_store import BlobMissing, DynamoStore, scope_key
from engram_memory.adapters.local.sqlite.indexes import SqliteLexicalIndex
from engram_memory.adapters.local.sqlite.store import SqliteStore
from engram_memory.contract.canonical import GENESIS_HASH
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope
from engram_memory.engine.journal import build_event, verify_journal
from engram_memory.engine.ports import (
    CandidateHold,
    ChangeSet,
    CommitConflict,
    CommitOutcomeUnknown,
    IndexMissing,
    JournalHead,
    LedgerEntry,
    OutboxItem,
    ProjectionChange,
    ProjectionDoc,
    StateTransition,
    StoreUnavailable,
)
from engram_memory.engine.usecases.admission import UNPROJECTED_LIMIT

from engram_testing import Harness, capture_args, context, handled

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.type_defs import WriteRequestTypeDef

SCOPE = Scope("tenant-acme-0001", "ws-research-0001")
MIB = 1_048_576


@pytest.fixture
def store() -> Iterator[DynamoStore]:
    with moto_aws():
        yield provision()


# --------------------------------------------------------------------------------------------
# Change-set builders
# --------------------------------------------------------------------------------------------


def change(store: DynamoStore, key: str, scope: Scope = SCOPE, **fields: Any) -> ChangeSet:
    """A change set against the current head: the next event plus ``fields``."""
    head = store.head(scope)
    event, _ = build_event(
        head, operation="test", target=key, at_ms=1_780_000_000_000, digests={"key": key}
    )
    fields.setdefault("ledger", ledger(key, event.cursor))
    return ChangeSet(scope=scope, expected_head=head, event=event, **fields)


def conflict(store: DynamoStore, changes: ChangeSet) -> str:
    before = store.table_snapshot()
    with pytest.raises(CommitConflict) as raised:
        store.commit(changes)
    assert store.table_snapshot() == before  # nothing written
    return raised.value.reason


def client_error(
    code: str, status: int = 400, operation: str = "TransactWriteItems"
) -> ClientError:
    return aws_client_error(code, status, operation, code)


def fail_with(error: Exception) -> Any:
    def hook(**_: Any) -> None:
        raise error

    return hook


# --------------------------------------------------------------------------------------------
# Reads and writes
# --------------------------------------------------------------------------------------------


def test_an_empty_scope_has_the_genesis_head_and_no_rows(store: DynamoStore) -> None:
    assert store.head(SCOPE) == JournalHead(0, GENESIS_HASH)
    assert store.ledger_get(SCOPE, "agent-alice", "k" * 16) is None
    assert store.candidate_get(SCOPE, "cand_x") is None
    assert store.record_get(SCOPE, "mem_x") is None
    assert store.records_get(SCOPE, ["mem_x"]) == {}
    assert store.events(SCOPE, 0, 10) == []
    assert not store.payload_tombstoned(SCOPE, "sha256:" + "2" * 64)
    assert store.outbox_pending(10) == []


def test_a_commit_writes_every_row_and_moves_the_head(store: DynamoStore) -> None:
    first = change(store, "capture-key-000001", new_candidate=candidate("cand_a"))
    store.commit(first)
    assert store.head(SCOPE) == JournalHead(1, first.event.event_hash)  # type: ignore[union-attr]
    assert store.events(SCOPE, 0, 10) == [first.event]
    assert store.ledger_get(SCOPE, "agent-alice", "capture-key-000001") == first.ledger
    assert store.candidate_get(SCOPE, "cand_a") == first.new_candidate

    second = change(
        store,
        "admit-key-0000001",
        candidate_transition=StateTransition("cand_a", "pending", "admitted"),
        new_record=record("mem_a", cursor=2),
    )
    store.commit(second)
    assert store.candidate_get(SCOPE, "cand_a").state == "admitted"  # type: ignore[union-attr]
    assert store.record_get(SCOPE, "mem_a") == second.new_record
    assert store.records_get(SCOPE, ["mem_a", "mem_a", "mem_missing"]) == {
        "mem_a": second.new_record
    }
    assert [e.cursor for e in store.events(SCOPE, 0, 10)] == [1, 2]
    assert [e.cursor for e in store.events(SCOPE, 1, 10)] == [2]
    assert verify_journal(store, SCOPE).cursor == 2

    third = change(
        store,
        "forget-key-000001",
        record_transition=StateTransition("mem_a", "accepted_current", "tombstoned"),
        shred_record_body=True,
        tombstone_payload_digest="sha256:" + "2" * 64,
        approval_id="apr_1",
    )
    store.commit(third)
    row = store.record_get(SCOPE, "mem_a")
    assert row is not None and row.state == "tombstoned" and row.body is None
    assert row.record_digest == "sha256:" + "3" * 64  # digests kept
    assert store.payload_tombstoned(SCOPE, "sha256:" + "2" * 64)
    assert not store.payload_tombstoned(Scope(SCOPE.tenant_id, "other"), "sha256:" + "2" * 64)


def test_a_change_set_without_an_event_is_fenced_by_the_head_but_does_not_move_it(
    store: DynamoStore,
) -> None:
    store.commit(change(store, "capture-key-000001"))
    head = store.head(SCOPE)
    store.commit(ChangeSet(SCOPE, head, ledger("no-event-key-0001", head.cursor)))
    assert store.head(SCOPE) == head
    stale = ChangeSet(SCOPE, JournalHead(0, GENESIS_HASH), ledger("no-event-key-0002", 0))
    assert conflict(store, stale) == "head"


def test_a_hold_is_fenced_by_its_candidate_not_the_head_and_outlives_no_decision(
    store: DynamoStore,
) -> None:
    store.commit(change(store, "capture-key-000001", new_candidate=candidate("cand_a")))
    store.commit(change(store, "capture-key-000002", new_candidate=candidate("cand_b")))
    held = "sha256:" + "4" * 64
    store.commit(
        ChangeSet(SCOPE, None, ledger("hold-key-0000001", 0), hold=CandidateHold("cand_a", held))
    )
    assert store.head(SCOPE).cursor == 2  # no event
    assert store.candidate_get(SCOPE, "cand_a").held == held  # type: ignore[union-attr]
    assert store.candidate_get(SCOPE, "cand_b").held is None  # type: ignore[union-attr]
    admit: dict[str, Any] = {
        "candidate_transition": StateTransition("cand_a", "pending", "admitted"),
        "new_record": record("mem_a", cursor=3),
    }
    assert conflict(store, change(store, "admit-key-0000001", unless_held=True, **admit)) == "state"
    store.commit(change(store, "adjudicate-key-01", **admit))  # an operator's decision
    row = store.candidate_get(SCOPE, "cand_a")
    assert row is not None and (row.state, row.held) == ("admitted", None)
    late = ChangeSet(SCOPE, None, ledger("hold-key-0000002", 0), hold=CandidateHold("cand_a", held))
    assert conflict(store, late) == "state"
    event, _ = build_event(store.head(SCOPE), operation="t", target="x", at_ms=1, digests={})
    with pytest.raises(ValueError, match="head"):
        ChangeSet(SCOPE, None, ledger("hold-key-0000003", 0), event=event)


def test_scope_keys_cannot_collide_through_separators(store: DynamoStore) -> None:
    one, two = Scope("a#b", "c"), Scope("a", "b#c")
    assert scope_key(one) != scope_key(two)
    store.commit(change(store, "capture-key-000001", scope=one))
    assert store.head(two).cursor == 0 and store.head(one).cursor == 1


# --------------------------------------------------------------------------------------------
# Conditions and conflict reasons
# --------------------------------------------------------------------------------------------


def test_a_moved_head_is_a_head_conflict(store: DynamoStore) -> None:
    stale = change(store, "capture-key-000001")
    store.commit(change(store, "capture-key-000002"))
    assert conflict(store, stale) == "head"
    # a head at the right cursor but with another hash is moved too
    head = store.head(SCOPE)
    forged = dataclasses.replace(
        change(store, "capture-key-000003"), expected_head=JournalHead(head.cursor, "sha256:x")
    )
    assert conflict(store, forged) == "head"


def test_a_taken_idempotency_key_is_a_ledger_conflict(store: DynamoStore) -> None:
    store.commit(change(store, "capture-key-000001"))
    assert conflict(store, change(store, "capture-key-000001")) == "ledger"


def test_a_taken_candidate_id_is_a_ledger_conflict(store: DynamoStore) -> None:
    store.commit(change(store, "capture-key-000001", new_candidate=candidate("cand_a")))
    again = change(store, "capture-key-000002", new_candidate=candidate("cand_a"))
    assert conflict(store, again) == "ledger"


def test_transitions_from_a_moved_state_are_state_conflicts(store: DynamoStore) -> None:
    store.commit(change(store, "capture-key-000001", new_candidate=candidate("cand_a")))
    store.commit(
        change(
            store,
            "withdraw-key-00001",
            candidate_transition=StateTransition("cand_a", "pending", "withdrawn"),
        )
    )
    moved = change(
        store,
        "admit-key-0000001",
        candidate_transition=StateTransition("cand_a", "pending", "admitted"),
        new_record=record("mem_a"),
    )
    assert conflict(store, moved) == "state"
    missing = change(
        store,
        "admit-key-0000002",
        candidate_transition=StateTransition("cand_missing", "pending", "admitted"),
    )
    assert conflict(store, missing) == "state"


def test_a_taken_record_id_and_a_moved_record_are_state_conflicts(store: DynamoStore) -> None:
    store.commit(change(store, "admit-key-0000001", new_record=record("mem_a")))
    assert conflict(store, change(store, "admit-key-0000002", new_record=record("mem_a"))) == (
        "state"
    )
    wrong_from = change(
        store,
        "forget-key-000001",
        record_transition=StateTransition("mem_a", "historical", "tombstoned"),
        shred_record_body=True,
        tombstone_payload_digest="sha256:" + "2" * 64,
    )
    assert conflict(store, wrong_from) == "state"
    assert store.record_get(SCOPE, "mem_a").body is not None  # type: ignore[union-attr]
    assert not store.payload_tombstoned(SCOPE, "sha256:" + "2" * 64)


def test_a_used_approval_is_an_approval_conflict_in_any_scope(store: DynamoStore) -> None:
    store.commit(change(store, "withdraw-key-00001", approval_id="apr_once"))
    assert conflict(store, change(store, "withdraw-key-00002", approval_id="apr_once")) == (
        "approval"
    )
    elsewhere = Scope(SCOPE.tenant_id, "ws-other")
    assert conflict(store, change(store, "w-key-000003", elsewhere, approval_id="apr_once")) == (
        "approval"
    )


def test_the_first_failing_condition_names_the_conflict(store: DynamoStore) -> None:
    store.commit(change(store, "capture-key-000001", approval_id="apr_1"))
    stale = ChangeSet(
        SCOPE,
        JournalHead(0, GENESIS_HASH),
        ledger("capture-key-000001", 1),
        approval_id="apr_1",
    )
    assert conflict(store, stale) == "head"
    taken = change(store, "capture-key-000001", approval_id="apr_1")
    assert conflict(store, taken) == "ledger"


def test_concurrent_writers_keep_cursors_dense_and_the_chain_whole(store: DynamoStore) -> None:
    conflicts: list[str] = []
    lock = threading.Lock()
    # Every writer's first change is built on the same head before any of them commits, so
    # the head fence is exercised on every run (five of the six lose), not by scheduling luck.
    same_head = threading.Barrier(6)

    def writer(worker: int) -> None:
        raced = False
        for n in range(8):
            key = f"writer-{worker:02d}-{n:04d}-key"
            while True:
                pending = change(store, key)
                if not raced:  # only the first change; retries do not wait again
                    same_head.wait(timeout=30)
                    raced = True
                try:
                    store.commit(pending)
                    break
                except CommitConflict as exc:
                    with lock:
                        conflicts.append(exc.reason)

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(writer, range(6)))
    assert len(conflicts) >= 5  # the first race on one head: one winner, five conflicts
    assert set(conflicts) == {"head"}
    assert verify_journal(store, SCOPE).cursor == 48
    assert [e.cursor for e in store.events(SCOPE, 0, 100)] == list(range(1, 49))
    cursors = sorted(
        store.ledger_get(SCOPE, "agent-alice", f"writer-{w:02d}-{n:04d}-key").cursor  # type: ignore[union-attr]
        for w in range(6)
        for n in range(8)
    )
    assert cursors == list(range(1, 49))  # every commit got its own cursor


# --------------------------------------------------------------------------------------------
# Large attributes in S3
# --------------------------------------------------------------------------------------------


def blob_keys(store: DynamoStore) -> list[str]:
    return [key for key, _ in store.table_snapshot()["blobs"]]


def test_a_one_mib_body_round_trips_through_s3_and_is_shredded_with_the_tombstone(
    store: DynamoStore,
) -> None:
    body = (b'{"text":"' + b"x" * MIB + b'"}')[: MIB - 2] + b'"}'
    sealed = bytes(range(256)) * (MIB // 256)
    store.commit(
        change(
            store,
            "capture-key-000001",
            new_candidate=candidate("cand_a", sealed=sealed),
            ledger=ledger("capture-key-000001", 1, output=b"o" * MIB),
        )
    )
    store.commit(change(store, "admit-key-0000001", new_record=record("mem_a", body=body)))
    assert len(blob_keys(store)) == 3
    for attributes in store.table_snapshot()["items"]:
        assert not any(isinstance(v, bytes) and len(v) > 300_000 for _, v in attributes)
    assert store.candidate_get(SCOPE, "cand_a").sealed == sealed  # type: ignore[union-attr]
    assert store.ledger_get(SCOPE, "agent-alice", "capture-key-000001").output == b"o" * MIB  # type: ignore[union-attr]
    assert store.record_get(SCOPE, "mem_a").body == body  # type: ignore[union-attr]
    assert store.records_get(SCOPE, ["mem_a"])["mem_a"].body == body
    body_key = store.table_snapshot()
    assert any(key.endswith(hashlib.sha256(body).hexdigest()) for key, _ in body_key["blobs"])

    store.commit(
        change(
            store,
            "forget-key-000001",
            record_transition=StateTransition("mem_a", "accepted_current", "tombstoned"),
            shred_record_body=True,
            tombstone_payload_digest="sha256:" + "2" * 64,
        )
    )
    assert store.record_get(SCOPE, "mem_a").body is None  # type: ignore[union-attr]
    assert not any(k.endswith(hashlib.sha256(body).hexdigest()) for k in blob_keys(store))
    assert len(blob_keys(store)) == 2
    assert not any(dict(item).get("kind") == "blob_gc" for item in store.table_snapshot()["items"])


def test_a_shredded_blob_whose_deletion_failed_is_collected_later(store: DynamoStore) -> None:
    body = b"b" * 400_000
    store.commit(change(store, "admit-key-0000001", new_record=record("mem_a", body=body)))
    remove = inject(
        store.s3, "before-call.s3.DeleteObject", fail_with(client_error("SlowDown", 503))
    )
    store.commit(
        change(
            store,
            "forget-key-000001",
            record_transition=StateTransition("mem_a", "accepted_current", "tombstoned"),
            shred_record_body=True,
        )
    )
    remove()
    assert store.record_get(SCOPE, "mem_a").body is None  # type: ignore[union-attr]
    assert len(blob_keys(store)) == 1  # still there, but marked for deletion
    assert store.collect_shredded_blobs() == 1
    assert blob_keys(store) == []
    assert store.collect_shredded_blobs() == 0


def test_a_missing_blob_is_a_missing_body_or_a_loud_error(store: DynamoStore) -> None:
    store.commit(
        change(store, "capture-key-000001", new_candidate=candidate("cand_a", sealed=b"s" * MIB))
    )
    store.commit(change(store, "admit-key-0000001", new_record=record("mem_a", body=b"r" * MIB)))
    for key in blob_keys(store):
        store.s3.delete_object(Bucket=store.bucket, Key=key)
    row = store.record_get(SCOPE, "mem_a")
    assert row is not None and row.state == "accepted_current" and row.body is None
    with pytest.raises(BlobMissing):
        store.candidate_get(SCOPE, "cand_a")


def test_a_blob_upload_failure_is_store_unavailable_and_commits_nothing(
    store: DynamoStore,
) -> None:
    before = store.table_snapshot()
    inject(store.s3, "before-call.s3.PutObject", fail_with(client_error("SlowDown", 503)))
    with pytest.raises(StoreUnavailable):
        store.commit(
            change(store, "admit-key-0000001", new_record=record("mem_a", body=b"r" * MIB))
        )
    assert store.table_snapshot() == before


# --------------------------------------------------------------------------------------------
# Failure mapping
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        client_error("ProvisionedThroughputExceededException"),
        client_error("ThrottlingException"),
        client_error("RequestLimitExceeded"),
        client_error("TransactionConflictException"),
        client_error("ServiceUnavailable", 503),
        EndpointConnectionError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com"),
    ],
    ids=["throughput", "throttling", "request-limit", "tx-conflict", "503", "no-connection"],
)
def test_a_refused_transaction_is_store_unavailable_and_applies_nothing(
    store: DynamoStore, error: Exception
) -> None:
    before = store.table_snapshot()
    inject(store.dynamodb, "before-call.dynamodb.TransactWriteItems", fail_with(error))
    with pytest.raises(StoreUnavailable):
        store.commit(change(store, "capture-key-000001"))
    assert store.table_snapshot() == before


def cancellation(*codes: str) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
            "CancellationReasons": [{"Code": code} for code in codes],
        },
        "TransactWriteItems",
    )


def test_a_transaction_cancelled_for_throttling_is_store_unavailable(store: DynamoStore) -> None:
    for codes in (("None", "TransactionConflict", "ThrottlingError"), ("ThrottlingError",)):
        remove = inject(
            store.dynamodb,
            "before-call.dynamodb.TransactWriteItems",
            fail_with(cancellation(*codes)),
        )
        with pytest.raises(StoreUnavailable):
            store.commit(change(store, "capture-key-000001"))
        remove()


def test_a_transaction_cancelled_for_a_transaction_conflict_is_a_head_conflict(
    store: DynamoStore,
) -> None:
    """Another transaction was writing one of the items (the head): retried like a moved head."""
    before = store.table_snapshot()
    inject(
        store.dynamodb,
        "before-call.dynamodb.TransactWriteItems",
        fail_with(cancellation("TransactionConflict", "None", "None")),
    )
    with pytest.raises(CommitConflict) as conflict:
        store.commit(change(store, "capture-key-000001"))
    assert conflict.value.reason == "head"
    assert store.table_snapshot() == before


def test_cancellation_reasons_are_read_from_the_message_when_not_structured(
    store: DynamoStore,
) -> None:
    cancelled = ClientError(
        {
            "Error": {
                "Code": "TransactionCanceledException",
                "Message": "Transaction cancelled [None, ConditionalCheckFailed]",
            }
        },
        "TransactWriteItems",
    )
    inject(store.dynamodb, "before-call.dynamodb.TransactWriteItems", fail_with(cancelled))
    with pytest.raises(CommitConflict) as raised:
        store.commit(change(store, "capture-key-000001"))
    assert raised.value.reason == "ledger"


def test_a_timeout_after_the_transaction_applied_is_an_unknown_outcome(
    store: DynamoStore,
) -> None:
    timeout = ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
    remove = inject(store.dynamodb, "after-call.dynamodb.TransactWriteItems", fail_with(timeout))
    changes = change(store, "capture-key-000001")
    with pytest.raises(CommitOutcomeUnknown):
        store.commit(changes)
    remove()
    assert store.head(SCOPE).cursor == 1  # it had applied: a retry must find it in the ledger
    assert store.ledger_get(SCOPE, "agent-alice", "capture-key-000001") == changes.ledger


@pytest.mark.parametrize(
    "error",
    [
        ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com"),
        client_error("InternalServerError", 500),
    ],
    ids=["read-timeout", "500"],
)
def test_an_ambiguous_failure_is_an_unknown_outcome(store: DynamoStore, error: Exception) -> None:
    inject(store.dynamodb, "before-call.dynamodb.TransactWriteItems", fail_with(error))
    with pytest.raises(CommitOutcomeUnknown):
        store.commit(change(store, "capture-key-000001"))


@pytest.mark.parametrize(
    ("event", "read"),
    [
        ("GetItem", lambda s: s.head(SCOPE)),
        ("BatchGetItem", lambda s: s.records_get(SCOPE, ["mem_a"])),
        ("Query", lambda s: s.events(SCOPE, 0, 10)),
        ("Query", lambda s: s.outbox_pending(10)),
        ("PutItem", lambda s: s.claim_nonce(SCOPE, "nonce-1", 1)),
    ],
)
def test_throttled_reads_are_store_unavailable(store: DynamoStore, event: str, read: Any) -> None:
    error = client_error("ProvisionedThroughputExceededException", operation=event)
    inject(store.dynamodb, f"before-call.dynamodb.{event}", fail_with(error))
    with pytest.raises(StoreUnavailable):
        read(store)


def test_unprocessed_batch_keys_are_retried(store: DynamoStore) -> None:
    ids = [f"mem_{i:04d}" for i in range(250)]
    # Written in bulk (a transaction per record makes moto copy the table 250 times).
    puts: list[WriteRequestTypeDef] = [
        {"PutRequest": {"Item": item["Put"]["Item"]}}
        for rid in ids
        for item in store._plan(change(store, f"admit-{rid}-key", new_record=record(rid))).items
        if "Put" in item and item["Put"]["Item"]["kind"] == {"S": "record"}
    ]
    for start in range(0, len(puts), 25):
        store.dynamodb.batch_write_item(RequestItems={store.table_name: puts[start : start + 25]})
    calls: list[int] = []

    def withhold(parsed: dict[str, Any], **_: Any) -> None:
        calls.append(len(parsed["Responses"][store.table_name]))
        got = parsed["Responses"][store.table_name]
        if len(calls) % 2 == 1 and len(got) > 1:  # every other call, hold half of them back
            held, parsed["Responses"][store.table_name] = got[: len(got) // 2], got[len(got) // 2 :]
            keys = [{"pk": item["pk"], "sk": item["sk"]} for item in held]
            parsed["UnprocessedKeys"] = {store.table_name: {"Keys": keys}}

    inject(store.dynamodb, "after-call.dynamodb.BatchGetItem", withhold)
    found = store.records_get(SCOPE, [*ids, "mem_missing"])
    assert sorted(found) == ids
    assert len(calls) > 3 and max(calls) <= 100  # chunks of at most 100 keys


def test_keys_that_stay_unprocessed_are_store_unavailable(
    store: DynamoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "sleep", lambda _: None)  # the module the store backs off with
    store.commit(change(store, "admit-key-0000001", new_record=record("mem_a")))

    def withhold_all(parsed: dict[str, Any], **_: Any) -> None:
        got = parsed["Responses"][store.table_name]
        parsed["Responses"][store.table_name] = []
        keys = [{"pk": item["pk"], "sk": item["sk"]} for item in got]
        parsed["UnprocessedKeys"] = {store.table_name: {"Keys": keys}}

    inject(store.dynamodb, "after-call.dynamodb.BatchGetItem", withhold_all)
    with pytest.raises(StoreUnavailable):
        store.records_get(SCOPE, ["mem_a"])


# --------------------------------------------------------------------------------------------
# Nonces and the outbox
# --------------------------------------------------------------------------------------------


def test_a_nonce_is_claimed_once_and_expires_through_ttl(store: DynamoStore) -> None:
    expires = 1_780_000_300_001
    assert store.claim_nonce(SCOPE, "nonce-0001", expires)
    assert not store.claim_nonce(SCOPE, "nonce-0001", expires)
    assert not store.claim_nonce(Scope("t", "w"), "nonce-0001", expires)
    (item,) = [dict(i) for i in store.table_snapshot()["items"] if dict(i)["kind"] == "nonce"]
    assert item["ttl"] >= math.ceil(expires / 1000)


def test_the_outbox_queues_until_done_and_answers_by_scope_kind_and_target(
    store: DynamoStore,
) -> None:
    items = (
        OutboxItem("destroy_key:key_1", "destroy_key", SCOPE, "key_1"),
        OutboxItem("drop_projection:lexical:mem_a", "drop_projection", SCOPE, "mem_a", "lexical"),
    )
    store.commit(change(store, "withdraw-key-00001", outbox=(*items, items[0])))
    assert sorted(store.outbox_pending(10), key=lambda i: i.item_id) == list(items)
    assert len(store.outbox_pending(1)) == 1
    assert store.outbox_has(SCOPE, "drop_projection", "mem_a")
    assert not store.outbox_has(Scope(SCOPE.tenant_id, "other"), "drop_projection", "mem_a")
    assert not store.outbox_has(SCOPE, "destroy_key", "mem_a")
    assert store.outbox_holds(items[1])
    store.outbox_done(items[1])
    store.outbox_done(items[1])  # idempotent
    assert not store.outbox_has(SCOPE, "drop_projection", "mem_a")
    assert not store.outbox_holds(items[1]) and store.outbox_holds(items[0])
    assert store.outbox_pending(10) == [items[0]]
    store.outbox_done_all(items)
    assert store.outbox_pending(10) == []


def test_a_scope_reads_its_own_outbox_by_kind_without_other_scopes_items(
    store: DynamoStore,
) -> None:
    other = Scope(SCOPE.tenant_id, "other")
    mine = (
        OutboxItem("destroy_key:key_1", "destroy_key", SCOPE, "key_1", "", 1_000),
        OutboxItem(
            "upsert_projection:lexical:mem_a", "upsert_projection", SCOPE, "mem_a", "lexical"
        ),
    )
    theirs = OutboxItem(
        "upsert_projection:lexical:mem_b", "upsert_projection", other, "mem_b", "lexical"
    )
    store.commit(change(store, "admit-key-000001", outbox=mine))
    store.commit(change(store, "admit-key-000002", other, outbox=(theirs,)))
    assert store.outbox_pending_in(SCOPE, None, 10) == list(mine)
    assert store.outbox_pending_in(SCOPE, "upsert_projection", 10) == [mine[1]]
    assert store.outbox_pending_in(other, "upsert_projection", 10) == [theirs]
    assert store.outbox_pending_in(SCOPE, "drop_projection", 10) == []
    assert store.outbox_pending_in(SCOPE, None, 1) == [mine[0]]
    store.outbox_done(mine[1])
    assert store.outbox_pending_in(SCOPE, "upsert_projection", 10) == []
    assert store.outbox_pending_in(other, "upsert_projection", 10) == [theirs]


# --------------------------------------------------------------------------------------------
# The engine over the AWS adapter set
# --------------------------------------------------------------------------------------------


def test_no_request_path_scans_the_table(aws: Harness) -> None:
    inject(aws.store.dynamodb, "before-call.dynamodb.Scan", fail_with(AssertionError("Scan")))
    record_id = aws.remember("The staging deploy needs the blue flag.")
    assert aws.search("staging deploy")["records"][0]["record"]["record_id"] == record_id
    assert aws.get(record_id)["ok"]
    captured = aws.capture("A draft to withdraw.", key="withdraw-capture-01")
    assert aws.withdraw(captured["candidate_id"])["ok"]
    assert aws.forget(record_id)["output"]["value"]["projection_invalidation"] == "complete"
    assert aws.engine.drain_outbox() == 0


def test_two_engines_over_one_store_keep_cursors_dense(aws: Harness) -> None:
    """Two processes' engines: the in-process scope lock no longer serializes them."""
    engines = [aws.engine, another_engine(aws)]

    def capture(i: int) -> dict[str, Any]:
        args = capture_args(f"parallel note {i}", key=f"parallel-key-{i:06d}")
        envelope = handled(engines[i % 2], "capture", args, context())
        assert envelope["ok"], envelope
        value: dict[str, Any] = envelope["output"]["value"]
        return value

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(capture, range(30)))
    assert sorted(int(r["cursor"]) for r in results) == list(range(1, 31))
    assert verify_journal(aws.store, context().scope).cursor == 30


def test_a_refused_commit_during_promotion_changes_nothing_and_the_retry_succeeds(
    aws: Harness,
) -> None:
    captured = aws.capture()
    before = aws.store.table_snapshot()
    remove = inject(
        aws.store.dynamodb,
        "before-call.dynamodb.TransactWriteItems",
        fail_with(client_error("ProvisionedThroughputExceededException")),
    )
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-fault-00001"}
    envelope = aws.call("request_admission", args)
    assert envelope["error"]["code"] == "STORE_UNAVAILABLE" and envelope["error"]["retriable"]
    assert aws.store.table_snapshot() == before
    remove()
    assert aws.ok("request_admission", args)["outcome"]["status"] == "accepted"


def test_an_applied_commit_whose_answer_was_lost_replays_on_retry(aws: Harness) -> None:
    captured = aws.capture()
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-fault-00002"}
    timeout = ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
    remove = inject(
        aws.store.dynamodb, "after-call.dynamodb.TransactWriteItems", fail_with(timeout)
    )
    assert aws.error("request_admission", args) == "MUTATION_OUTCOME_UNKNOWN"
    remove()
    head = aws.store.head(context().scope)
    retry = aws.ok("request_admission", args)
    assert retry["replayed"] is True and retry["outcome"]["status"] == "accepted"
    assert aws.store.head(context().scope) == head  # applied exactly once
    assert aws.get(retry["outcome"]["record_id"])["ok"]


def test_an_unsent_commit_with_an_unknown_outcome_executes_once_on_retry(aws: Harness) -> None:
    timeout = ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
    remove = inject(
        aws.store.dynamodb, "before-call.dynamodb.TransactWriteItems", fail_with(timeout)
    )
    assert aws.error("capture", capture_args()) == "MUTATION_OUTCOME_UNKNOWN"
    remove()
    assert aws.store.head(context().scope).cursor == 0
    retry = aws.ok("capture", capture_args())
    assert retry["status"] == "committed_pending" and retry["cursor"] == "1"
    assert aws.ok("capture", capture_args())["status"] == "duplicate_exact"


def _candidate_key_items() -> list[str]:
    items = boto3.client("dynamodb", region_name=REGION).scan(TableName=KEY_TABLE)["Items"]
    return sorted(item["key_ref"]["S"] for item in items if item["key_ref"]["S"].startswith("key_"))


def _fresh_instance(aws: Harness) -> Any:
    """Another Lambda instance: its own vault (nothing remembered of the first attempt)."""
    from engram_memory.adapters.aws.kms_vault import KmsVault

    vault = KmsVault(
        kms_key_id=aws.vault._kms_key_id,
        key_table=KEY_TABLE,
        kms_client=boto3.client("kms", region_name=REGION),
        dynamodb_client=boto3.client("dynamodb", region_name=REGION),
    )
    return dataclasses.replace(aws, engine=another_engine(dataclasses.replace(aws, vault=vault)))


@pytest.mark.parametrize("retried_by", ["the same instance", "another instance"])
def test_a_capture_retried_after_a_timeout_before_its_write_leaves_no_orphan_key(
    aws: Harness, retried_by: str
) -> None:
    """DynamoDB times out before the capture's transaction lands: the first attempt must keep
    its key (the outcome is unknown), and the retry that commits removes it (issue 25, item 9)."""
    timeout = ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")
    remove = inject(
        aws.store.dynamodb, "before-call.dynamodb.TransactWriteItems", fail_with(timeout)
    )
    for attempt in range(2):  # two lost answers in a row: two keys kept, both removed later
        assert aws.error("capture", capture_args()) == "MUTATION_OUTCOME_UNKNOWN", attempt
    remove()
    assert len(_candidate_key_items()) == 2  # each unknown outcome kept its key
    retrier = aws if retried_by == "the same instance" else _fresh_instance(aws)
    value = retrier.ok("capture", capture_args())
    assert value["status"] == "committed_pending"
    row = aws.store.candidate_get(context().scope, value["candidate_id"])
    assert row is not None
    assert _candidate_key_items() == [row.key_ref]  # 0 orphans: only the committed key is held
    assert aws.admit(value["candidate_id"])["outcome"]["status"] == "accepted"  # it opens


def test_a_refused_forget_leaves_the_record_readable(aws: Harness) -> None:
    record_id = aws.remember()
    before = aws.store.table_snapshot()
    remove = inject(
        aws.store.dynamodb,
        "before-call.dynamodb.TransactWriteItems",
        fail_with(client_error("ThrottlingException")),
    )
    assert aws.forget(record_id, key="forget-fault-0001")["error"]["code"] == "STORE_UNAVAILABLE"
    assert aws.store.table_snapshot() == before
    remove()
    assert aws.get(record_id)["ok"]
    assert aws.forget(record_id, key="forget-fault-0001")["ok"]


def test_a_capture_whose_commit_is_refused_leaves_no_orphan_key(aws: Harness) -> None:
    inject(
        aws.store.dynamodb,
        "before-call.dynamodb.TransactWriteItems",
        fail_with(client_error("ThrottlingException")),
    )
    assert aws.error("capture", capture_args()) == "STORE_UNAVAILABLE"
    keys = boto3.client("dynamodb", region_name=REGION).scan(TableName=KEY_TABLE)["Items"]
    assert keys == []  # the key sealed for the refused capture was shredded


def test_a_lagging_index_defers_invalidation_until_the_outbox_drains(aws: Harness) -> None:
    record_id = aws.remember("The VPN gateway lives in eu-west-1.")
    aws.index.available = False
    assert aws.error("search", {"query": "VPN", "purpose_ref": context().purpose_ref}) == (
        "RANKING_UNAVAILABLE"
    )
    value = aws.forget(record_id, key="forget-lagging-01")["output"]["value"]
    assert value["projection_invalidation"] == "pending"
    assert aws.get(record_id)["error"]["code"] == "NOT_FOUND"  # the tombstone is effective now
    assert aws.engine.drain_outbox() == 0
    aws.index.available = True
    assert aws.index.contains(context().scope, record_id)
    assert aws.engine.drain_outbox() == 1
    assert not aws.index.contains(context().scope, record_id)
    replay = aws.forget(record_id, key="forget-lagging-01")["output"]["value"]
    assert replay["projection_invalidation"] == "complete" and replay["coverage_receipt_digest"]


def _backlog(aws: Harness, count: int) -> None:
    """``count`` projection upserts waiting in the scope's outbox (of records that are gone)."""
    scope = context().scope
    items = [
        OutboxItem(f"upsert_projection:lexical:mem_gone{i:04d}", "upsert_projection", scope,
                   f"mem_gone{i:04d}", "lexical")
        for i in range(count)
    ]  # fmt: skip
    for start in range(0, count, 30):  # three items each: 90 of a transaction's 100
        aws.store.commit(
            ChangeSet(
                scope=scope,
                expected_head=aws.store.head(scope),
                ledger=LedgerEntry(
                    "operator", f"seed-backlog-{start:04d}", "seed", None, "h", b"{}", 0
                ),
                outbox=tuple(items[start : start + 30]),
            )
        )


def test_a_backlog_of_projections_past_the_bound_holds_admissions_back(aws: Harness) -> None:
    _backlog(aws, UNPROJECTED_LIMIT + 1)
    captured = aws.capture("The billing service retries failed card charges three times.")
    args = {"candidate_id": captured["candidate_id"], "idempotency_key": "admit-backlog-0001"}
    envelope = aws.call("request_admission", args)
    assert (envelope["error"]["code"], envelope["error"]["retriable"]) == ("PROJECTION_STALE", True)
    row = aws.store.candidate_get(context().scope, captured["candidate_id"])
    assert (row.state, row.held) == ("pending", None)
    assert aws.engine.drain_outbox(limit=200) == UNPROJECTED_LIMIT + 1
    assert aws.ok("request_admission", args)["outcome"]["status"] == "accepted"


def test_an_admission_before_the_index_exists_compares_the_records_on_their_way(
    aws: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    aws.index.writable = False  # the first record's upsert fails: the index is never created
    first = aws.remember("The billing service retries failed card charges three times.")

    def no_index(*_: object) -> list[object]:
        raise IndexMissing("lexical index unavailable: search failed (404)")

    monkeypatch.setattr(aws.index, "search", no_index)
    near = aws.capture("the billing service retries failed card-charges 3 times")
    assert aws.admit(near["candidate_id"])["outcome"]["status"] == "pending_adjudication"
    new = aws.capture("The invoices go out on the first working day of each month.")
    assert aws.admit(new["candidate_id"])["outcome"]["status"] == "accepted"
    assert aws.store.outbox_has(context().scope, "upsert_projection", first)


def test_large_candidates_records_and_outputs_live_in_s3_through_the_engine(
    tmp_path: Path,
) -> None:
    from aws_testing import aws_harness as build

    harness = build(tmp_path, inline_limit_bytes=256)
    try:
        text = "Blob-backed memory: " + " ".join(f"word{i}" for i in range(200))
        record_id = harness.remember(text)
        assert harness.search("word17 memory")["records"][0]["record"]["record_id"] == record_id
        assert harness.get(record_id)["ok"]
        assert len(blob_keys(harness.store)) >= 3  # sealed candidate, record body, outputs
        body = harness.store.record_get(context().scope, record_id).body
        body_blob = hashlib.sha256(body).hexdigest()
        assert any(key.endswith(body_blob) for key in blob_keys(harness.store))
        assert harness.forget(record_id)["ok"]
        assert not any(key.endswith(body_blob) for key in blob_keys(harness.store))  # shredded
        assert harness.store.record_get(context().scope, record_id).body is None
    finally:
        harness.close()


def _noise(length: int, seed: int) -> str:
    # Seeded: 900 KB of random base64 holds a secret-shaped run (a GitLab token prefix and 20
    # characters) about one time in six, which the admission policy rightly rejects.
    return base64.b64encode(random.Random(seed).randbytes(length))[:length].decode()


def test_a_near_mebibyte_capture_is_admitted_and_read_back(aws: Harness) -> None:
    args = capture_args("seed", key="big-capture-00001")
    component = args["payload"]["components"][0]
    args["payload"]["components"] = [
        # Random text: record bodies are deflated before sealing, and a repeated letter would
        # shrink the body below the size that needs a blob.
        {
            **component,
            "component_id": f"component:{i}",
            "text": f"chunk {i} " + _noise(60_000, seed=i),
        }
        for i in range(15)
    ]
    args["payload"]["primary_component_id"] = "component:0"
    captured = aws.ok("capture", args)
    outcome = aws.admit(captured["candidate_id"])["outcome"]
    assert outcome["status"] == "accepted"
    row = aws.store.record_get(context().scope, outcome["record_id"])
    assert row is not None and row.body is not None and len(row.body) > 600_000
    assert len(blob_keys(aws.store)) == 2  # the sealed candidate and the record body


# --------------------------------------------------------------------------------------------
# The in-memory index ranks like the embedded FTS5 index
# --------------------------------------------------------------------------------------------


def test_the_memory_index_scores_like_fts5_bm25(tmp_path: Path) -> None:
    docs = [
        ("mem_a", {"primary": "wal mode store", "decision": "use wal", "citations": "notes"}),
        ("mem_b", {"primary": "store readers writer", "context": "wal wal wal background"}),
        ("mem_c", {"evidence": "benchmark wal store store", "citations": "bench notes"}),
        ("mem_d", {"primary": "unrelated deploy flag", "decision": "staging"}),
        ("mem_e", {"context": "store " * 30}),
        ("mem_f", {"primary": "wal mode store", "decision": "use wal", "citations": "notes"}),
    ]
    sqlite_store = SqliteStore(tmp_path / "fts.db")
    fts = SqliteLexicalIndex(sqlite_store)
    memory = MemoryLexicalIndex()
    for record_id, fields in docs:
        sqlite_store.commit(
            ChangeSet(
                SCOPE,
                sqlite_store.head(SCOPE),
                ledger(f"key-{record_id}-0000000", 0),
                new_record=record(record_id),
            )
        )
        change_ = ProjectionChange(upsert=ProjectionDoc(record_id, fields))
        fts.apply(SCOPE, change_)
        memory.apply(SCOPE, change_)
    for query in (["wal"], ["store"], ["wal", "store"], ["staging", "notes"], ["nothing"]):
        expected = fts.search(SCOPE, query, 10)
        got = memory.search(SCOPE, query, 10)
        assert [h.record_id for h in got] == [h.record_id for h in expected], query
        for mine, theirs in zip(got, expected, strict=True):
            assert math.isclose(mine.score, theirs.score, rel_tol=1e-9, abs_tol=1e-12), query
    assert [h.record_id for h in memory.search(SCOPE, ["wal"], 2)] == [
        h.record_id for h in fts.search(SCOPE, ["wal"], 2)
    ]
    assert memory.search(Scope("t", "w"), ["wal"], 10) == []
    memory.apply(SCOPE, ProjectionChange(delete_record_id="mem_a"))
    assert not memory.contains(SCOPE, "mem_a") and memory.contains(SCOPE, "mem_b")
    memory.available = False
    with pytest.raises(Exception, match="unavailable"):
        memory.search(SCOPE, ["wal"], 10)
    sqlite_store.close()
    assert set(lexical.FIELD_WEIGHTS) >= {name for _, f in docs for name in f}


# --------------------------------------------------------------------------------------------
# Revocations: a short cache of "not revoked" per function container
# --------------------------------------------------------------------------------------------


def test_another_container_sees_a_revocation_once_its_short_cache_lapses(
    store: DynamoStore,
) -> None:
    tenant = SCOPE.tenant_id
    warm = DynamoStore(  # a container whose "not revoked" is still fresh
        table_name=store.table_name,
        bucket=store.bucket,
        dynamodb=store.dynamodb,
        s3=store.s3,
        revocation_cache_s=3_600,
    )
    uncached = DynamoStore(
        table_name=store.table_name,
        bucket=store.bucket,
        dynamodb=store.dynamodb,
        s3=store.s3,
        revocation_cache_s=0,
    )
    reads: list[str] = []
    inject(store.dynamodb, "before-call.dynamodb.BatchGetItem", lambda **_: reads.append("read"))
    for container in (warm, uncached):
        assert not container.credential_revoked(tenant, "jti-1", "agent-alice", 1_000)
    assert not warm.credential_revoked(tenant, "jti-1", "agent-alice", 1_000)
    assert len(reads) == 2  # the warm container trusted its "no" for the second call
    store.revoke_credentials(tenant, "token", "jti-1", 2_000)  # the operator, elsewhere
    assert uncached.credential_revoked(tenant, "jti-1", "agent-alice", 1_000)
    assert not warm.credential_revoked(tenant, "jti-1", "agent-alice", 1_000)  # within its cache
    fresh = DynamoStore(
        table_name=store.table_name, bucket=store.bucket, dynamodb=store.dynamodb, s3=store.s3
    )
    assert fresh.credential_revoked(tenant, "jti-1", "agent-alice", 1_000)
    reads.clear()
    assert fresh.credential_revoked(tenant, "jti-1", "agent-alice", 1_000)
    assert reads == []  # "revoked" is kept: a revocation is never lifted


class _CountingSession:
    """A boto3 session that hands out markers and counts what it made."""

    def __init__(self) -> None:
        self.made: list[tuple[str, Any]] = []
        self.clients: dict[str, object] = {}

    def client(self, service: str, config: Any = None) -> Any:
        self.made.append((service, config))
        return self.clients.setdefault(service, object())


def test_clients_not_given_are_made_from_one_session_on_first_use_once() -> None:
    session = _CountingSession()
    store = DynamoStore(table_name=TABLE, bucket=BUCKET, session=session)  # type: ignore[arg-type]
    assert session.made == []
    assert store.dynamodb is store.dynamodb is session.clients["dynamodb"]
    assert store.s3 is store.s3 is session.clients["s3"]
    assert [service for service, _ in session.made] == ["dynamodb", "s3"]
    assert all(config.connect_timeout == CONNECT_TIMEOUT_S for _, config in session.made)


def test_clients_given_are_used_as_they_are() -> None:
    dynamodb, s3 = object(), object()
    store = DynamoStore(table_name=TABLE, bucket=BUCKET, dynamodb=dynamodb, s3=s3)  # type: ignore[arg-type]
    assert store.dynamodb is dynamodb and store.s3 is s3

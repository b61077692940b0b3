"""The admission crash drill (issue 35): a held admission survives a kill, replays as held and is
never accepted without the operator, on both adapter sets.

Each step of the agent's work runs in its own process (``admission_crash_node.py``) over state
that outlives it: the embedded data directory, or DynamoDB, S3 and KMS in a moto server with the
lexical index in a file (an OpenSearch domain outlives the functions that write to it). The
first process remembers a fact and is killed (SIGKILL) right after the admission's commit: in
the cloud its projection upsert never ran, so the index does not hold the record (the index is
behind, as after the kill-storm's restarts) and its upsert waits in the outbox; the embedded
index is written in the commit itself. Three near-duplicates are captured, and the admission of
each is killed at one point: before its commit, after its commit before the answer, after the
answer. Then, in a fresh engine, before the outbox is drained:

- the same key answers the hold (``replayed: true`` when the hold had committed; decided now,
  and held, when the kill came before it), and the hold wrote no journal event;
- a new key answers ``pending_adjudication`` quoting the stored decision;
- nothing is accepted until the operator adjudicates; draining the outbox changes none of it.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from admission_crash_node import KILLS, node
from aws_testing import BUCKET, KEY_TABLE, REGION, TABLE

from engram_memory.adapters.aws.dynamo_store import create_bucket, create_tables
from engram_memory.adapters.aws.kms_vault import create_key_table
from engram_memory.operator_plane.decisions import adjudicate

from engram_testing import context, killed_child

HERE = Path(__file__).resolve().parent
NODE = HERE / "admission_crash_node.py"


@contextmanager
def _moto_server(state: Path) -> Iterator[None]:
    """DynamoDB, S3 and KMS in a moto server of this process, which outlives every node."""
    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        session = boto3.session.Session(
            region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
        )
        dynamodb = session.client("dynamodb", endpoint_url=url)
        create_tables(dynamodb, TABLE)
        create_key_table(dynamodb, KEY_TABLE)
        create_bucket(session.client("s3", endpoint_url=url), BUCKET, REGION)
        key = session.client("kms", endpoint_url=url).create_key(Description="drill data keys")
        endpoint = {"url": url, "key_arn": key["KeyMetadata"]["Arn"]}
        (state / "endpoint.json").write_text(json.dumps(endpoint))
        yield
    finally:
        server.stop()


@pytest.fixture(params=["embedded", "aws"])
def drill(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An adapter set and the folder of its state."""
    state = tmp_path / "state"
    state.mkdir()
    if request.param == "embedded":
        yield "embedded", state
        return
    with _moto_server(state):
        yield "aws", state


def _killed(adapter: str, state: Path, *step: str) -> list[dict[str, Any]]:
    """Run one step in a process of its own; it always ends killed. The answers it printed."""
    aws = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    argv = [str(NODE), adapter, str(state), *step]
    return [json.loads(line) for line in killed_child(argv, paths=[HERE], env=aws)]


def _admission(engine: Any, key: str, admit_key: str) -> dict[str, Any]:
    captured = engine.handle("capture", _capture(key), context())["output"]["value"]
    arguments = {"candidate_id": captured["candidate_id"], "idempotency_key": admit_key}
    envelope = engine.handle("request_admission", arguments, context())
    assert envelope["ok"], envelope
    value: dict[str, Any] = envelope["output"]["value"]
    return value


def _capture(key: str) -> dict[str, Any]:
    from admission_crash_node import NEAR

    from engram_testing import capture_args

    return capture_args(NEAR, key=key)


def test_a_held_admission_killed_anywhere_replays_as_held_until_the_operator_decides(
    drill: tuple[str, Path],
) -> None:
    adapter, state = drill
    (captured,) = _killed(adapter, state, "remember")  # the fact's admission: no answer
    assert captured["ok"]
    keys = {kill: f"drill-near-{kill}" for kill in KILLS}
    for key in keys.values():
        assert _killed(adapter, state, "capture", key)[0]["output"]["value"]["status"] == (
            "committed_pending"
        )
    answered = {kill: _killed(adapter, state, "admit", keys[kill], kill) for kill in KILLS}
    assert answered["before-commit"] == answered["after-commit"] == []
    (after_answer,) = answered["after-answer"]
    assert after_answer["output"]["value"]["outcome"]["status"] == "pending_adjudication"

    fresh = node(adapter, state)
    try:
        _assert_held_until_the_operator(adapter, fresh, keys, after_answer["output"]["value"])
    finally:
        fresh.close()


def _assert_held_until_the_operator(
    adapter: str, fresh: Any, keys: dict[str, str], first_answer: dict[str, Any]
) -> None:
    scope = context().scope
    fact_id = _fact_record(fresh)
    if adapter == "aws":  # the index is behind: the fact waits in the outbox
        assert not fresh.index.contains(scope, fact_id)
        assert fresh.store.outbox_has(scope, "upsert_projection", fact_id)
    head = fresh.store.head(scope)
    holds: dict[str, dict[str, Any]] = {}
    for kill, key in keys.items():
        retried = _admission(fresh.engine, key, "admit:" + key)
        assert retried["outcome"]["status"] == "pending_adjudication", kill
        assert retried["replayed"] is (kill != "before-commit"), kill
        if kill == "after-answer":
            assert retried == {**first_answer, "replayed": True}
        holds[kill] = retried["outcome"]
    assert fresh.store.head(scope) == head  # no hold wrote a journal event
    fresh.engine.drain_outbox()
    for kill, key in keys.items():
        again = _admission(fresh.engine, key, "admit:" + key)
        assert again == {"outcome": holds[kill], "replayed": True}
        other = _admission(fresh.engine, key, f"admit-again:{key}")
        assert other["outcome"]["status"] == "pending_adjudication" and not other["replayed"]
        assert other["outcome"]["decision_receipt_digest"] == holds[kill]["decision_receipt_digest"]
        candidate = fresh.store.candidate_get(scope, holds[kill]["candidate_id"])
        assert (candidate.state, candidate.held) == (
            "pending",
            holds[kill]["decision_receipt_digest"],
        )
        assert fresh.store.record_get(scope, candidate.record_id) is None  # never accepted
    chosen = holds["after-commit"]["candidate_id"]
    accepted = adjudicate(fresh.engine, scope, chosen, "accept", "ops-drill", reason="checked")
    assert accepted["status"] == "accepted"  # by the operator, and only that one
    still_held = {
        kill: fresh.store.candidate_get(scope, hold["candidate_id"]).held is not None
        for kill, hold in holds.items()
    }
    assert still_held == {"before-commit": True, "after-commit": False, "after-answer": True}


def _fact_record(fresh: Any) -> str:
    """The remembered fact's record, admitted though its answer was lost with the process (read
    from the store: a replay of its admission would run the upsert still pending)."""
    candidate = fresh.store.candidate_get(context().scope, _fact_candidate(fresh))
    assert candidate.state == "admitted"
    record = fresh.store.record_get(context().scope, candidate.record_id)
    assert record.state == "accepted_current"
    record_id: str = record.record_id
    return record_id


def _fact_candidate(fresh: Any) -> str:
    from admission_crash_node import FACT

    from engram_testing import capture_args

    arguments = capture_args(FACT, key="drill-capture-fact-01")
    replay = fresh.engine.handle("capture", arguments, context())
    candidate_id: str = replay["output"]["value"]["candidate_id"]
    return candidate_id

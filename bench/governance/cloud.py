"""The forgetting run's cloud column: the engine over the AWS adapters on moto.

The engine runs over ``DynamoStore`` (canonical table and blob bucket), ``KmsVault`` and
``KmsRecordKeys`` (the key table, KMS) on moto in this process, and the tests' in-memory BM25F
index standing in for the OpenSearch projection (``tests/aws_testing.py``: not maintained by the
store, so projection upserts and drops take the cloud's deferred path, through the outbox). A
scripted person approves each forget and withdraw. No MCP transport, no Lambda, no Step
Functions: what is measured is what the adapters keep. Channels after forget and withdraw:

- ``search``, ``get``: the engine's tools;
- ``canonical_table``: the bytes of every item of the canonical table and every object of the
  blob bucket (``DynamoStore.table_snapshot``);
- ``key_table``: the forgotten records whose key item (``record:<hash>``) is still there;
- ``projection``: canaries whose words or record ids the OpenSearch stand-in still holds;
- ``table_copy_plaintext``: the bytes of a table snapshot taken before the forget (what
  point-in-time recovery or a table export holds); ``table_copy_with_live_keys``: the forgotten
  records of that copy whose key could still be read from today's key table.

``cleared_ms``: from the first forget until the stand-in index holds none of the forgotten
records (the outbox drained after each forget, as the forget workflow's tail does).
OpenSearch's own automated snapshots are outside this run (operating.md says what they keep).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.governance.admission import Item, capture_arguments
from bench.governance.canaries import Canary, canaries, found_in_text

ROOT = Path(__file__).resolve().parents[2]
# The channels that could hold a withdrawn candidate too (the others only ever held records).
EVERY_CANARY = ("canonical_table", "table_copy_plaintext")


def _harness(work: Path) -> Any:
    if str(ROOT / "tests") not in sys.path:  # the tests' moto helpers and the index stand-in
        sys.path.insert(0, str(ROOT / "tests"))
    from aws_testing import aws_harness

    return aws_harness(work)


def _arguments(canary: Canary) -> dict[str, Any]:
    arguments = capture_arguments(Item(canary.key, "canary", canary.text))
    arguments["idempotency_key"] = f"governance-cloud-{canary.key}"
    arguments["payload"]["purpose_ref"] = _purpose()
    return arguments


def _purpose() -> str:
    from engram_testing import PURPOSE

    purpose: str = PURPOSE
    return purpose


def _text_of(snapshot: dict[str, list[tuple[Any, ...]]]) -> str:
    return repr(snapshot).lower()


def _projection_holds(index: Any, among: Sequence[Canary], records: dict[str, str]) -> set[str]:
    held = repr(index._docs).lower() + repr(index._vectors)  # the stand-in's whole state
    return {
        c.key
        for c in among
        if found_in_text(held, [c]) or (c.key in records and records[c.key] in held)
    }


def _key_items(harness: Any, records: dict[str, str]) -> set[str]:
    """The canaries whose record key item the key table still holds."""
    import boto3
    from aws_testing import KEY_TABLE, REGION

    from engram_memory.adapters.aws.kms_record_keys import record_item_key

    from engram_testing import context

    client = boto3.client("dynamodb", region_name=REGION)
    items = repr(client.scan(TableName=KEY_TABLE, ConsistentRead=True)["Items"])
    scope = context().scope
    return {key for key, record_id in records.items() if record_item_key(scope, record_id) in items}


def _searched(harness: Any, among: Sequence[Canary]) -> set[str]:
    return {
        c.key
        for c in among
        for word in c.words
        if found_in_text(str(harness.search(word)["records"]), [c])
    }


def _value(envelope: dict[str, Any]) -> dict[str, Any]:
    assert envelope["ok"], envelope
    value: dict[str, Any] = envelope["output"]["value"]
    return value


def _forget(harness: Any, records: dict[str, str], pending: dict[str, str]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    first = time.monotonic()
    for key, record_id in records.items():
        value = _value(harness.forget(record_id, key=f"governance-cloud-forget-{key}"))
        state = f"projection_invalidation:{value['projection_invalidation']}"
        answers[state] = answers.get(state, 0) + 1
        harness.engine.drain_outbox()  # the forget workflow's tail, or the drainer
    answers["cleared_ms"] = round((time.monotonic() - first) * 1000, 1)
    for key, candidate_id in pending.items():
        value = _value(harness.withdraw(candidate_id, key=f"governance-cloud-withdraw-{key}"))
        state = f"key_destruction:{value['key_destruction']}"
        answers[state] = answers.get(state, 0) + 1
    return answers


def run(count: int, work: Path) -> dict[str, Any]:
    """The cloud forgetting run over the same canaries as ``forgetting.run``."""
    everything = canaries(count, "forget")
    kept, dropped = everything[: count // 2], everything[count // 2 :]
    harness = _harness(work)
    try:
        records = {c.key: _remember(harness, c) for c in kept}
        pending = {c.key: harness.ok("capture", _arguments(c))["candidate_id"] for c in dropped}
        harness.engine.drain_outbox()
        controls = {
            "search": len(_searched(harness, kept)),
            "projection": len(_projection_holds(harness.index, kept, records)),
            "key_table": len(_key_items(harness, records)),
        }
        before = harness.store.table_snapshot()
        answers = _forget(harness, records, pending)
        found = {
            "search": _searched(harness, everything),
            "get": {k for k, r in records.items() if harness.get(r)["ok"]},
            "canonical_table": found_in_text(_text_of(harness.store.table_snapshot()), everything),
            "key_table": _key_items(harness, records),
            "projection": _projection_holds(harness.index, everything, records),
            "table_copy_plaintext": found_in_text(_text_of(before), everything),
        }
        found["table_copy_with_live_keys"] = found["key_table"]  # the copy opens only with them
    finally:
        harness.close()
    return {
        "canaries": count,
        "forgotten": len(records),
        "withdrawn": len(pending),
        "controls_before_forget": controls,
        "cleared_ms": answers.pop("cleared_ms"),
        "answers": answers,
        "channels": {
            name: {
                "found": len(keys),
                "of": count if name in EVERY_CANARY else len(records),
                "keys": sorted(keys),
            }
            for name, keys in found.items()
        },
    }


def _remember(harness: Any, canary: Canary) -> str:
    candidate_id = harness.ok("capture", _arguments(canary))["candidate_id"]
    admitted = harness.ok(
        "request_admission",
        {"candidate_id": candidate_id, "idempotency_key": f"governance-cloud-admit-{canary.key}"},
    )
    outcome = admitted["outcome"]
    assert outcome["status"] == "accepted", (canary.key, outcome)
    record_id: str = outcome["record_id"]
    return record_id

"""One process of the admission crash drill (``test_admission_crashes.py``): an engine over an
adapter set whose state outlives the process, and a way to die (SIGKILL) at a point of a commit.

As a program it runs one step of an agent's work and prints one JSON line per answer::

    python admission_crash_node.py ADAPTER STATE STEP [KEY] [KILL_AT]

``ADAPTER`` is ``embedded`` (``STATE``: the data directory, ``open_embedded``) or ``aws``
(``STATE``: a folder with ``endpoint.json``, the moto server's URL and KMS key, and
``index.json``, the lexical index as a file: an OpenSearch domain outlives a function). ``STEP``:

- ``remember``: capture ``FACT`` and ask for its admission, killed right after the admission's
  commit (in the cloud before its projection upsert ran: the record is in the store, its upsert
  in the outbox, the index does not hold it);
- ``capture``: capture ``NEAR`` under ``KEY`` (a near-duplicate of ``FACT``);
- ``admit``: ask for the admission of the candidate captured under ``KEY`` with the key
  ``admit:KEY``, killed at ``KILL_AT``: ``before-commit`` (nothing sent or begun),
  ``after-commit`` (applied, not answered) or ``after-answer`` (answered, then killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_testing import BUCKET, KEY_TABLE, REGION, TABLE, MemoryLexicalIndex

from engram_memory.engine.context import Scope
from engram_memory.engine.ports import ProjectionChange

FACT = "The billing service retries failed card charges three times, an hour apart."
NEAR = "the billing service retries failed card-charges 3 times, an hour apart"
KILLS = ("before-commit", "after-commit", "after-answer")
_SQLITE_STEPS = {"before-commit": "begin", "after-commit": "after_commit"}
_DYNAMODB_EVENTS = {
    "before-commit": "before-call.dynamodb.TransactWriteItems",
    "after-commit": "after-call.dynamodb.TransactWriteItems",
}


@dataclass
class Node:
    """An engine over the drill's state, and how to make this process die in its next commit."""

    engine: Any
    store: Any
    index: Any
    arm: Callable[[str], None]
    close: Callable[[], None]


def die(*_: Any, **__: Any) -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def embedded_node(data_dir: Path) -> Node:
    from engram_memory.embedded.composition import open_embedded

    host = open_embedded(data_dir)

    def arm(kill_at: str) -> None:
        step = _SQLITE_STEPS.get(kill_at)
        if step is not None:
            host.store.set_fault_hook(lambda reached: die() if reached == step else None)

    return Node(host.engine, host.store, host.engine.lexical, arm, host.close)


def aws_node(state: Path) -> Node:
    import boto3

    from engram_memory.adapters.aws.dynamo_store import DynamoStore
    from engram_memory.adapters.aws.kms_record_keys import KmsRecordKeys
    from engram_memory.adapters.aws.kms_vault import KmsVault
    from engram_memory.adapters.local.audit import MemoryAuditLog
    from engram_memory.engine.service import Engine, EngineSettings
    from engram_memory.policy.builtin import BuiltinAdmissionPolicy

    from engram_testing import FakeClock

    endpoint = json.loads((state / "endpoint.json").read_text())
    session = boto3.session.Session(
        region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing"
    )

    def client(service: str) -> Any:
        return session.client(service, endpoint_url=endpoint["url"])  # type: ignore[call-overload]

    store = DynamoStore(
        table_name=TABLE, bucket=BUCKET, dynamodb=client("dynamodb"), s3=client("s3")
    )
    keys = {"kms_key_id": endpoint["key_arn"], "key_table": KEY_TABLE}
    kms, key_items = client("kms"), client("dynamodb")  # the store's own client is the armed one
    index = FileIndex(state / "index.json")
    engine = Engine(
        store=store,
        vault=KmsVault(**keys, kms_client=kms, dynamodb_client=key_items),
        record_keys=KmsRecordKeys(**keys, kms_client=kms, dynamodb_client=key_items),
        lexical_index=index,
        admission_policy=BuiltinAdmissionPolicy(),
        clock=FakeClock(),
        audit=MemoryAuditLog(),
        settings=EngineSettings(cursor_key=b"\x01" * 32),
    )

    def arm(kill_at: str) -> None:
        event = _DYNAMODB_EVENTS.get(kill_at)
        if event is not None:
            store.dynamodb.meta.events.register(event, die)

    return Node(engine, store, index, arm, lambda: None)


class FileIndex(MemoryLexicalIndex):
    """The in-memory index kept in a file after every write: the drill's stand-in for an
    OpenSearch domain, which outlives the functions that write to it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        if path.exists():
            for (tenant_id, workspace_id), docs in json.loads(path.read_text()):
                self._docs[Scope(tenant_id, workspace_id)] = docs

    def apply(self, scope: Scope, change: ProjectionChange) -> None:
        super().apply(scope, change)
        saved = [[[s.tenant_id, s.workspace_id], docs] for s, docs in self._docs.items()]
        self.path.write_text(json.dumps(saved))


def node(adapter: str, state: Path) -> Node:
    return embedded_node(state) if adapter == "embedded" else aws_node(state)


def _answer(envelope: Any) -> None:
    print(json.dumps(envelope, sort_keys=True), flush=True)


def main(adapter: str, state: Path, step: str, key: str = "", kill_at: str = "") -> None:
    from engram_testing import capture_args, context

    here = node(adapter, state)
    engine, ctx = here.engine, context()
    if step == "remember":
        captured = engine.handle("capture", capture_args(FACT, key="drill-capture-fact-01"), ctx)
        _answer(captured)
        here.arm("after-commit")
        candidate_id = captured["output"]["value"]["candidate_id"]
        arguments = {"candidate_id": candidate_id, "idempotency_key": "drill-admit-fact-0001"}
        _answer(engine.handle("request_admission", arguments, ctx))
    elif step == "capture":
        _answer(engine.handle("capture", capture_args(NEAR, key=key), ctx))
    else:
        captured = engine.handle("capture", capture_args(NEAR, key=key), ctx)  # a replay
        candidate_id = captured["output"]["value"]["candidate_id"]
        here.arm(kill_at)
        arguments = {"candidate_id": candidate_id, "idempotency_key": "admit:" + key}
        _answer(engine.handle("request_admission", arguments, ctx))
    die()  # every step ends killed: nothing closed, nothing flushed by Python


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])

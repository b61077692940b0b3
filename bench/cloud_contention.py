"""Concurrent writers in one workspace on the cloud adapters (DynamoDB, S3 and KMS on moto).

    python -m bench.cloud_contention [--writers 1,5,10,25,50] [--rounds 2] [--deadline-ms 30000]
                                     [--json PATH]

Each writer stands for one Lambda instance: its own ``Engine`` (so the in-process scope lock
does not serialize it against the others), all sharing one moto backend and one workspace. A
writer runs ``rounds`` times capture then request_admission, each call with a deadline
``deadline_ms`` after it starts (what a Lambda's remaining time gives a tool call). Reported per
writer count:

- ``calls``, ``ok`` and ``failed_share`` (the share of calls that did not answer ``ok``);
- ``codes``: the calls by outcome code (``OK`` or the contract error code);
- ``conflicts_per_success``: commit attempts refused for contention (a moved journal head, or a
  DynamoDB ``TransactionConflict`` cancellation) per successful call (a retry whose head moved
  while it was building is caught by a head read and sends no transaction: not counted);
- ``wall_s`` and the calls' ``p50_ms`` / ``p95_ms`` latency.

moto serializes its requests (as ``tests/aws_testing.py`` does: moto applies a transaction item
by item), so contention shows up as head conflicts, never as ``TransactionConflict``; real
DynamoDB reports both. Each row runs on a fresh moto backend. moto copies the whole table for
each item of a transaction and serializes every request, so moto itself is the bottleneck at
high writer counts: latencies say little about DynamoDB, outcome shares are the point. Times
depend on the machine and its load: compare rows within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import boto3
from moto import mock_aws
from moto.core.botocore_stubber import BotocoreStubber

from bench.in_process import envelope
from bench.output import markdown_table
from engram_memory.adapters.aws.dynamo_store import DynamoStore, create_bucket, create_tables
from engram_memory.adapters.aws.kms_record_keys import KmsRecordKeys
from engram_memory.adapters.aws.kms_vault import KmsVault, create_key_table
from engram_memory.adapters.clock import SystemClock
from engram_memory.adapters.local.audit import MemoryAuditLog
from engram_memory.embedded.tour import TOUR_PURPOSE, capture_args
from engram_memory.engine.context import TrustedContext
from engram_memory.engine.ports import ChangeSet, CommitConflict
from engram_memory.engine.service import Engine, EngineSettings, new_audit_id
from engram_memory.policy.builtin import BuiltinAdmissionPolicy

REGION = "us-east-1"
TABLE = "engram-canonical"
BUCKET = "engram-blobs"
KEY_TABLE = "engram-keys"
WRITER_COUNTS = (1, 5, 10, 25, 50)

_MOTO_LOCK = threading.RLock()


@contextmanager
def serialized_moto() -> Iterator[None]:
    """moto with its requests serialized: real DynamoDB transactions are serializable, moto's
    are only when one request runs at a time."""
    original = BotocoreStubber.process_request

    def serialized(self: BotocoreStubber, request: Any) -> Any:
        with _MOTO_LOCK:
            return original(self, request)

    with mock_aws(), mock.patch.object(BotocoreStubber, "process_request", serialized):
        yield


class CountingStore:
    """A ``Store`` that counts the commits refused for contention (and passes everything on)."""

    def __init__(self, store: DynamoStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self.conflicts = 0

    def commit(self, changes: ChangeSet) -> None:
        try:
            self._store.commit(changes)
        except CommitConflict as conflict:
            if conflict.reason == "head":
                with self._lock:
                    self.conflicts += 1
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@dataclass
class Row:
    writers: int
    calls: int
    ok: int
    failed_share: float
    conflicts_per_success: float
    wall_s: float
    p50_ms: float
    p95_ms: float
    codes: dict[str, int] = field(default_factory=dict)


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def run_writers(
    writers: int,
    *,
    rounds: int,
    deadline_ms: int,
    workspace: str,
    store: DynamoStore,
    vault: Any,
    record_keys: Any,
) -> Row:
    """``writers`` engines writing concurrently into ``workspace``; one row of the table."""
    counting = CountingStore(store)
    clock = SystemClock()
    engines = [_engine(counting, vault, record_keys, clock) for _ in range(writers)]
    codes: Counter[str] = Counter()
    latencies: list[float] = []
    guard = threading.Lock()
    start = threading.Barrier(writers)

    def call(engine: Engine, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        ctx = TrustedContext(
            tenant_id="tenant-bench",
            workspace_id=workspace,
            principal="principal:bench",
            purpose_ref=TOUR_PURPOSE,
            audit_id=new_audit_id(),
            deadline_ms=clock.now_ms() + deadline_ms,
        )
        began = time.perf_counter()
        handled = engine.handle(tool, arguments, ctx)
        elapsed = (time.perf_counter() - began) * 1000
        answer = envelope(handled)
        code = "OK" if answer["ok"] else str(answer["error"]["code"])
        with guard:
            codes[code] += 1
            latencies.append(elapsed)
        return answer

    def writer(index: int) -> None:
        engine = engines[index]
        start.wait()
        for round_ in range(rounds):
            key = f"bench-{workspace}-{index:03d}-{round_:03d}"
            text = f"Writer {index} notes decision {round_} for the shared workspace."
            captured = call(engine, "capture", capture_args(text, key, clock.now_ms()))
            if not captured["ok"]:
                continue
            candidate_id = captured["output"]["value"]["candidate_id"]
            call(
                engine,
                "request_admission",
                {"candidate_id": candidate_id, "idempotency_key": key + "-admit"},
            )

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=writers) as pool:
        list(pool.map(writer, range(writers)))
    wall = time.perf_counter() - began
    return _row(writers, codes, latencies, counting.conflicts, wall)


def _engine(store: CountingStore, vault: Any, record_keys: Any, clock: SystemClock) -> Engine:
    """One writer's engine (one Lambda instance) over the shared, counting store."""
    return Engine(
        store=store,  # a pass-through proxy of the Store port
        vault=vault,
        record_keys=record_keys,
        lexical_index=_NullIndex(),
        admission_policy=BuiltinAdmissionPolicy(),
        clock=clock,
        audit=MemoryAuditLog(),
        settings=EngineSettings(cursor_key=b"\x01" * 32),
    )


def _row(
    writers: int, codes: Counter[str], latencies: list[float], conflicts: int, wall: float
) -> Row:
    calls = sum(codes.values())
    ok = codes.get("OK", 0)
    return Row(
        writers=writers,
        calls=calls,
        ok=ok,
        failed_share=round((calls - ok) / calls, 4) if calls else 0.0,
        conflicts_per_success=round(conflicts / ok, 3) if ok else float("inf"),
        wall_s=round(wall, 2),
        p50_ms=round(statistics.median(latencies), 1) if latencies else 0.0,
        p95_ms=round(_percentile(latencies, 0.95), 1),
        codes=dict(sorted(codes.items())),
    )


class _NullIndex:
    """A projection that holds nothing: the bench measures the canonical store's commits."""

    name = "lexical"
    maintained_by_store = True  # nothing deferred: no upsert or drop work after the commit
    scoring_formula_ref = "none"

    def apply(self, scope: Any, change: Any) -> None:
        return None

    def contains(self, scope: Any, record_id: str) -> bool:
        return False

    def search(self, scope: Any, terms: Sequence[str], depth: int) -> list[Any]:
        return []


def run(writer_counts: Sequence[int], *, rounds: int, deadline_ms: int) -> list[Row]:
    """One row per writer count, each on a fresh moto backend: moto copies a whole table for
    every item of a transaction, so a table grown by earlier rows would slow later ones."""
    rows = []
    for writers in writer_counts:
        with serialized_moto():
            session = boto3.session.Session(region_name=REGION)
            dynamodb, s3 = session.client("dynamodb"), session.client("s3")
            kms = session.client("kms")
            create_tables(dynamodb, TABLE)
            create_bucket(s3, BUCKET, REGION)
            create_key_table(dynamodb, KEY_TABLE)
            key_arn = kms.create_key(Description="bench data keys")["KeyMetadata"]["Arn"]
            store = DynamoStore(table_name=TABLE, bucket=BUCKET, dynamodb=dynamodb, s3=s3)
            vault = KmsVault(
                kms_key_id=key_arn, key_table=KEY_TABLE, kms_client=kms, dynamodb_client=dynamodb
            )
            record_keys = KmsRecordKeys(
                kms_key_id=key_arn, key_table=KEY_TABLE, kms_client=kms, dynamodb_client=dynamodb
            )
            rows.append(
                run_writers(
                    writers,
                    rounds=rounds,
                    deadline_ms=deadline_ms,
                    workspace="workspace-shared",
                    store=store,
                    vault=vault,
                    record_keys=record_keys,
                )
            )
    return rows


def table(rows: Sequence[Row]) -> str:
    columns = [(heading, "r") for heading in ("writers", "calls", "ok", "failed share")]
    columns += [(heading, "r") for heading in ("conflicts / success", "p50 ms", "p95 ms", "wall s")]
    columns.append(("outcomes", "l"))
    return markdown_table(
        columns,
        (
            (
                r.writers,
                r.calls,
                r.ok,
                f"{r.failed_share:.1%}",
                r.conflicts_per_success,
                r.p50_ms,
                r.p95_ms,
                r.wall_s,
                ", ".join(f"{code} {count}" for code, count in r.codes.items()),
            )
            for r in rows
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cloud_contention")
    parser.add_argument("--writers", default=",".join(map(str, WRITER_COUNTS)))
    parser.add_argument("--rounds", type=int, default=2, help="capture+admission pairs per writer")
    parser.add_argument("--deadline-ms", type=int, default=30_000, help="each call's deadline")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    counts = [int(part) for part in args.writers.split(",") if part.strip()]
    rows = run(counts, rounds=args.rounds, deadline_ms=args.deadline_ms)
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Backup and restore of a deployed stack: ``engram-memory admin --stack NAME backup|restore``.

**Backup** is a DynamoDB export of the canonical table (``ExportTableToPointInTime``: a
consistent copy as of one instant, read from the point-in-time recovery log, no table capacity
used) to ``s3://<the stack's blob bucket>/backups/<id>/`` (or ``--to s3://bucket/prefix``), plus
a copy of the S3 blobs its items reference (bodies above the item limit) and a manifest,
``engram-backup.json``. Never in a backup: the key table (it has no PITR and is never exported:
forgetting destroys keys for good) and the OpenSearch projection (derived data). The export is
checked as a restore would check it before the command answers.

**Restore** reads a backup (``--from s3://bucket/prefix``) and checks it before it touches the
target (``BACKUP_INVALID``: no manifest, an unreadable export, a broken hash chain or cursor gap
in any scope's journal, a record whose body does not hash to its digest). It refuses
(``RESTORE_REFUSED``) a target stack whose table already holds memories, of another tenant, or
whose key store is not the backup's own (a new stack has its own key table and data key:
``--new-keys`` restores the records there deliberately; pending candidates will not open). Then
it copies the blobs, writes the items (the journal heads last: a run interrupted before them
leaves a table that still counts as empty, and running it again finishes it), verifies every
journal on the target, and rebuilds the projections through the outbox drainer function's
reindex (``drainer.ReindexRequest``, one per workspace), the one role OpenSearch maps to write.

The target table is the stack's own (CloudFormation owns it), so a restore writes items with
``BatchWriteItem``: DynamoDB's ``ImportTable`` only creates new tables.

What moto (the tests' AWS) supports: ``ExportTableToPointInTime`` and ``DescribeExport`` (it
writes the DynamoDB JSON data files, gzip, without the manifest files real exports add; this
module reads only the data files, found by listing the export's prefix), everything else used
here is plain S3 and DynamoDB.
"""

from __future__ import annotations

import base64
import gzip
import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from engram_memory.cloud.operator_session import OperatorSession
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.context import Scope
from engram_memory.engine.journal import EMPTY_HEAD, verify_journal
from engram_memory.engine.ports import JournalEvent, JournalHead, RecordKeys
from engram_memory.operator_plane.auditing import audited
from engram_memory.operator_plane.backup_checks import OperationRefused, check_record_bodies

__all__ = ["OperationRefused", "backup_stack", "restore_stack"]

MANIFEST: Final = "engram-backup.json"
FORMAT: Final = "engram-memory/cloud-backup/1"
EXPORT_POLL_S: Final = 5.0
EXPORT_WAIT_S: Final = 3600.0  # a large table's export takes minutes; give up after an hour
_BATCH_WRITE_MAX: Final = 25
# The item kinds a restore writes: the canonical data, its idempotency ledger, used approvals
# and nonces (never usable again), revocations (revoked stays revoked), and the outbox (a key
# destruction still pending must still run). Parked approvals (the source stack's executions)
# and shredded-blob markers (nothing of them is in a backup) stay behind.
RESTORED_KINDS: Final = frozenset(
    {
        "head",
        "event",
        "ledger",
        "candidate",
        "record",
        "tombstone",
        "approval",
        "nonce",
        "revocation",
        "outbox",
    }
)
_BLOB_REFS: Final = ("sealed_ref", "body_ref", "output_ref")

Item = dict[str, Any]


def _s3_location(url: str, option: str) -> tuple[str, str]:
    if not url.startswith("s3://") or "/" not in url[5:]:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, f"{option} must be s3://bucket/prefix")
    bucket, _, prefix = url[5:].partition("/")
    prefix = prefix.strip("/")
    if not bucket or not prefix:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, f"{option} must be s3://bucket/prefix")
    return bucket, prefix


# --------------------------------------------------------------------------------------------
# Reading an export
# --------------------------------------------------------------------------------------------


def _attribute(value: Mapping[str, Any]) -> Any:
    """One attribute of DynamoDB JSON (binary values base64) as the low-level client takes it."""
    (kind, inner), *_ = value.items()
    if kind == "B":
        return {"B": base64.b64decode(inner)}
    if kind == "BS":
        return {"BS": [base64.b64decode(part) for part in inner]}
    if kind == "M":
        return {"M": {name: _attribute(v) for name, v in inner.items()}}
    if kind == "L":
        return {"L": [_attribute(v) for v in inner]}
    return {kind: inner}


def _s(item: Mapping[str, Any], name: str) -> str:
    value = item.get(name)
    return str(value["S"]) if isinstance(value, Mapping) and "S" in value else ""


def _n(item: Mapping[str, Any], name: str) -> int:
    value = item.get(name)
    return int(value["N"]) if isinstance(value, Mapping) and "N" in value else 0


def _objects(s3: Any, bucket: str, prefix: str) -> Iterator[str]:
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token is not None:
            kwargs["ContinuationToken"] = token
        listing = s3.list_objects_v2(**kwargs)
        for obj in listing.get("Contents", []):
            yield str(obj["Key"])
        if not listing.get("IsTruncated"):
            return
        token = listing.get("NextContinuationToken")


def _read(s3: Any, bucket: str, key: str) -> bytes:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        data: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except (BotoCoreError, ClientError):
        raise OperationRefused(
            ErrorCode.BACKUP_INVALID, f"s3://{bucket}/{key} is unreadable"
        ) from None
    return data


def _export_items(s3: Any, bucket: str, data_files: list[str]) -> list[Item]:
    items: list[Item] = []
    for key in data_files:
        try:
            text = gzip.decompress(_read(s3, bucket, key)).decode("utf-8")
            for line in text.splitlines():
                if line.strip():
                    loaded = json.loads(line)["Item"]
                    items.append({name: _attribute(v) for name, v in loaded.items()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise OperationRefused(
                ErrorCode.BACKUP_INVALID, f"s3://{bucket}/{key} is not a DynamoDB JSON export"
            ) from None
    return items


class _ExportedJournal:
    """The journal of exported items, as ``verify_journal`` reads a store."""

    def __init__(self, items: list[Item]) -> None:
        self.heads: dict[Scope, JournalHead] = {}
        self.events_of: dict[Scope, list[JournalEvent]] = {}
        for item in items:
            kind = _s(item, "kind")
            scope = Scope(_s(item, "tenant_id"), _s(item, "workspace_id"))
            if kind == "head":
                self.heads[scope] = JournalHead(_n(item, "cursor"), _s(item, "event_hash"))
            elif kind == "event":
                body = item.get("body", {}).get("B", b"")
                event = JournalEvent(_n(item, "cursor"), _s(item, "event_hash"), bytes(body))
                self.events_of.setdefault(scope, []).append(event)
        for events in self.events_of.values():
            events.sort(key=lambda event: event.cursor)

    def head(self, scope: Scope) -> JournalHead:
        return self.heads.get(scope, EMPTY_HEAD)

    def events(self, scope: Scope, after_cursor: int, limit: int) -> list[JournalEvent]:
        later = [e for e in self.events_of.get(scope, []) if e.cursor > after_cursor]
        return later[:limit]


@dataclass(frozen=True, slots=True)
class _Checked:
    items: list[Item]
    heads: dict[str, int]
    records: int
    blobs: list[str]
    without_key: int  # record bodies whose key is gone (forgotten since), or not this stack's


def _check(
    items: list[Item], blob: Callable[[str], bytes], record_keys: RecordKeys | None
) -> _Checked:
    """Every scope's journal verifies, every record body that ``record_keys`` opens hashes to
    its digest (``blob`` reads a body kept in S3; a body whose key is gone is counted). Raises
    ``OperationRefused(BACKUP_INVALID)``."""
    journal = _ExportedJournal(items)
    heads: dict[str, int] = {}
    for scope in sorted(journal.heads, key=lambda s: (s.tenant_id, s.workspace_id)):
        name = f"{scope.tenant_id}/{scope.workspace_id}"
        try:
            heads[name] = verify_journal(journal, scope).cursor  # type: ignore[arg-type]
        except EngramError as error:
            raise OperationRefused(
                ErrorCode.BACKUP_INVALID,
                f"the journal of {name} fails its check ({error.code.value})",
            ) from None
    orphans = set(journal.events_of) - set(journal.heads)
    if orphans:
        raise OperationRefused(ErrorCode.BACKUP_INVALID, "journal events without a journal head")
    blobs = sorted({_s(item, ref) for item in items for ref in _BLOB_REFS if _s(item, ref)})
    bodies: dict[Scope, dict[str, tuple[bytes, str]]] = {}
    records = 0
    for item in items:
        if _s(item, "kind") != "record":
            continue
        records += 1
        body: bytes | None = None
        if "body" in item:
            body = bytes(item["body"]["B"])
        elif _s(item, "body_ref"):
            body = blob(_s(item, "body_ref"))
        if body is not None:
            scope = Scope(_s(item, "tenant_id"), _s(item, "workspace_id"))
            bodies.setdefault(scope, {})[_s(item, "record_id")] = (body, _s(item, "record_digest"))
    without_key = sum(
        check_record_bodies(scope, of_scope, record_keys) for scope, of_scope in bodies.items()
    )
    return _Checked(items, heads, records, blobs, without_key)


# --------------------------------------------------------------------------------------------
# Backup
# --------------------------------------------------------------------------------------------


def _key_store(op: OperatorSession) -> dict[str, str]:
    """What identifies the stack's key store: its key table and the data key wrapping it."""
    table = op.dynamodb.describe_table(TableName=op.resources.key_table)["Table"]
    return {"key_table_arn": str(table["TableArn"]), "data_key_arn": op.resources.data_key_arn}


def _export(
    op: OperatorSession,
    table_arn: str,
    bucket: str,
    prefix: str,
    *,
    sleep: Callable[[float], None],
    poll_s: float,
    wait_s: float,
) -> dict[str, Any]:
    """A point-in-time export of the canonical table to ``s3://bucket/prefix``, waited for."""
    export: dict[str, Any] = op.dynamodb.export_table_to_point_in_time(
        TableArn=table_arn,
        S3Bucket=bucket,
        S3Prefix=prefix,
        ExportFormat="DYNAMODB_JSON",
    )["ExportDescription"]
    waited = 0.0
    while export["ExportStatus"] == "IN_PROGRESS":
        if waited >= wait_s:
            raise OperationRefused(
                ErrorCode.BACKUP_INVALID,
                f"the export {export['ExportArn']} is still running; it completes on its own,"
                " but this command stopped waiting: take the backup again",
            )
        sleep(poll_s)
        waited += poll_s
        export = op.dynamodb.describe_export(ExportArn=export["ExportArn"])["ExportDescription"]
    if export["ExportStatus"] != "COMPLETED":
        raise OperationRefused(
            ErrorCode.BACKUP_INVALID,
            f"the export failed: {export.get('FailureCode')}: {export.get('FailureMessage')}",
        )
    return export


def _write_manifest(
    op: OperatorSession,
    bucket: str,
    prefix: str,
    export: dict[str, Any],
    table_arn: str,
    data_files: list[str],
    checked: _Checked,
) -> None:
    resources = op.resources
    manifest = {
        "format": FORMAT,
        "stack": resources.stack_name,
        "tenant_id": resources.tenant_id,
        "export_arn": export["ExportArn"],
        "export_time": str(export.get("ExportTime", "")),
        "table_arn": table_arn,
        "data_files": data_files,
        "items": len(checked.items),
        "journal_heads": checked.heads,
        "records": checked.records,
        "blobs": checked.blobs,
        "key_store": _key_store(op),
        "keys_included": False,
        "projections_included": False,
    }
    op.s3.put_object(
        Bucket=bucket,
        Key=f"{prefix}/{MANIFEST}",
        Body=json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8"),
        ContentType="application/json",
    )


def backup_stack(
    op: OperatorSession,
    *,
    to: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = EXPORT_POLL_S,
    wait_s: float = EXPORT_WAIT_S,
) -> dict[str, Any]:
    """Export the stack's canonical table, copy its blobs, write and check the manifest."""
    resources = op.resources
    if to is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        bucket, prefix = resources.blob_bucket, f"backups/{stamp}-{secrets.token_hex(4)}"
    else:
        bucket, prefix = _s3_location(to, "--to")

    def run(call: Any) -> dict[str, Any]:
        if any(True for _ in _objects(op.s3, bucket, f"{prefix}/")):
            raise OperationRefused(
                ErrorCode.BACKUP_INVALID, f"s3://{bucket}/{prefix}/ already holds objects"
            )
        table_arn = op.dynamodb.describe_table(TableName=resources.table)["Table"]["TableArn"]
        export = _export(op, table_arn, bucket, prefix, sleep=sleep, poll_s=poll_s, wait_s=wait_s)
        data_files = sorted(
            key
            for key in _objects(op.s3, bucket, f"{prefix}/AWSDynamoDB/")
            if "/data/" in key and key.endswith(".gz")
        )
        checked = _check(
            _export_items(op.s3, bucket, data_files),
            lambda key: _read(op.s3, resources.blob_bucket, key),
            op.engine.record_keys,
        )
        for key in checked.blobs:
            op.s3.copy_object(
                Bucket=bucket,
                Key=f"{prefix}/blobs/{key}",
                CopySource={"Bucket": resources.blob_bucket, "Key": key},
            )
        _write_manifest(op, bucket, prefix, export, table_arn, data_files, checked)
        call.digests["exported_items"] = str(len(checked.items))
        return {
            "backup": f"s3://{bucket}/{prefix}",
            "items": len(checked.items),
            "journal_heads": checked.heads,
            "records": checked.records,
            "records_without_key": checked.without_key,
            "blobs": len(checked.blobs),
            "keys_included": False,
            "projections_included": False,
        }

    scope = Scope(resources.tenant_id, "*")
    return audited(op.engine, scope, op.operator, "backup", f"s3://{bucket}/{prefix}", run)


# --------------------------------------------------------------------------------------------
# Restore
# --------------------------------------------------------------------------------------------


def _manifest(op: OperatorSession, bucket: str, prefix: str) -> dict[str, Any]:
    try:
        manifest = json.loads(_read(op.s3, bucket, f"{prefix}/{MANIFEST}"))
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise OperationRefused(
            ErrorCode.BACKUP_INVALID,
            f"s3://{bucket}/{prefix} holds no Engram Memory backup ({MANIFEST})",
        )
    return manifest


def _write(op: OperatorSession, items: list[Item]) -> None:
    table = op.resources.table
    for start in range(0, len(items), _BATCH_WRITE_MAX):
        requests: dict[str, Any] = {
            table: [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
        }
        for attempt in range(8):
            unprocessed = op.dynamodb.batch_write_item(RequestItems=requests).get(
                "UnprocessedItems", {}
            )
            if not unprocessed:
                break
            requests = unprocessed
            time.sleep(min(0.05 * 2**attempt, 2.0))
        else:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE)


def _may_restore(op: OperatorSession, manifest: dict[str, Any], *, new_keys: bool) -> bool:
    """Refuse a restore onto another tenant, a table that holds memories, or a key store that
    is not the backup's (unless ``new_keys``); answer whether the key store is the backup's."""
    resources = op.resources
    if manifest.get("tenant_id") != resources.tenant_id:
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED,
            f"the backup is of tenant {manifest.get('tenant_id')!r}, the stack serves"
            f" {resources.tenant_id!r}",
        )
    if op.engine.read(op.engine.store.scopes):
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED,
            f"the table of stack {resources.stack_name} already holds memories; restore"
            " into a new stack (or one whose table is empty)",
        )
    own_keys = manifest.get("key_store") == _key_store(op)
    if not own_keys and not new_keys:
        raise OperationRefused(
            ErrorCode.RESTORE_REFUSED,
            f"the key store of stack {resources.stack_name} is not the backup's (keys are"
            " never in a backup); restore into the stack whose key table and data key the"
            " backup names, or pass --new-keys to restore the records on this stack's keys"
            " (pending candidates will not open)",
        )
    return own_keys


def _reproject(op: OperatorSession, restored: dict[str, int]) -> tuple[int, int]:
    """Rebuild every restored workspace's search documents (the drainer's reindex); answer
    (documents projected, pending candidates whose key is gone)."""
    projected = unopenable = 0
    for name in restored:
        workspace_id = name.partition("/")[2]
        answer = op.invoke_drainer({"operation": "reindex", "workspace_id": workspace_id})
        projected += int(answer.get("indexed", 0))
        scope = Scope(op.resources.tenant_id, workspace_id)
        after = ""
        while rows := op.engine.store.candidates_list(scope, "pending", after, 500):
            unopenable += sum(1 for row in rows if not op.engine.vault.key_exists(row.key_ref))
            after = rows[-1].candidate_id
    return projected, unopenable


def restore_stack(op: OperatorSession, source: str, *, new_keys: bool = False) -> dict[str, Any]:
    """Restore the backup at ``source`` into the stack (see the module docstring)."""
    resources = op.resources
    bucket, prefix = _s3_location(source, "--from")

    def run(call: Any) -> dict[str, Any]:
        manifest = _manifest(op, bucket, prefix)
        items = _export_items(op.s3, bucket, [str(key) for key in manifest["data_files"]])
        checked = _check(
            items,
            lambda key: _read(op.s3, bucket, f"{prefix}/blobs/{key}"),
            op.engine.record_keys,
        )
        own_keys = _may_restore(op, manifest, new_keys=new_keys)
        for key in checked.blobs:
            op.s3.copy_object(
                Bucket=resources.blob_bucket,
                Key=key,
                CopySource={"Bucket": bucket, "Key": f"{prefix}/blobs/{key}"},
            )
        kept = [item for item in checked.items if _s(item, "kind") in RESTORED_KINDS]
        heads = [item for item in kept if _s(item, "kind") == "head"]
        _write(op, [item for item in kept if _s(item, "kind") != "head"])
        _write(op, heads)  # last: until they are there, the table holds no memories
        restored: dict[str, int] = {}
        for scope in op.engine.read(op.engine.store.scopes):
            name = f"{scope.tenant_id}/{scope.workspace_id}"
            restored[name] = verify_journal(op.engine.store, scope).cursor
        if restored != checked.heads:
            raise OperationRefused(
                ErrorCode.BACKUP_INVALID, "the restored journals differ from the backup's"
            )
        projected, unopenable = _reproject(op, restored)
        call.digests["restored_items"] = str(len(kept))
        return {
            "restored": resources.stack_name,
            "from": f"s3://{bucket}/{prefix}",
            "items": len(kept),
            "journal_heads": restored,
            "records": checked.records,
            "records_without_key": checked.without_key,
            "projected": projected,
            "new_key_store": not own_keys,
            "pending_candidates_without_key": unopenable,
        }

    scope = Scope(resources.tenant_id, "*")
    return audited(op.engine, scope, op.operator, "restore", f"s3://{bucket}/{prefix}", run)

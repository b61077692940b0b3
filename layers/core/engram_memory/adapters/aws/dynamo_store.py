"""The cloud canonical store: one DynamoDB table, with S3 for attributes above the item limit.

Every mutation is ONE ``TransactWriteItems`` whose condition expressions carry exactly the
conditions of a ``ChangeSet`` (the journal head, a free ledger key, each transition's source
state, an unused approval), so a mutation is either wholly there or not at all and idempotency
and dense cursors never come from read-then-write.

Item layout
-----------

One table, string keys ``pk`` / ``sk`` (PAY_PER_REQUEST, point-in-time recovery, SSE with a
customer-managed KMS key, TTL attribute ``ttl``: the SAM template owns it). ``<scope>`` is
``S#<tenant>#<workspace>`` with both ids percent-encoded (``quote(id, safe="")``), so no id can
forge a separator; ``q(x)`` is the same encoding of any other id. Every item carries ``kind``;
every scoped item also ``tenant_id`` and ``workspace_id``.

- journal head — pk ``<scope>``, sk ``HEAD``: ``cursor`` N, ``event_hash`` S.
- journal event — pk ``<scope>#EVENTS``, sk the cursor as 20 zero-padded digits (dense, so
  ordered): ``cursor`` N, ``event_hash`` S, ``body`` B.
- ledger entry — pk ``<scope>#LEDGER#q(principal)#q(idempotency_key)``, sk ``LEDGER``:
  ``principal``, ``idempotency_key``, ``tool``, ``target`` (omitted when None), ``intent_hash``,
  ``cursor`` N, ``output`` B or ``output_ref`` S.
- candidate control row — pk ``<scope>#CANDIDATE#q(candidate_id)``, sk ``CANDIDATE``: the
  ``CandidateRow`` fields, ``sealed`` B or ``sealed_ref`` S, ``held`` S (the hold's decision
  receipt digest) while an admission policy holds it.
- record — pk ``<scope>#RECORD#q(record_id)``, sk ``RECORD``: the ``RecordRow`` fields
  (``valid_to_ms`` / ``expires_at_ms`` omitted when None), ``body`` B or ``body_ref`` S, both
  removed once shredded.
- tombstone — pk ``<scope>#TOMBSTONE#q(payload_digest)``, sk ``q(record_id)``:
  ``payload_digest``, ``record_id``, ``cursor`` N.
- used approval — pk ``APPROVAL#q(approval_id)``, sk ``APPROVAL``: ``cursor`` N. Global, like
  the SQLite store: an approval id is used once across every scope.
- used nonce — pk ``NONCE#q(nonce)``, sk ``NONCE``: ``expires_at_ms`` N and ``ttl`` N (epoch
  seconds, one hour after the expiry: TTL deletion is lazy and a used nonce must outlive the
  approval window it guards). Global.
- outbox queue entry — pk ``OUTBOX`` (one fixed partition), sk ``q(item_id)``: ``item_id``,
  ``outbox_kind``, ``target``, ``surface`` and the scope.
- outbox index entry — pk ``<scope>#OUTBOX#q(kind)#q(target)``, sk ``q(item_id)``: the same
  attributes, written and deleted with the queue entry (it answers ``outbox_has``).
- outbox scope entry — pk ``<scope>#OUTBOX``, sk ``q(item_id)``: the same attributes, written
  and deleted with the queue entry (it answers ``outbox_pending_in``: a scope's own items, by
  kind with a sort-key prefix, without reading other scopes' queue). Items also carry
  ``enqueued_at_ms`` N (for the outbox-age metric).
- shredded blob marker — pk ``BLOB_GC`` (one fixed partition), sk the S3 key: a shredded
  record body whose S3 object is still to be deleted.

Access paths: every read is a consistent ``GetItem`` / ``BatchGetItem`` / ``Query``
(``events`` is a Query over ``<scope>#EVENTS`` with ``sk > cursor``; ``payload_tombstoned`` a
Query with ``Limit 1``; ``outbox_pending`` a Query of the ``OUTBOX`` partition; ``outbox_has`` a
Query of the scope's outbox index partition; ``outbox_pending_in`` a Query of the scope's outbox
partition). Nothing on a request path Scans;
``table_snapshot`` (operators and tests only) does.

The commit
----------

``commit`` sends, in this order: the head (a ``Put`` of the new cursor/hash conditioned on
``cursor = expected AND event_hash = expected`` — ``attribute_not_exists`` for cursor 0 — or a
``ConditionCheck`` when the change set has no event; nothing when it names no head: a policy's
hold), the ledger entry (``attribute_not_exists``),
the event (``attribute_not_exists``), the candidate put (``attribute_not_exists``), transition
(``state = from``, and ``attribute_not_exists(held)`` for a policy's decision; ``REMOVE held``)
or hold (``SET held``, ``state = pending``), the record put (``attribute_not_exists``) or transition (``state = from``,
``REMOVE body, body_ref`` when shredding), the tombstone, the used approval
(``attribute_not_exists``) and the outbox items. A ``TransactionCanceledException`` maps the
first ``ConditionalCheckFailed`` cancellation reason, by the index of the failing item, to
``CommitConflict``: head/event → ``head``; ledger and a taken candidate id → ``ledger``;
candidate and record transitions and a taken record id → ``state``; approval → ``approval``
(the same reasons as the SQLite store). A cancellation whose only reason is
``TransactionConflict`` (another transaction was writing one of the
items, typically the workspace's head) is ``CommitConflict("head")`` too: nothing was applied
and the engine re-reads the head and retries with backoff, exactly as for a moved head.
Cancellations for any other reason (throttling, validation), throttling
(``ProvisionedThroughputExceeded``, ``Throttling``, ``RequestLimitExceeded``), a 503, and a
connection that was never established raise ``StoreUnavailable``: nothing was applied. A read
timeout, a dropped connection, a 500 ``InternalServerError`` or an in-progress duplicate request
raise ``CommitOutcomeUnknown``: the request may have been applied. Each transaction carries a
``ClientRequestToken`` derived from its content, so botocore's own retries of a timed-out
request are idempotent on the DynamoDB side (a later call never resends identical content: its
event carries its own instant and receipts).

``ChangeSet.projection`` is ignored: this store maintains no projection, so it must be paired
with projection surfaces whose ``maintained_by_store`` is False (the engine applies upserts
after the commit and drops through the outbox).

Large attributes
----------------

A candidate's ``sealed`` ciphertext, a record's ``body`` and a ledger ``output`` longer than
``inline_limit_bytes`` (256 KiB by default, well inside the 400 KB item limit and the 4 MB
transaction limit) go to S3 under ``blobs/<scope hash>/<sha256 of the content>`` **before** the
transaction, which then only references the key (``*_ref``); reads fetch them back
transparently. A blob written for a transaction that then fails is left unreferenced (it cannot
be deleted safely: a concurrent writer of the same content may reference it); a bucket
lifecycle rule or an offline sweep may collect objects no item references.

Shredding: a tombstone transition with ``shred_record_body`` removes the inline ``body`` and the
``body_ref`` in the same transaction and, when the body lived in S3, also writes a ``BLOB_GC``
marker for its key; after the commit the object and then the marker are deleted. If that
deletion fails the marker stays and ``collect_shredded_blobs`` (an operator or scheduled call)
finishes it. The bucket must not keep noncurrent versions for long (no versioning, or a short
noncurrent-version expiration).

A missing S3 object (an operational failure, logged): a record whose body blob is gone is
returned with ``body=None``, so it is never served, and forget still works on it (today the
engine treats such a record as ineligible, i.e. ``NOT_FOUND``; mapping an eligible-but-bodiless
record to ``BLOB_MISSING`` is the engine's call). A candidate's sealed blob or a ledger output
that is gone raises ``BlobMissing``, a ``StoreUnavailable`` (those fields cannot be ``None`` and
the port has no permanent-failure error). Transient S3 failures raise ``StoreUnavailable``.

Clients are injected or created lazily on first use; nothing touches AWS at import or
construction time. Safe to share between threads (boto3 clients are thread-safe).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, cast
from urllib.parse import quote

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError

from engram_memory.adapters.aws.calls import CONDITION_FAILED, error_code, unless_refused
from engram_memory.adapters.aws.client_config import client_config
from engram_memory.adapters.lazy import Lazy
from engram_memory.contract.canonical import GENESIS_HASH
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import (
    OUTBOX_KINDS,
    CandidateHold,
    CandidateRow,
    CandidateState,
    ChangeSet,
    CommitConflict,
    CommitOutcomeUnknown,
    JournalEvent,
    JournalHead,
    LedgerEntry,
    OutboxItem,
    RecordRow,
    RecordState,
    StateTransition,
    Store,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from boto3.session import Session
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import (
        AttributeValueTypeDef,
        KeysAndAttributesTypeDef,
        TransactWriteItemTypeDef,
    )
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.literals import BucketLocationConstraintType

    Item = dict[str, AttributeValueTypeDef]

__all__ = [
    "INLINE_LIMIT_BYTES",
    "BlobMissing",
    "DynamoStore",
    "create_bucket",
    "create_tables",
]

log = logging.getLogger(__name__)

INLINE_LIMIT_BYTES: Final = 256 * 1024
NONCE_TTL_GRACE_S: Final = 3_600  # DynamoDB TTL deletes lazily; keep used nonces a while longer
_BATCH_GET_MAX: Final = 100
# What a ranking revalidates of a record row: everything but the sealed body (``body`` or its
# blob's ``body_ref``), which only the page needs (``records_get(..., bodies=False)``).
_ELIGIBILITY_FIELDS: Final = (
    "record_id",
    "state",
    "record_digest",
    "payload_digest",
    "candidate_id",
    "valid_from_ms",
    "valid_to_ms",
    "expires_at_ms",
    "accepted_cursor",
)
# How long a function trusts "not revoked" before reading the revocation items again: a token
# revoked by an operator answers AUTHORIZATION_REVOKED from every warm container within this.
# "Revoked" is never forgotten (a revocation is never lifted).
REVOCATION_CACHE_S: Final = 5.0
_REVOCATION_CACHE_MAX: Final = 4_096
_BATCH_GET_STALLS: Final = 8  # attempts without progress before giving up on unprocessed keys
_OUTBOX_PK: Final = "OUTBOX"
_COUNT_LIMIT: Final = 1_000_000  # a scope's outbox items counted by ``state_counts``, at most
_BLOB_GC_PK: Final = "BLOB_GC"

ConflictReason = Literal["head", "ledger", "state", "approval"]

# Error codes meaning "refused before anything was applied".
_UNAVAILABLE_CODES: Final = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "Throttling",
        "RequestLimitExceeded",
        "TransactionConflictException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "IdempotentParameterMismatchException",
        "ResourceNotFoundException",
        "LimitExceededException",
    }
)
# Error codes meaning "the request may have been applied".
_UNKNOWN_OUTCOME_CODES: Final = frozenset(
    {"InternalServerError", "InternalFailure", "TransactionInProgressException"}
)

_T = TypeVar("_T")


class BlobMissing(StoreUnavailable):
    """An item references an S3 blob that no longer exists (an operational failure).

    A ``StoreUnavailable`` so the engine fails loudly instead of serving a partial row; the port
    has no dedicated ``BLOB_MISSING`` error yet.
    """


# --------------------------------------------------------------------------------------------
# Keys and attribute values
# --------------------------------------------------------------------------------------------


def _q(value: str) -> str:
    return quote(value, safe="")


def scope_key(scope: Scope) -> str:
    return f"S#{_q(scope.tenant_id)}#{_q(scope.workspace_id)}"


def _scope_hash(scope: Scope) -> str:
    return hashlib.sha256(f"{scope.tenant_id}\x00{scope.workspace_id}".encode()).hexdigest()[:32]


def _key(pk: str, sk: str) -> Item:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def _head_key(scope: Scope) -> Item:
    return _key(scope_key(scope), "HEAD")


def _event_key(scope: Scope, cursor: int) -> Item:
    return _key(f"{scope_key(scope)}#EVENTS", f"{cursor:020d}")


def _ledger_key(scope: Scope, principal: str, idempotency_key: str) -> Item:
    return _key(f"{scope_key(scope)}#LEDGER#{_q(principal)}#{_q(idempotency_key)}", "LEDGER")


def _candidate_key(scope: Scope, candidate_id: str) -> Item:
    return _key(f"{scope_key(scope)}#CANDIDATE#{_q(candidate_id)}", "CANDIDATE")


def _record_key(scope: Scope, record_id: str) -> Item:
    return _key(f"{scope_key(scope)}#RECORD#{_q(record_id)}", "RECORD")


def _tombstone_pk(scope: Scope, payload_digest: str) -> str:
    return f"{scope_key(scope)}#TOMBSTONE#{_q(payload_digest)}"


def _approval_key(approval_id: str) -> Item:
    return _key(f"APPROVAL#{_q(approval_id)}", "APPROVAL")


def _approval_item(scope: Scope, approval_id: str, cursor: int) -> Item:
    """A used approval (``cursor`` 0: spent by a decline, not by a commit)."""
    return {
        **_approval_key(approval_id),
        **_scoped(scope, "approval"),
        "approval_id": _s(approval_id),
        "cursor": _n(cursor),
    }


def _nonce_key(nonce: str) -> Item:
    return _key(f"NONCE#{_q(nonce)}", "NONCE")


def _revocation_key(tenant_id: str, kind: str, value: str) -> Item:
    return _key(f"REVOKED#{_q(tenant_id)}#{kind}#{_q(value)}", "REVOKED")


def _outbox_index_pk(scope: Scope, kind: str, target: str) -> str:
    return f"{scope_key(scope)}#OUTBOX#{_q(kind)}#{_q(target)}"


def _outbox_scope_pk(scope: Scope) -> str:
    return f"{scope_key(scope)}#OUTBOX"


def _outbox_keys(item: OutboxItem) -> tuple[Item, Item, Item]:
    """The queue entry, the per-target index entry and the scope entry of one outbox item."""
    sk = _q(item.item_id)
    return (
        _key(_OUTBOX_PK, sk),
        _key(_outbox_index_pk(item.scope, item.kind, item.target), sk),
        _key(_outbox_scope_pk(item.scope), sk),
    )


def _s(value: str) -> AttributeValueTypeDef:
    return {"S": value}


def _n(value: int) -> AttributeValueTypeDef:
    return {"N": str(value)}


def _b(value: bytes) -> AttributeValueTypeDef:
    return {"B": value}


def _get_s(item: Mapping[str, AttributeValueTypeDef], name: str) -> str:
    return item[name]["S"]


def _get_n(item: Mapping[str, AttributeValueTypeDef], name: str) -> int:
    return int(item[name]["N"])


def _opt_s(item: Mapping[str, AttributeValueTypeDef], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else value["S"]


def _opt_n(item: Mapping[str, AttributeValueTypeDef], name: str) -> int | None:
    value = item.get(name)
    return None if value is None else int(value["N"])


def _scoped(scope: Scope, kind: str) -> Item:
    return {
        "kind": _s(kind),
        "tenant_id": _s(scope.tenant_id),
        "workspace_id": _s(scope.workspace_id),
    }


def _plain(value: Mapping[str, Any]) -> Any:
    """One DynamoDB attribute value as a plain, comparable Python value (for snapshots)."""
    ((tag, inner),) = value.items()
    if tag == "N":
        return int(inner)
    if tag == "B":
        return bytes(inner)
    if tag in ("SS", "NS", "BS"):
        return tuple(sorted(inner))
    if tag == "L":
        return tuple(_plain(v) for v in inner)
    if tag == "M":
        return tuple(sorted((k, _plain(v)) for k, v in inner.items()))
    return inner


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


class _Plan:
    """A transaction being built: the items, the conflict reason of each, and the S3 blobs."""

    def __init__(self) -> None:
        self.items: list[TransactWriteItemTypeDef] = []
        self.reasons: list[ConflictReason] = []
        self.blobs: dict[str, bytes] = {}
        self.shredded: list[str] = []

    def add(self, item: TransactWriteItemTypeDef, reason: ConflictReason) -> None:
        self.items.append(item)
        self.reasons.append(reason)

    def token(self) -> str:
        """A ClientRequestToken bound to the exact request (retries of it are idempotent)."""
        return hashlib.sha256(repr(self.items).encode()).hexdigest()[:36]


class DynamoStore:
    """The ``Store`` port on DynamoDB (+ S3 for large attributes); see the module docstring.

    ``dynamodb`` and ``s3`` are boto3 clients; when omitted they are created from ``session``
    (or a new default boto3 session) on first use, with ``region_name`` if given.
    """

    def __init__(
        self,
        *,
        table_name: str,
        bucket: str,
        dynamodb: DynamoDBClient | None = None,
        s3: S3Client | None = None,
        session: Session | None = None,
        region_name: str | None = None,
        inline_limit_bytes: int = INLINE_LIMIT_BYTES,
        revocation_cache_s: float = REVOCATION_CACHE_S,
    ) -> None:
        if inline_limit_bytes <= 0:
            raise ValueError("inline_limit_bytes must be positive")
        self._revocation_cache_s = revocation_cache_s
        # (tenant, token id, principal, issued at) -> (revoked, monotonic time of the read)
        self._revocations: dict[tuple[str, str | None, str, int], tuple[bool, float]] = {}
        self.table_name = table_name
        self.bucket = bucket
        self._inline_limit = inline_limit_bytes
        # one session for both clients (made only when a client is), each client made once
        self._session = Lazy(lambda: _new_session(region_name), session)
        self._dynamodb = Lazy(lambda: self._client("dynamodb"), dynamodb)
        self._s3 = Lazy(lambda: self._client("s3"), s3)

    # -- clients -------------------------------------------------------------------------------

    def _client(self, service: Literal["dynamodb", "s3"]) -> Any:
        # the stack's one policy (for clients not injected)
        return self._session.get().client(service, config=client_config())

    @property
    def dynamodb(self) -> DynamoDBClient:
        return self._dynamodb.get()

    @property
    def s3(self) -> S3Client:
        return self._s3.get()

    def close(self) -> None:
        """Nothing to release: boto3 clients pool their own connections."""

    # -- error translation ---------------------------------------------------------------------

    @staticmethod
    def _read(fetch: Callable[..., _T], /, **kwargs: Any) -> _T:
        try:
            return fetch(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise StoreUnavailable("dynamodb store unavailable") from exc

    # -- blobs ---------------------------------------------------------------------------------

    def _blob_key(self, scope: Scope, data: bytes) -> str:
        return f"blobs/{_scope_hash(scope)}/{hashlib.sha256(data).hexdigest()}"

    def _large(self, plan: _Plan, scope: Scope, item: Item, name: str, data: bytes) -> None:
        """Put ``data`` inline as ``name``, or in S3 referenced by ``<name>_ref``."""
        if len(data) <= self._inline_limit:
            item[name] = _b(data)
            return
        key = self._blob_key(scope, data)
        plan.blobs[key] = data
        item[f"{name}_ref"] = _s(key)

    def _fetch_blob(self, key: str) -> bytes | None:
        try:
            response = self.s3.get_object(Bucket=self.bucket, Key=key)
            return response["Body"].read()
        except ClientError as exc:
            if error_code(exc) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise StoreUnavailable("blob store unavailable") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable("blob store unavailable") from exc

    def _large_value(self, item: Mapping[str, AttributeValueTypeDef], name: str) -> bytes | None:
        """The inline value of ``name`` or the blob its ``<name>_ref`` names; None if neither."""
        inline = item.get(name)
        if inline is not None:
            return bytes(inline["B"])
        ref = _opt_s(item, f"{name}_ref")
        if ref is None:
            return None
        data = self._fetch_blob(ref)
        if data is None:
            log.error("a referenced blob is missing", extra={"attribute": name, "blob": ref})
        return data

    def _required_value(self, item: Mapping[str, AttributeValueTypeDef], name: str) -> bytes:
        data = self._large_value(item, name)
        if data is None:
            raise BlobMissing(f"the {name} blob is missing")
        return data

    # -- rows ----------------------------------------------------------------------------------

    def _ledger_row(self, item: Mapping[str, AttributeValueTypeDef]) -> LedgerEntry:
        return LedgerEntry(
            principal=_get_s(item, "principal"),
            idempotency_key=_get_s(item, "idempotency_key"),
            tool=_get_s(item, "tool"),
            target=_opt_s(item, "target"),
            intent_hash=_get_s(item, "intent_hash"),
            output=self._required_value(item, "output"),
            cursor=_get_n(item, "cursor"),
        )

    def _candidate_row(self, item: Mapping[str, AttributeValueTypeDef]) -> CandidateRow:
        state: CandidateState = _get_s(item, "state")  # type: ignore[assignment]
        return CandidateRow(
            candidate_id=_get_s(item, "candidate_id"),
            principal=_get_s(item, "principal"),
            state=state,
            payload_digest=_get_s(item, "payload_digest"),
            record_digest=_get_s(item, "record_digest"),
            record_id=_get_s(item, "record_id"),
            capture_cursor=_get_n(item, "capture_cursor"),
            key_ref=_get_s(item, "key_ref"),
            sealed=self._required_value(item, "sealed"),
            policy_version=_get_s(item, "policy_version"),
            created_at_ms=_get_n(item, "created_at_ms"),
            held=_opt_s(item, "held"),
        )

    def _record_row(
        self, item: Mapping[str, AttributeValueTypeDef], *, body: bool = True
    ) -> RecordRow:
        state: RecordState = _get_s(item, "state")  # type: ignore[assignment]
        return RecordRow(
            record_id=_get_s(item, "record_id"),
            state=state,
            record_digest=_get_s(item, "record_digest"),
            payload_digest=_get_s(item, "payload_digest"),
            candidate_id=_get_s(item, "candidate_id"),
            valid_from_ms=_get_n(item, "valid_from_ms"),
            valid_to_ms=_opt_n(item, "valid_to_ms"),
            expires_at_ms=_opt_n(item, "expires_at_ms"),
            accepted_cursor=_get_n(item, "accepted_cursor"),
            body=self._large_value(item, "body") if body else None,
            body_read=body,
        )

    def _get(self, key: Item) -> Item | None:
        response = self._read(
            lambda: self.dynamodb.get_item(TableName=self.table_name, Key=key, ConsistentRead=True)
        )
        return response.get("Item")

    # -- reads ---------------------------------------------------------------------------------

    def head(self, scope: Scope) -> JournalHead:
        item = self._get(_head_key(scope))
        if item is None:
            return JournalHead(0, GENESIS_HASH)
        return JournalHead(_get_n(item, "cursor"), _get_s(item, "event_hash"))

    def ledger_get(self, scope: Scope, principal: str, idempotency_key: str) -> LedgerEntry | None:
        item = self._get(_ledger_key(scope, principal, idempotency_key))
        return None if item is None else self._ledger_row(item)

    def candidate_get(self, scope: Scope, candidate_id: str) -> CandidateRow | None:
        item = self._get(_candidate_key(scope, candidate_id))
        return None if item is None else self._candidate_row(item)

    def candidate_digest(self, scope: Scope, candidate_id: str) -> tuple[str, str, int] | None:
        """A candidate's ``(principal, record_digest, created_at_ms)`` without its sealed content
        (the cloud approval page shows a withdraw by digest; its function never reads ciphertext)."""
        response = self._read(
            lambda: self.dynamodb.get_item(
                TableName=self.table_name,
                Key=_candidate_key(scope, candidate_id),
                ConsistentRead=True,
                ProjectionExpression="principal, record_digest, created_at_ms",
            )
        )
        item = response.get("Item")
        if item is None:
            return None
        return (
            _get_s(item, "principal"),
            _get_s(item, "record_digest"),
            _get_n(item, "created_at_ms"),
        )

    def record_get(self, scope: Scope, record_id: str) -> RecordRow | None:
        item = self._get(_record_key(scope, record_id))
        return None if item is None else self._record_row(item)

    def records_get(
        self, scope: Scope, record_ids: Sequence[str], *, bodies: bool = True
    ) -> dict[str, RecordRow]:
        """Without ``bodies``, only the fields a ranking revalidates (a projection): a search's
        hits up to the ranking depth are read without their sealed bodies (and no blob of a
        large body is fetched); the page's bodies are read after ranking."""
        ids = list(dict.fromkeys(record_ids))
        found: dict[str, RecordRow] = {}
        for start in range(0, len(ids), _BATCH_GET_MAX):
            chunk = ids[start : start + _BATCH_GET_MAX]
            keys = [_record_key(scope, rid) for rid in chunk]
            for item in self._batch_get(keys, () if bodies else _ELIGIBILITY_FIELDS):
                row = self._record_row(item, body=bodies)
                found[row.record_id] = row
        return found

    def _batch_get(self, keys: list[Item], fields: Sequence[str] = ()) -> list[Item]:
        """``BatchGetItem`` of at most 100 keys (only ``fields`` when some are named), retrying
        unprocessed keys with backoff."""
        items: list[Item] = []
        pending: Sequence[Mapping[str, Any]] = keys
        stalls = 0
        names = {f"#f{i}": name for i, name in enumerate(fields)}
        while pending:
            read: KeysAndAttributesTypeDef = {"Keys": pending, "ConsistentRead": True}
            if names:
                read["ProjectionExpression"] = ", ".join(names)
                read["ExpressionAttributeNames"] = names
            request: dict[str, KeysAndAttributesTypeDef] = {self.table_name: read}
            response = self._read(self.dynamodb.batch_get_item, RequestItems=request)
            got = response.get("Responses", {}).get(self.table_name, [])
            items.extend(got)
            unprocessed = response.get("UnprocessedKeys", {}).get(self.table_name)
            left: Sequence[Mapping[str, Any]] = unprocessed["Keys"] if unprocessed else []
            if left and len(left) >= len(pending):
                stalls += 1
                if stalls >= _BATCH_GET_STALLS:
                    raise StoreUnavailable("dynamodb kept keys unprocessed")
                time.sleep(random.uniform(0, 0.01 * 2**stalls))  # noqa: S311 - jitter, not crypto
            else:
                stalls = 0
            pending = left
        return items

    def _query(
        self,
        *,
        pk: str,
        limit: int,
        sk_after: str | None = None,
        sk_prefix: str | None = None,
    ) -> Iterator[Item]:
        """Items of partition ``pk`` in sort-key order, at most ``limit``, paging as needed."""
        names = {"#pk": "pk"}
        values: dict[str, AttributeValueTypeDef] = {":pk": _s(pk)}
        condition = "#pk = :pk"
        if sk_after is not None:
            names["#sk"] = "sk"
            values[":sk"] = _s(sk_after)
            condition += " AND #sk > :sk"
        elif sk_prefix is not None:
            names["#sk"] = "sk"
            values[":sk"] = _s(sk_prefix)
            condition += " AND begins_with(#sk, :sk)"
        remaining = limit
        start: Item | None = None
        while remaining > 0:
            kwargs: dict[str, Any] = {
                "TableName": self.table_name,
                "KeyConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "ConsistentRead": True,
                "Limit": remaining,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            response = self._read(self.dynamodb.query, **kwargs)
            for item in response.get("Items", []):
                remaining -= 1
                yield item
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            start = last

    def payload_tombstoned(self, scope: Scope, payload_digest: str) -> bool:
        return any(True for _ in self._query(pk=_tombstone_pk(scope, payload_digest), limit=1))

    def events(self, scope: Scope, after_cursor: int, limit: int) -> list[JournalEvent]:
        if limit <= 0:
            return []
        items = self._query(
            pk=f"{scope_key(scope)}#EVENTS",
            sk_after=f"{max(after_cursor, 0):020d}",
            limit=limit,
        )
        return [
            JournalEvent(_get_n(i, "cursor"), _get_s(i, "event_hash"), bytes(i["body"]["B"]))
            for i in items
        ]

    def spend_approval(self, scope: Scope, approval_id: str) -> bool:
        # the very item a commit's ``_plan_approval`` puts: that commit's condition then fails
        return self._put_if_absent(_approval_item(scope, approval_id, 0))

    def claim_nonce(self, scope: Scope, nonce: str, expires_at_ms: int) -> bool:
        item: Item = {
            **_nonce_key(nonce),
            **_scoped(scope, "nonce"),
            "expires_at_ms": _n(expires_at_ms),
            "ttl": _n(-(-expires_at_ms // 1000) + NONCE_TTL_GRACE_S),
        }
        return self._put_if_absent(item)

    def _put_if_absent(self, item: Item) -> bool:
        """Put ``item`` unless its key exists: False when it did. Raises ``StoreUnavailable``."""
        put = unless_refused(
            lambda: self.dynamodb.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(#pk)",
                ExpressionAttributeNames={"#pk": "pk"},
            ),
            CONDITION_FAILED,
            "dynamodb store unavailable",
        )
        return put is not None

    # -- the outbox ----------------------------------------------------------------------------

    @staticmethod
    def _outbox_item(item: Mapping[str, AttributeValueTypeDef]) -> OutboxItem:
        stored = _get_s(item, "outbox_kind")
        kind = next((k for k in OUTBOX_KINDS if k == stored), None)
        if kind is None:
            raise StoreUnavailable("an outbox item of an unknown kind")
        return OutboxItem(
            item_id=_get_s(item, "item_id"),
            kind=kind,
            scope=Scope(_get_s(item, "tenant_id"), _get_s(item, "workspace_id")),
            target=_get_s(item, "target"),
            surface=_get_s(item, "surface"),
            enqueued_at_ms=_opt_n(item, "enqueued_at_ms") or 0,
        )

    def outbox_pending(self, limit: int) -> list[OutboxItem]:
        if limit <= 0:
            return []
        return [self._outbox_item(i) for i in self._query(pk=_OUTBOX_PK, limit=limit)]

    def outbox_pending_in(self, scope: Scope, kind: str | None, limit: int) -> list[OutboxItem]:
        if limit <= 0:
            return []
        prefix = None if kind is None else _q(f"{kind}:")
        items = self._query(pk=_outbox_scope_pk(scope), limit=limit, sk_prefix=prefix)
        return [self._outbox_item(i) for i in items]

    def outbox_done_all(self, items: Sequence[OutboxItem]) -> None:
        for item in items:
            self.outbox_done(item)

    def outbox_done(self, item: OutboxItem) -> None:
        # The item's three entries follow from the item itself: deleting them needs no read
        # first (a delete of an entry already gone is a no-op, so this stays idempotent).
        queue, index, in_scope = _outbox_keys(item)
        self._read(
            lambda: self.dynamodb.transact_write_items(
                TransactItems=[
                    {"Delete": {"TableName": self.table_name, "Key": key}}
                    for key in (index, in_scope, queue)
                ]
            )
        )

    def outbox_holds(self, item: OutboxItem) -> bool:
        return self.outbox_has(item.scope, item.kind, item.target)  # its index entry, one Query

    def outbox_has(self, scope: Scope, kind: str, target: str) -> bool:
        return any(True for _ in self._query(pk=_outbox_index_pk(scope, kind, target), limit=1))

    # -- the operations plane (operators only: these Scan, never on a request path) ------------

    def _scan(self, kind: str, scope: Scope | None, extra: Mapping[str, str]) -> Iterator[Item]:
        """Every item of ``kind`` (of ``scope`` when given, with each ``extra`` attribute equal to
        its value): a filtered, paged, consistent Scan of the whole table."""
        names = {"#kind": "kind"}
        values: dict[str, AttributeValueTypeDef] = {":kind": _s(kind)}
        conditions = ["#kind = :kind"]
        wanted = dict(extra)
        if scope is not None:
            wanted.update(tenant_id=scope.tenant_id, workspace_id=scope.workspace_id)
        for index, (name, value) in enumerate(sorted(wanted.items())):
            names[f"#a{index}"] = name
            values[f":a{index}"] = _s(value)
            conditions.append(f"#a{index} = :a{index}")
        start: Item | None = None
        while True:
            kwargs: dict[str, Any] = {
                "TableName": self.table_name,
                "ConsistentRead": True,
                "FilterExpression": " AND ".join(conditions),
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            response = self._read(self.dynamodb.scan, **kwargs)
            yield from response.get("Items", [])
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            start = last

    def scopes(self) -> list[Scope]:
        found = {
            Scope(_get_s(item, "tenant_id"), _get_s(item, "workspace_id"))
            for item in self._scan("head", None, {})
        }
        return sorted(found, key=lambda scope: (scope.tenant_id, scope.workspace_id))

    def candidates_list(
        self, scope: Scope, state: str | None, after: str, limit: int
    ) -> list[CandidateRow]:
        extra = {} if state is None else {"state": state}
        ids = sorted(
            _get_s(item, "candidate_id")
            for item in self._scan("candidate", scope, extra)
            if _get_s(item, "candidate_id") > after
        )[: max(limit, 0)]
        # Read again by key: a scanned item may hold its sealed blob in S3.
        rows = [self.candidate_get(scope, candidate_id) for candidate_id in ids]
        return [row for row in rows if row is not None]

    def records_list(
        self, scope: Scope, state: str | None, after: str, limit: int
    ) -> list[RecordRow]:
        extra = {} if state is None else {"state": state}
        ids = sorted(
            _get_s(item, "record_id")
            for item in self._scan("record", scope, extra)
            if _get_s(item, "record_id") > after
        )[: max(limit, 0)]
        found = self.records_get(scope, ids)
        return [found[record_id] for record_id in ids if record_id in found]

    def revoke_credentials(self, tenant_id: str, kind: str, value: str, at_ms: int) -> int:
        item: Item = {
            **_revocation_key(tenant_id, kind, value),
            "kind": _s("revocation"),
            "tenant_id": _s(tenant_id),
            "revoked_kind": _s(kind),
            "value": _s(value),
            "revoked_at_ms": _n(at_ms),
        }
        # a token's first revocation stands; a principal's moves forward (`#at < :at`)
        later = "principal" if kind == "principal" else "never"
        try:
            self.dynamodb.put_item(
                TableName=self.table_name,
                Item=item,
                ConditionExpression="attribute_not_exists(#at) OR (#at < :at AND #k = :later)",
                ExpressionAttributeNames={"#at": "revoked_at_ms", "#k": "revoked_kind"},
                ExpressionAttributeValues={":at": _n(at_ms), ":later": _s(later)},
            )
        except ClientError as exc:
            if error_code(exc) == CONDITION_FAILED:
                standing = self._batch_get([_revocation_key(tenant_id, kind, value)])
                return _get_n(standing[0], "revoked_at_ms") if standing else at_ms
            raise StoreUnavailable("dynamodb store unavailable") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable("dynamodb store unavailable") from exc
        finally:
            self._revocations.clear()  # this process sees its own revocation at once
        return at_ms

    def credential_revoked(
        self, tenant_id: str, token_id: str | None, principal: str, issued_at_ms: int
    ) -> bool:
        """Whether the token is revoked; a "no" is trusted for ``revocation_cache_s``."""
        key = (tenant_id, token_id, principal, issued_at_ms)
        cached = self._revocations.get(key)
        now = time.monotonic()
        if cached is not None and (cached[0] or now - cached[1] < self._revocation_cache_s):
            return cached[0]
        revoked = self._read_revoked(tenant_id, token_id, principal, issued_at_ms)
        if len(self._revocations) >= _REVOCATION_CACHE_MAX:
            self._revocations.clear()
        self._revocations[key] = (revoked, now)
        return revoked

    def _read_revoked(
        self, tenant_id: str, token_id: str | None, principal: str, issued_at_ms: int
    ) -> bool:
        keys = [_revocation_key(tenant_id, "principal", principal)]
        if token_id is not None:
            keys.append(_revocation_key(tenant_id, "token", token_id))
        for item in self._batch_get(keys):
            if _get_s(item, "revoked_kind") == "token":
                return True
            if _get_n(item, "revoked_at_ms") >= issued_at_ms:
                return True
        return False

    def state_counts(self, scope: Scope) -> dict[str, int]:
        counts: dict[str, int] = {}
        for prefix in ("candidate", "record"):
            for item in self._scan(prefix, scope, {}):
                name = f"{prefix}:{_get_s(item, 'state')}"
                counts[name] = counts.get(name, 0) + 1
        for item in self._query(pk=_outbox_scope_pk(scope), limit=_COUNT_LIMIT):
            name = f"outbox:{_get_s(item, 'outbox_kind')}"
            counts[name] = counts.get(name, 0) + 1
        return counts

    # -- the commit ----------------------------------------------------------------------------

    def commit(self, changes: ChangeSet) -> None:
        plan = self._plan(changes)
        for key, data in plan.blobs.items():
            try:
                self.s3.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=data,
                    ContentType="application/octet-stream",
                )
            except (ClientError, BotoCoreError) as exc:
                raise StoreUnavailable("blob store unavailable") from exc
        self._transact(plan)
        for key in plan.shredded:
            self._delete_shredded_blob(key)

    def _transact(self, plan: _Plan) -> None:
        try:
            self.dynamodb.transact_write_items(
                TransactItems=plan.items, ClientRequestToken=plan.token()
            )
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = error.get("Code", "")
            if code == "TransactionCanceledException":
                reason = _conflict_reason(exc.response, error.get("Message", ""), plan.reasons)
                if reason is not None:
                    raise CommitConflict(reason) from None
                raise StoreUnavailable("transaction cancelled") from exc
            if code in _UNKNOWN_OUTCOME_CODES:
                raise CommitOutcomeUnknown("dynamodb commit outcome unknown") from exc
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code not in _UNAVAILABLE_CODES and status >= 500 and status != 503:
                raise CommitOutcomeUnknown("dynamodb commit outcome unknown") from exc
            raise StoreUnavailable("dynamodb store unavailable") from exc
        except HTTPClientError as exc:
            # The request was sent (or being sent): a read timeout or a dropped connection
            # leaves its outcome unknown.
            raise CommitOutcomeUnknown("dynamodb commit outcome unknown") from exc
        except BotoCoreError as exc:
            # Could not connect, no credentials, invalid parameters: nothing reached DynamoDB.
            raise StoreUnavailable("dynamodb store unavailable") from exc

    def _plan(self, changes: ChangeSet) -> _Plan:
        """The transaction of ``changes``, in the SQLite store's order of conditions."""
        plan = _Plan()
        self._plan_head(plan, changes)
        self._plan_ledger(plan, changes)
        self._plan_event(plan, changes)
        self._plan_candidate(plan, changes)
        self._plan_record(plan, changes)
        self._plan_tombstone(plan, changes)
        self._plan_approval(plan, changes)
        self._plan_outbox(plan, changes)
        return plan

    def _plan_head(self, plan: _Plan, changes: ChangeSet) -> None:
        """The journal head: the optimistic fence every commit carries."""
        scope, expected, event = changes.scope, changes.expected_head, changes.event
        if expected is None:
            return  # no event (``ChangeSet.__post_init__``): nothing to fence
        names = {"#pk": "pk"} if expected.cursor == 0 else {"#c": "cursor", "#h": "event_hash"}
        condition = "attribute_not_exists(#pk)" if expected.cursor == 0 else "#c = :c AND #h = :h"
        values: dict[str, AttributeValueTypeDef] = (
            {}
            if expected.cursor == 0
            else {":c": _n(expected.cursor), ":h": _s(expected.event_hash)}
        )
        if event is not None:
            item: Item = {
                **_head_key(scope),
                **_scoped(scope, "head"),
                "cursor": _n(event.cursor),
                "event_hash": _s(event.event_hash),
            }
            put: TransactWriteItemTypeDef = {
                "Put": {
                    "TableName": self.table_name,
                    "Item": item,
                    "ConditionExpression": condition,
                    "ExpressionAttributeNames": names,
                }
            }
            if values:
                put["Put"]["ExpressionAttributeValues"] = values
            plan.add(put, "head")
            return
        check: TransactWriteItemTypeDef = {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": _head_key(scope),
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
            }
        }
        if values:
            check["ConditionCheck"]["ExpressionAttributeValues"] = values
        plan.add(check, "head")

    def _plan_ledger(self, plan: _Plan, changes: ChangeSet) -> None:
        """The ledger entry: the idempotency key must be free."""
        scope, entry = changes.scope, changes.ledger
        item: Item = {
            **_ledger_key(scope, entry.principal, entry.idempotency_key),
            **_scoped(scope, "ledger"),
            "principal": _s(entry.principal),
            "idempotency_key": _s(entry.idempotency_key),
            "tool": _s(entry.tool),
            "intent_hash": _s(entry.intent_hash),
            "cursor": _n(entry.cursor),
        }
        if entry.target is not None:
            item["target"] = _s(entry.target)
        self._large(plan, scope, item, "output", entry.output)
        plan.add(_put_new(self.table_name, item), "ledger")

    def _plan_event(self, plan: _Plan, changes: ChangeSet) -> None:
        event = changes.event
        if event is None:
            return
        item: Item = {
            **_event_key(changes.scope, event.cursor),
            **_scoped(changes.scope, "event"),
            "cursor": _n(event.cursor),
            "event_hash": _s(event.event_hash),
            "body": _b(event.body),
        }
        plan.add(_put_new(self.table_name, item), "head")

    def _plan_candidate(self, plan: _Plan, changes: ChangeSet) -> None:
        """A new candidate control row (its id must be free), or a state transition."""
        scope = changes.scope
        if changes.new_candidate is not None:
            c = changes.new_candidate
            item: Item = {
                **_candidate_key(scope, c.candidate_id),
                **_scoped(scope, "candidate"),
                "candidate_id": _s(c.candidate_id),
                "principal": _s(c.principal),
                "state": _s(c.state),
                "payload_digest": _s(c.payload_digest),
                "record_digest": _s(c.record_digest),
                "record_id": _s(c.record_id),
                "capture_cursor": _n(c.capture_cursor),
                "key_ref": _s(c.key_ref),
                "policy_version": _s(c.policy_version),
                "created_at_ms": _n(c.created_at_ms),
            }
            self._large(plan, scope, item, "sealed", c.sealed)
            plan.add(_put_new(self.table_name, item), "ledger")
        if changes.candidate_transition is not None:
            move = changes.candidate_transition
            key = _candidate_key(scope, move.target_id)
            transition = _transition(self.table_name, key, move, shred=False, candidate=True)
            if changes.unless_held:
                update = transition["Update"]
                update["ConditionExpression"] += " AND attribute_not_exists(#held)"
            plan.add(transition, "state")
        if changes.hold is not None:
            plan.add(
                _hold(
                    self.table_name, _candidate_key(scope, changes.hold.candidate_id), changes.hold
                ),
                "state",
            )

    def _plan_record(self, plan: _Plan, changes: ChangeSet) -> None:
        """A new record (its id must be free), or a state transition that may shred the body."""
        scope = changes.scope
        if changes.new_record is not None:
            r = changes.new_record
            item: Item = {
                **_record_key(scope, r.record_id),
                **_scoped(scope, "record"),
                "record_id": _s(r.record_id),
                "state": _s(r.state),
                "record_digest": _s(r.record_digest),
                "payload_digest": _s(r.payload_digest),
                "candidate_id": _s(r.candidate_id),
                "valid_from_ms": _n(r.valid_from_ms),
                "accepted_cursor": _n(r.accepted_cursor),
            }
            if r.valid_to_ms is not None:
                item["valid_to_ms"] = _n(r.valid_to_ms)
            if r.expires_at_ms is not None:
                item["expires_at_ms"] = _n(r.expires_at_ms)
            if r.body is not None:
                self._large(plan, scope, item, "body", r.body)
            plan.add(_put_new(self.table_name, item), "state")
        if changes.record_transition is None:
            return
        move = changes.record_transition
        key = _record_key(scope, move.target_id)
        shred = changes.shred_record_body
        plan.add(_transition(self.table_name, key, move, shred=shred), "state")
        blob = self._body_ref(key) if shred else None
        if blob is not None:
            # The object is deleted after the commit; the marker makes that deletion durable.
            plan.shredded.append(blob)
            marker: Item = {
                **_key(_BLOB_GC_PK, blob),
                **_scoped(scope, "blob_gc"),
                "record_id": _s(move.target_id),
            }
            plan.add({"Put": {"TableName": self.table_name, "Item": marker}}, "state")

    def _plan_tombstone(self, plan: _Plan, changes: ChangeSet) -> None:
        """The tombstone index entry (by payload digest), for the tombstone guard."""
        digest, move = changes.tombstone_payload_digest, changes.record_transition
        if digest is None or move is None:
            return
        item: Item = {
            **_key(_tombstone_pk(changes.scope, digest), _q(move.target_id)),
            **_scoped(changes.scope, "tombstone"),
            "payload_digest": _s(digest),
            "record_id": _s(move.target_id),
            "cursor": _n(changes.event.cursor if changes.event else 0),
        }
        plan.add({"Put": {"TableName": self.table_name, "Item": item}}, "state")

    def _plan_approval(self, plan: _Plan, changes: ChangeSet) -> None:
        """The used approval: single use, across every scope."""
        if changes.approval_id is None:
            return
        cursor = changes.event.cursor if changes.event else 0
        item = _approval_item(changes.scope, changes.approval_id, cursor)
        plan.add(_put_new(self.table_name, item), "approval")

    def _plan_outbox(self, plan: _Plan, changes: ChangeSet) -> None:
        """Each outbox item: a queue entry in the fixed partition, its per-target index entry
        and its scope entry."""
        for outbox in {i.item_id: i for i in changes.outbox}.values():
            fields: Item = {
                **_scoped(outbox.scope, "outbox"),
                "item_id": _s(outbox.item_id),
                "outbox_kind": _s(outbox.kind),
                "target": _s(outbox.target),
                "surface": _s(outbox.surface),
                "enqueued_at_ms": _n(outbox.enqueued_at_ms),
            }
            queue, index, in_scope = _outbox_keys(outbox)
            for item in (
                {**queue, **fields},
                {**index, **fields, "kind": _s("outbox_index")},
                {**in_scope, **fields, "kind": _s("outbox_scope")},
            ):
                plan.add({"Put": {"TableName": self.table_name, "Item": item}}, "state")

    def _body_ref(self, record_key: Item) -> str | None:
        """The S3 key of a record's body, if it lives in S3 (it never changes once written)."""
        response = self._read(
            lambda: self.dynamodb.get_item(
                TableName=self.table_name,
                Key=record_key,
                ConsistentRead=True,
                ProjectionExpression="#ref",
                ExpressionAttributeNames={"#ref": "body_ref"},
            )
        )
        item = response.get("Item")
        return None if item is None else _opt_s(item, "body_ref")

    # -- shredded blobs ------------------------------------------------------------------------

    def _delete_shredded_blob(self, key: str) -> bool:
        """Delete a shredded body's object, then its marker; False (marker kept) on failure."""
        try:
            self.s3.delete_object(Bucket=self.bucket, Key=key)
            self.dynamodb.delete_item(TableName=self.table_name, Key=_key(_BLOB_GC_PK, key))
        except (ClientError, BotoCoreError):
            log.warning("a shredded blob awaits deletion", extra={"blob": key})
            return False
        return True

    def collect_shredded_blobs(self, limit: int = 100) -> int:
        """Finish the deletion of shredded bodies whose post-commit deletion failed.

        Returns how many were deleted. Meant for a scheduled or operator call.
        """
        done = 0
        for item in list(self._query(pk=_BLOB_GC_PK, limit=limit)):
            if self._delete_shredded_blob(_get_s(item, "sk")):
                done += 1
        return done

    # -- inspection for operators and tests ------------------------------------------------------

    def table_snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every item of the table and every object of the bucket (key and bytes), sorted.

        Scans the whole table: for operators and tests, never for a request path.
        """
        items: list[tuple[Any, ...]] = []
        start: Item | None = None
        while True:
            kwargs: dict[str, Any] = {"TableName": self.table_name, "ConsistentRead": True}
            if start is not None:
                kwargs["ExclusiveStartKey"] = start
            response = self._read(self.dynamodb.scan, **kwargs)
            for item in response.get("Items", []):
                items.append(tuple(sorted((name, _plain(v)) for name, v in item.items())))
            last = response.get("LastEvaluatedKey")
            if not last:
                break
            start = last
        blobs: list[tuple[Any, ...]] = []
        token: str | None = None
        while True:
            list_kwargs: dict[str, Any] = {"Bucket": self.bucket}
            if token is not None:
                list_kwargs["ContinuationToken"] = token
            listing = self._read(self.s3.list_objects_v2, **list_kwargs)
            for obj in listing.get("Contents", []):
                key = obj["Key"]
                blobs.append((key, self._fetch_blob(key)))
            if not listing.get("IsTruncated"):
                break
            token = listing.get("NextContinuationToken")
        return {"items": sorted(items, key=repr), "blobs": sorted(blobs, key=repr)}


def _new_session(region_name: str | None) -> Session:
    import boto3

    return boto3.session.Session(region_name=region_name)


def _put_new(table: str, item: Item) -> TransactWriteItemTypeDef:
    return {
        "Put": {
            "TableName": table,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(#pk)",
            "ExpressionAttributeNames": {"#pk": "pk"},
        }
    }


def _transition(
    table: str, key: Item, move: StateTransition, *, shred: bool, candidate: bool = False
) -> TransactWriteItemTypeDef:
    names = {"#state": "state"}
    removed = []
    if shred:
        removed += ["body", "body_ref"]
    if candidate:  # a candidate leaving pending: a policy's hold on it ends
        removed.append("held")
    names.update({f"#{name}": name for name in removed})
    update = "SET #state = :to"
    if removed:
        update += " REMOVE " + ", ".join(f"#{name}" for name in removed)
    return {
        "Update": {
            "TableName": table,
            "Key": key,
            "UpdateExpression": update,
            "ConditionExpression": "#state = :from",
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": {":to": _s(move.to_state), ":from": _s(move.from_state)},
        }
    }


def _hold(table: str, key: Item, hold: CandidateHold) -> TransactWriteItemTypeDef:
    """A policy's hold on a candidate that must still be pending."""
    return {
        "Update": {
            "TableName": table,
            "Key": key,
            "UpdateExpression": "SET #held = :held",
            "ConditionExpression": "#state = :pending",
            "ExpressionAttributeNames": {"#held": "held", "#state": "state"},
            "ExpressionAttributeValues": {
                ":held": _s(hold.decision_receipt_digest),
                ":pending": _s("pending"),
            },
        }
    }


def _conflict_reason(
    response: Mapping[str, Any], message: str, reasons: Sequence[ConflictReason]
) -> ConflictReason | None:
    """The conflict reason of the first item whose condition failed; ``head`` when none failed
    but a concurrent transaction conflicted; None otherwise (throttling, validation...)."""
    codes: list[str]
    cancellation = response.get("CancellationReasons")
    if isinstance(cancellation, list):
        codes = [str(reason.get("Code", "None")) for reason in cancellation]
    else:
        # Older SDKs only carry the reasons in the message: "... [None, ConditionalCheckFailed]".
        start, end = message.rfind("["), message.rfind("]")
        codes = [c.strip() for c in message[start + 1 : end].split(",")] if start < end else []
    for index, code in enumerate(codes):
        if code == "ConditionalCheckFailed" and index < len(reasons):
            return reasons[index]
    if "TransactionConflict" in codes and set(codes) <= {"None", "TransactionConflict"}:
        return "head"  # a concurrent writer of the same items: retried like a moved head
    return None  # throttling, validation...: refused, not contended


# --------------------------------------------------------------------------------------------
# Provisioning helpers (tests and local tooling; the SAM template owns the real resources)
# --------------------------------------------------------------------------------------------


def create_tables(dynamodb: DynamoDBClient, table_name: str) -> None:
    """Create the canonical table as the SAM template defines it (keys, billing, TTL)."""
    dynamodb.create_table(
        TableName=table_name,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.get_waiter("table_exists").wait(
        TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 60}
    )
    dynamodb.update_time_to_live(
        TableName=table_name,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"},
    )


def create_bucket(s3: S3Client, bucket: str, region_name: str = "us-east-1") -> None:
    """Create the blob bucket (private; default encryption is the template's business)."""
    if region_name == "us-east-1":
        s3.create_bucket(Bucket=bucket)
    else:
        s3.create_bucket(
            Bucket=bucket,
            CreateBucketConfiguration={
                "LocationConstraint": cast("BucketLocationConstraintType", region_name)
            },
        )
    s3.put_public_access_block(
        Bucket=bucket,
        PublicAccessBlockConfiguration={
            "BlockPublicAcls": True,
            "IgnorePublicAcls": True,
            "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True,
        },
    )


def _conforms(store: DynamoStore) -> Store:
    return store  # mypy checks that DynamoStore implements the Store port

"""The kernel every use case runs on: the ports, and the plumbing they share.

Ledger look-ups and replays, the confirmation gate, the optimistic commit loop, receipts, the
outbox, revalidation of stored records. The use cases in ``engine.usecases`` are written against
this class; ``engine.service.Engine`` adds the entry point.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypeVar

from engram_memory.contract.canonical import digest
from engram_memory.contract.errors import (
    EngramError,
    ErrorCode,
    RefusalReason,
    TrustedContextUnavailable,
    Violation,
)
from engram_memory.contract.models import ClosedModel
from engram_memory.contract.packing import pack, unpack
from engram_memory.contract.types import format_instant
from engram_memory.engine import lexical
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.gate import (
    Approval,
    ConfirmationRequest,
    approval_conflict,
    check_approval,
)
from engram_memory.engine.idle import ExpectedAdmission, ExpectedAdmissions, IdleWork
from engram_memory.engine.journal import build_event
from engram_memory.engine.keyring import KeyRing
from engram_memory.engine.ports import (
    RECORD_KEY_TARGET,
    AdmissionPolicy,
    AdmissionRequest,
    AnticipatingPolicy,
    AuditEvent,
    AuditSink,
    CandidateRow,
    ChangeSet,
    Clock,
    CommitConflict,
    CommitOutcomeUnknown,
    CommittedAuditLog,
    Embedder,
    EmbedderUnavailable,
    IndexUnavailable,
    JournalEvent,
    JournalHead,
    KeyDestroyed,
    LedgerEntry,
    LexicalIndex,
    OutboxItem,
    PolicyUnavailable,
    ProjectionChange,
    ProjectionDoc,
    ProjectionSurface,
    RecordKeys,
    RecordRow,
    SealedBlob,
    SealIntegrityError,
    Store,
    StoreUnavailable,
    Vault,
    VaultUnavailable,
    VectorIndex,
)
from engram_memory.engine.records import (
    decode,
    encode,
    receipt,
    record_digest_matches,
    record_text,
    scope_ref,
    stored_body_matches,
)
from engram_memory.engine.redaction import RedactionPolicy
from engram_memory.engine.semantic import record_vector

log = logging.getLogger(__name__)

TRANSPORT_CEILING_BYTES: Final = 1_048_576
RECORD_STATES_FORGETTABLE: Final = frozenset(
    {"accepted_current", "accepted_disputed", "historical", "expired", "trust_invalid"}
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EngineSettings:
    # authenticates search page cursors; shared by every instance of a host (a KeyRing when it
    # rotates: the cloud host's cursor secret)
    cursor_key: bytes | KeyRing
    redaction: RedactionPolicy = field(default_factory=RedactionPolicy.from_allowlist)
    # How many index hits a search ranks and revalidates: ``rank_pages`` pages of the request's
    # ``limit`` (so paging reaches that many pages), at least ``min_rank_depth`` and at most
    # ``rank_depth``. Every hit ranked is revalidated, so the depth is the read cost of a search.
    rank_depth: int = 1000
    rank_pages: int = 10
    min_rank_depth: int = 100
    # How often a use case re-runs when the state it read moved under it (a ledger, state or
    # approval conflict): it then replays or refuses, so a few attempts suffice.
    commit_attempts: int = 8
    # Writers of one scope in other processes (a moved journal head, a DynamoDB
    # TransactionConflict) are waited out with jittered backoff until the call's deadline
    # (DEADLINE_EXCEEDED); a call without a deadline waits this long at most (FENCE_LOST).
    contention_budget_ms: int = 30_000
    contention_backoff_cap_ms: int = 1_000
    # An envelope larger than this cannot cross the transport: RESULT_TOO_LARGE.
    transport_ceiling_bytes: int = TRANSPORT_CEILING_BYTES
    # With a semantic channel: how the two lists are fused (engine/semantic.py), and whether
    # search ranks by the semantic list alone (diagnostics and benchmarks).
    fusion: Literal["minmax", "rrf"] = "minmax"
    semantic_mode: Literal["hybrid", "semantic_only"] = "hybrid"
    # Time-aware ranking (engine/temporal.py): a query's dates matched against valid_time.
    time_aware: bool = True


@dataclass(frozen=True, slots=True)
class JournalStep:
    """One commit's journal event (``Kernel.journal_step``), with what its output quotes."""

    operation: str
    event: JournalEvent
    event_id: str
    transaction_receipt_digest: str


class StateMoved(Exception):
    """A commit condition on the target's state or the ledger failed: re-run the use case."""


class ApprovalNeeded(Exception):
    """The use case needs a human approval the call was not given (before any write).

    ``Engine.handle`` turns it into its ``ConfirmationNeeded`` answer.
    """

    def __init__(self, request: ConfirmationRequest) -> None:
        super().__init__("approval needed")
        self.request = request


# A candidate's sealed message and the plaintext it seals (``Kernel.seal``).
Sealed = tuple[SealedBlob, bytes]


@dataclass(slots=True)
class Call:
    tool: str
    ctx: TrustedContext
    now_ms: int
    approval: Approval | None = None  # the human's approval the transport obtained, if any
    target: str | None = None
    digests: dict[str, str] = field(default_factory=dict)
    # An operator's reason for the step: kept in its ledger entry, so the record's history can
    # say why (a terminal transition journals it too: ``journal.WHY_FIELDS``); an agent's call
    # has none.
    reason: str | None = None
    # An agent's call (``Engine.handle``) whose audit log takes lines in the store's commit
    # (``CommittedAuditLog``): its commit carries its audit line, which ``audited`` then says.
    audit_in_commit: bool = False
    audited: bool = False
    # What the capture handed on for this admission (``Kernel.open_candidate``), if anything.
    expected: ExpectedAdmission | None = field(default=None, repr=False)

    @property
    def scope(self) -> Scope:
        return self.ctx.scope


class Kernel:
    """Ports, settings and shared plumbing (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        vault: Vault,
        record_keys: RecordKeys,
        lexical_index: LexicalIndex,
        admission_policy: AdmissionPolicy,
        clock: Clock,
        audit: AuditSink,
        settings: EngineSettings,
        extra_projections: Sequence[ProjectionSurface] = (),
        embedder: Embedder | None = None,
        vector_index: VectorIndex | None = None,
    ) -> None:
        self.store = store
        self.vault = vault
        self.record_keys = record_keys
        self.lexical = lexical_index
        self.policy = admission_policy
        self.clock = clock
        self.audit = audit
        # The audit log that takes committed mutations' lines from the store's commit, decided
        # once here (a runtime Protocol check costs on every call of the hot path).
        self.committed_audit: CommittedAuditLog | None = (
            audit if isinstance(audit, CommittedAuditLog) else None
        )
        self.settings = settings
        # The semantic channel: an embedder and a vector index. An index that holds vectors in
        # its own documents (OpenSearch) serves as both the lexical and the vector index.
        if vector_index is None and embedder is not None and isinstance(lexical_index, VectorIndex):
            vector_index = lexical_index
        self.embedder = embedder
        self.vectors = vector_index
        # Projection surfaces the engine must update itself after a commit (e.g. OpenSearch);
        # surfaces the store maintains inside its own transaction need nothing more.
        surfaces: list[ProjectionSurface] = [lexical_index, *extra_projections]
        if vector_index is not None and all(vector_index is not s for s in surfaces):
            surfaces.append(vector_index)
        self.surfaces: tuple[ProjectionSurface, ...] = tuple(surfaces)
        self._scope_locks: dict[Scope, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self.idle = IdleWork()
        self.expected = ExpectedAdmissions(self.idle)

    def search_depth(self, limit: int) -> int:
        """How many hits a search with page size ``limit`` ranks (``EngineSettings.rank_depth``)."""
        settings = self.settings
        return min(settings.rank_depth, max(settings.min_rank_depth, limit * settings.rank_pages))

    @property
    def semantic_available(self) -> bool:
        """Whether this host has a semantic channel (an embedder and a vector index)."""
        return self.embedder is not None and self.vectors is not None

    def projection_doc(self, record_id: str, record: Mapping[str, Any]) -> ProjectionDoc:
        """What the projection surfaces index for an accepted record: the lexical fields and,
        with a semantic channel, the record's vector. An embedder failure leaves the vector out
        (logged): like a lagging index, the record is then only missing from semantic hits."""
        vector = None
        if self.embedder is not None:
            try:
                vector = record_vector(self.embedder, record)
            except EmbedderUnavailable:
                log.warning("record projected without a vector", extra={"record_id": record_id})
        return ProjectionDoc(
            record_id, lexical.projection_fields(record), vector, record_text(record)
        )

    @staticmethod
    def read(fetch: Callable[[], T]) -> T:
        try:
            return fetch()
        except StoreUnavailable:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None

    def check_live(self, call: Call) -> None:
        ctx = call.ctx
        if ctx.cancellation is not None and ctx.cancellation.cancelled:
            raise EngramError(ErrorCode.CANCELLED)
        if ctx.deadline_ms is not None and self.clock.now_ms() >= ctx.deadline_ms:
            raise EngramError(ErrorCode.DEADLINE_EXCEEDED)

    def check_revoked(self, call: Call) -> None:
        """``AUTHORIZATION_REVOKED`` once an operator revoked the call's token or its principal's
        tokens (``operations.revoke_credentials``), in every composition."""
        if self.credential_revoked(call.ctx):
            raise EngramError(ErrorCode.AUTHORIZATION_REVOKED)

    def credential_revoked(self, ctx: TrustedContext) -> bool:
        """Whether an operator revoked the token ``ctx`` came from (or its principal's tokens):
        read per call here, and by a host's HTTP transport to answer a 401 that says so."""
        issued_at_ms = ctx.credential_issued_at_ms
        if issued_at_ms is None:
            return False
        return self.read(
            lambda: self.store.credential_revoked(
                ctx.tenant_id, ctx.credential_id, ctx.principal, issued_at_ms
            )
        )

    def revoke_credentials(
        self, tenant_id: str, kind: Literal["token", "principal"], value: str, at_ms: int
    ) -> int:
        """Revoke one token (``kind`` ``token``, ``value`` its ``jti``) or every token a
        principal holds at ``at_ms``: an operator's decision, which ``credential_revoked`` reads
        on every call from then on. Returns the revocation's instant: a token's first."""
        return self.read(lambda: self.store.revoke_credentials(tenant_id, kind, value, at_ms))

    @staticmethod
    def check_purpose(call: Call, purpose_ref: str) -> None:
        if purpose_ref != call.ctx.purpose_ref:
            raise TrustedContextUnavailable(RefusalReason.PURPOSE_MISMATCH)

    def mutation(self, call: Call, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        for _ in range(self.settings.commit_attempts):
            try:
                return run()
            except StateMoved:
                continue
        raise EngramError(ErrorCode.FENCE_LOST)

    def intent(self, call: Call, model: ClosedModel, target: str | None) -> str:
        intent = _call_digest(
            "intent", call, model, target, purpose=call.ctx.purpose_ref, scope=scope_ref(call.scope)
        )
        call.digests["intent_hash"] = intent
        return intent

    def prior(
        self, call: Call, args: ClosedModel, key: str, target: str | None
    ) -> tuple[str, dict[str, Any] | None]:
        """The call's intent hash, and the output of the first call made with its idempotency
        ``key`` when there was one (the call is then a replay; DIGEST_CONFLICT when it asks for
        something else)."""
        intent = self.intent(call, args, target)
        entry = self.ledger(call, key, target, intent)
        return intent, None if entry is None else decode(entry.output)

    def ledger(self, call: Call, key: str, target: str | None, intent: str) -> LedgerEntry | None:
        entry = self.read(lambda: self.store.ledger_get(call.scope, call.ctx.principal, key))
        if entry is None:
            return None
        if entry.tool != call.tool or entry.target != target or entry.intent_hash != intent:
            raise EngramError(ErrorCode.DIGEST_CONFLICT)
        return entry

    def confirm(
        self, call: Call, model: ClosedModel, target: str | None, reason_ref: str | None
    ) -> Approval | None:
        """Check the call's approval when the tool needs one (before any write).

        Without one the use case stops here (``ApprovalNeeded``): the transport asks the human
        and calls again with the answer (``engine.gate``).
        """
        if not call.ctx.needs_confirmation(call.tool):
            call.approval = None  # an approval nobody asked for authorizes nothing
            return None
        operation_digest = _call_digest(
            "operation",
            call,
            model,
            target,
            scope={"tenant_id": call.ctx.tenant_id, "workspace_id": call.ctx.workspace_id},
            principal=call.ctx.principal,
        )
        request = ConfirmationRequest(
            tool=call.tool,
            target=target,
            operation_digest=operation_digest,
            principal=call.ctx.principal,
            scope=call.scope,
            reason_ref=reason_ref,
            summary=_summary(call, target, reason_ref),
        )
        if call.approval is None:
            raise ApprovalNeeded(request)
        check_approval(call.approval, request, self.clock.now_ms())
        call.digests["operation_digest"] = operation_digest
        return call.approval

    def _scope_lock(self, scope: Scope) -> threading.Lock:
        with self._locks_guard:
            return self._scope_locks.setdefault(scope, threading.Lock())

    def commit(self, call: Call, build: Callable[[JournalHead], ChangeSet]) -> ChangeSet:
        """Build and commit a change set against the current head, retrying when the head moved.

        Writers of one scope in this process queue on a lock, so the optimistic head check only
        has to absorb writers in other processes: retried with jittered backoff for as long as
        the call may run (``_Contention``), so contention queues instead of failing.
        """
        with self._scope_lock(call.scope):
            return self._commit_locked(call, build)

    def _commit_locked(self, call: Call, build: Callable[[JournalHead], ChangeSet]) -> ChangeSet:
        contention = _Contention(self, call)
        while True:
            self.check_live(call)
            head = self.read(lambda: self.store.head(call.scope))
            changes = build(head)
            if contention.contended and self._head_moved(call, head):
                # Under contention building takes long enough for another writer to land: a
                # head read is far cheaper than a transaction its condition would refuse.
                contention.back_off()
                continue
            audit_line = self._audit_line(call)
            try:
                self.store.commit(changes if audit_line is None else _with(changes, audit_line))
            except CommitConflict as conflict:
                if conflict.reason == "head":
                    contention.back_off()
                    continue
                if conflict.reason == "approval":
                    raise approval_conflict() from None
                raise StateMoved() from None
            except StoreUnavailable:
                raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
            except CommitOutcomeUnknown:
                raise EngramError(ErrorCode.MUTATION_OUTCOME_UNKNOWN) from None
            if audit_line is not None:
                call.audited = True
                self._follow_audit(audit_line)
            return changes

    def audit_event(
        self, call: Call, *, ok: bool, code: str, violation: Violation | None = None
    ) -> AuditEvent:
        """The audit line of ``call`` with this outcome (who and where from its context)."""
        return AuditEvent.of_call(
            call.ctx,
            at_ms=call.now_ms,
            tool=call.tool,
            ok=ok,
            code=code,
            target=call.target,
            digests=dict(call.digests),
            violation=violation,
        )

    def _audit_line(self, call: Call) -> OutboxItem | None:
        """The outbox item carrying ``call``'s audit line (its outcome: committed, ``OK``),
        when its commit is to carry it."""
        if not call.audit_in_commit or call.audited:
            return None
        line = self.audit_event(call, ok=True, code="OK").as_json_line()
        return OutboxItem(
            item_id=f"audit_line:{call.ctx.audit_id}",
            kind="audit_line",
            scope=call.scope,
            target=line,
            enqueued_at_ms=call.now_ms,
        )

    def _follow_audit(self, item: OutboxItem) -> None:
        """Hand the committed line to the audit log (it syncs it later), then drop the items
        of the lines it has synced since. A failure here loses nothing: the line is in the
        store's outbox, and the drainer appends it (``drain_outbox``)."""
        assert self.committed_audit is not None  # only then does a commit carry a line
        try:
            self.committed_audit.follow(item, self._audit_owed)
        except Exception:
            log.exception("audit log unavailable", extra={"audit_id": item.item_id})
        self.settle_audit()

    def settle_audit(self, *, sync: bool = False) -> None:
        """Drop from the outbox the audit lines the log has made durable since; with ``sync``,
        first make durable every line this process appended (a host closing)."""
        if self.committed_audit is None:
            return
        if sync:
            self._recover_audit(())
        self._settle_audit_items(self.committed_audit.take_settled())

    def _settle_audit_items(self, items: Sequence[OutboxItem]) -> None:
        try:
            self.store.outbox_done_all(items)
        except StoreUnavailable:
            return  # still owed: the next drain finds them written and drops them

    def _audit_owed(self, item: OutboxItem) -> bool:
        return self.store.outbox_holds(item)

    def _recover_audit(self, items: Sequence[OutboxItem]) -> None:
        """Lines left in the outbox (a crash, or a committer in another process that has not
        synced them yet) made durable in the audit log once."""
        if self.committed_audit is None:
            return
        try:
            self.committed_audit.recover(items, self._audit_owed, self._settle_audit_items)
        except (OSError, StoreUnavailable):
            log.warning("audit lines stay in the outbox until the next drain")

    def _head_moved(self, call: Call, head: JournalHead) -> bool:
        return self.read(lambda: self.store.head(call.scope)) != head

    def ledger_entry(
        self,
        call: Call,
        key: str,
        target: str | None,
        intent: str,
        output: dict[str, Any],
        cursor: int,
    ) -> LedgerEntry:
        kept = output if call.reason is None else {**output, "reason": call.reason}
        return LedgerEntry(
            principal=call.ctx.principal,
            idempotency_key=key,
            tool=call.tool,
            target=target,
            intent_hash=intent,
            output=encode(kept),
            cursor=cursor,
        )

    def transaction_receipt(
        self, call: Call, operation: str, target: str, cursor: int, event_digest: str, intent: str
    ) -> str:
        return digest(
            "canonical-transaction",
            {
                "operation": operation,
                "scope_ref": scope_ref(call.scope),
                "target": target,
                "cursor": str(cursor),
                "event_digest": event_digest,
                "intent_hash": intent,
            },
        )

    def journal_step(
        self,
        call: Call,
        head: JournalHead,
        operation: str,
        target: str,
        intent: str,
        digests: Mapping[str, str],
        why: Mapping[str, str] | None = None,
    ) -> JournalStep:
        """The event a commit appends after ``head`` (its ``digests`` then the intent hash, and
        ``why``: ``journal.build_event``) and the transaction receipt over it, which the use
        case's output quotes."""
        event, event_id = build_event(
            head,
            operation=operation,
            target=target,
            at_ms=call.now_ms,
            digests={**digests, "intent_hash": intent},
            why=why,
        )
        receipt_digest = self.transaction_receipt(
            call, operation, target, event.cursor, event.event_hash, intent
        )
        return JournalStep(operation, event, event_id, receipt_digest)

    def authorization_receipt(
        self, call: Call, approval: Approval | None, extra: Mapping[str, Any]
    ) -> str:
        return digest(
            "authorization",
            {
                "tool": call.tool,
                "principal": call.ctx.principal,
                "scope_ref": scope_ref(call.scope),
                "grants": sorted(call.ctx.grants),
                "confirmation": (
                    {
                        "approval_id": approval.approval_id,
                        "operation_digest": approval.operation_digest,
                        # the gate refused an unanswered approval before any commit
                        "approved_at": format_instant(approval.approved_at_ms or 0),
                    }
                    if approval is not None
                    else "not-required"
                ),
                **extra,
            },
        )

    def run_outbox(
        self, items: Sequence[OutboxItem], docs: Mapping[str, ProjectionDoc] | None = None
    ) -> bool:
        """Try each item now; return True when all completed.

        ``docs`` holds projection documents the caller already built (by record id), so the
        commit path does not rebuild what it just committed; otherwise an upsert rebuilds its
        document from the record in the canonical store.
        """
        done = True
        lines = [item for item in items if item.kind == "audit_line"]
        if lines:
            self._recover_audit(lines)
            done = self.committed_audit is not None
        for item in items:
            if item.kind == "audit_line":
                continue
            try:
                if item.kind == "destroy_key" and item.target.startswith(RECORD_KEY_TARGET):
                    self.record_keys.destroy(item.scope, item.target[len(RECORD_KEY_TARGET) :])
                elif item.kind == "destroy_key":
                    self.expected.drop_key(item.target)
                    self.vault.destroy(item.target)
                elif item.kind == "upsert_projection":
                    known = None if docs is None else docs.get(item.target)
                    self._upsert_projection(item, known)
                else:
                    surface = self._surface(item.surface)
                    surface.apply(item.scope, ProjectionChange(delete_record_id=item.target))
                self.store.outbox_done(item)
            except (VaultUnavailable, IndexUnavailable, StoreUnavailable):
                done = False
        return done

    def _surface(self, name: str) -> ProjectionSurface:
        return next(s for s in self.surfaces if s.name == name)

    def _upsert_projection(self, item: OutboxItem, known: ProjectionDoc | None) -> None:
        row = self.store.record_get(item.scope, item.target)
        self.project(item.scope, item.target, row, [self._surface(item.surface)], known)

    def project(
        self,
        scope: Scope,
        record_id: str,
        row: RecordRow | None,
        surfaces: Sequence[ProjectionSurface],
        known: ProjectionDoc | None = None,
    ) -> bool:
        """Make ``surfaces`` match the record as ``row`` shows it: project it, or drop it when it
        is gone, forgotten (no body) or not current (disputed, historical, expired, trust-invalid:
        never ranked). Returns whether it was projected.

        The record is read again after an upsert: a forget or an operator's transition that
        committed and dropped the document while the upsert was on its way would otherwise leave
        the record's terms in the index, so the document is dropped again.
        """
        drop = ProjectionChange(delete_record_id=record_id)
        current = row if _projectable(row) else None
        doc = known if current is not None else None
        if doc is None and current is not None:
            record = self._opened(scope, current)  # None once its key is destroyed
            doc = None if record is None else self.projection_doc(record_id, record)
        if doc is None:
            for surface in surfaces:
                surface.apply(scope, drop)
            return False
        upsert = ProjectionChange(upsert=doc)
        for surface in surfaces:
            surface.apply(scope, upsert)
        after = self.store.record_get(scope, record_id)
        if not _projectable(after):
            for surface in surfaces:
                surface.apply(scope, drop)
            return False
        return True

    def _opened(self, scope: Scope, row: RecordRow) -> dict[str, Any] | None:
        """The record a row with a body holds, or None when its key is destroyed.
        ``VaultUnavailable`` goes up: an outbox item then stays pending for the drainer."""
        assert row.body is not None
        plaintext = self.record_keys.open_many(scope, {row.record_id: row.body}).get(row.record_id)
        if plaintext is None:
            return None
        return checked_record(row.record_id, plaintext, row.record_digest)

    def drain_outbox(self, limit: int = 100) -> int:
        """Complete pending key destructions and projection upserts and drops (every scope, at
        most ``limit`` items); return how many completed.

        The embedded server runs this periodically, the cloud's scheduled drainer function too,
        so ``pending`` completes without calls.
        """
        try:
            items = self.store.outbox_pending(limit)
        except StoreUnavailable:
            return 0
        # The audit lines together (one look into the log for all of them), the rest one by one.
        lines = [item for item in items if item.kind == "audit_line"]
        completed = len(lines) if lines and self.run_outbox(lines) else 0
        for item in items:
            if item.kind != "audit_line" and self.run_outbox([item]):
                completed += 1
        self.settle_audit()
        return completed

    def drain_scope(self, scope: Scope, kind: str, limit: int = 100) -> int:
        """Run ``scope``'s own pending items of ``kind``; return how many are still pending.

        Raises ``StoreUnavailable`` when the scope's outbox cannot be read.
        """
        self.run_outbox(self.store.outbox_pending_in(scope, kind, limit))
        return len(self.store.outbox_pending_in(scope, kind, limit))

    def deferred_projections(
        self,
        scope: Scope,
        record_id: str,
        kind: Literal["drop_projection", "upsert_projection"],
        now_ms: int,
    ) -> list[OutboxItem]:
        """Outbox items projecting (``upsert_projection``) or dropping ``record_id`` on the
        surfaces the store does not maintain, to be written in the same commit."""
        return [
            OutboxItem(
                item_id=f"{kind}:{surface.name}:{record_id}",
                kind=kind,
                scope=scope,
                target=record_id,
                surface=surface.name,
                enqueued_at_ms=now_ms,
            )
            for surface in self.surfaces
            if not surface.maintained_by_store
        ]

    def retry_pending_upsert(self, scope: Scope, record_id: str, now_ms: int) -> None:
        """Run ``record_id``'s projection upsert now if it is still pending. The outbox item
        written with the commit already guarantees the drainer does it; this does it sooner."""
        items = self.deferred_projections(scope, record_id, "upsert_projection", now_ms)
        if not items:
            return
        pending: bool = self.read(
            lambda: self.store.outbox_has(scope, "upsert_projection", record_id)
        )
        if pending:
            self.run_outbox(items)

    @property
    def projects_in_store(self) -> bool:
        """Whether some surface is maintained inside the store's commit (``ChangeSet.projection``)."""
        return any(surface.maintained_by_store for surface in self.surfaces)

    def check_projection_current(self, scope: Scope) -> None:
        """``PROJECTION_STALE`` while an upsert of the scope is pending: a search would miss the
        record, and a silent miss is not an answer (CONTRACT.md: retriable)."""
        if all(surface.maintained_by_store for surface in self.surfaces):
            return
        pending = self.read(lambda: self.store.outbox_pending_in(scope, "upsert_projection", 1))
        if pending:
            raise EngramError(ErrorCode.PROJECTION_STALE)

    def shred_unused(self, keys: Sequence[str], keep: Sequence[str]) -> None:
        for key_ref in keys:
            if key_ref in keep:
                continue
            self.expected.drop_key(key_ref)
            try:
                self.vault.destroy(key_ref)
            except VaultUnavailable:
                log.warning("could not shred an unused candidate key", extra={"key_ref": key_ref})

    def prepare_record_key(self, call: Call, record_id: str) -> None:
        """Make the key of the record a capture may become (written with the candidate's key)."""
        try:
            self.record_keys.prepare(call.scope, record_id)
        except VaultUnavailable:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None

    @staticmethod
    def destroy_record_key(scope: Scope, record_id: str, now_ms: int) -> OutboxItem:
        """The outbox item destroying a record's key (after forget, or a candidate's end)."""
        return Kernel.destroy_candidate_key(scope, RECORD_KEY_TARGET + record_id, now_ms)

    def record_key_destruction(
        self, scope: Scope, row: RecordRow, now_ms: int
    ) -> tuple[OutboxItem, ...]:
        """The outbox items forgetting ``row`` shreds with: its own key, and the key of the
        candidate it was admitted from (kept at admission so a backup holding the candidate
        still opens it; gone here so that backup cannot bring the forgotten text back)."""
        candidate = self.read(lambda: self.store.candidate_get(scope, row.candidate_id))
        record_key = self.destroy_record_key(scope, row.record_id, now_ms)
        if candidate is None or candidate.record_id != row.record_id:
            return (record_key,)
        return (record_key, self.destroy_candidate_key(scope, candidate.key_ref, now_ms))

    @staticmethod
    def destroy_candidate_key(scope: Scope, key_ref: str, now_ms: int) -> OutboxItem:
        """The outbox item destroying a candidate's key (``Vault``): when it is withdrawn or
        rejected, or when the record it became is forgotten."""
        return OutboxItem(
            item_id=f"destroy_key:{key_ref}",
            kind="destroy_key",
            scope=scope,
            target=key_ref,
            enqueued_at_ms=now_ms,
        )

    def seal_record(self, call: Call, record: Mapping[str, Any]) -> bytes:
        """The record's body sealed under its own key (``RecordKeys``), for ``RecordRow.body``."""
        try:
            # Packed before sealing (ciphertext does not compress): a third of the bytes. The
            # digest stays over the canonical bytes, which ``checked_record`` unpacks to.
            body = pack(encode(dict(record)))
            return self.record_keys.seal(call.scope, record["record_id"], body)
        except VaultUnavailable:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None

    def accept_idle_work(self) -> None:
        """A host that runs ``run_idle_work`` soon after each answer lets calls leave work."""
        self.idle.accept()

    def run_idle_work(self) -> None:
        self.idle.run()
        self.expected.expire()  # after any call's answer: nothing held past its time for long

    def anticipate_admission(
        self, call: Call, candidate_id: str, content: Mapping[str, Any], sealed: Sealed
    ) -> None:
        """Leave the content-only part of the admission of the candidate just captured (and
        committed as ``sealed``) to the host's idle time (``engine.idle``), when a host runs
        it: the policy's part when it can do it ahead, then the accepted record's projection
        document and sealed body; the plaintext is held for the admission meanwhile."""
        if not self.idle.accepted:
            return
        blob, plaintext = sealed
        self.expected.hold(call.scope, candidate_id, blob.key_ref, blob.ciphertext, plaintext)
        policy = self.policy if isinstance(self.policy, AnticipatingPolicy) else None
        request = None
        if policy is not None:
            request = AdmissionRequest(
                scope=call.scope,
                principal=call.ctx.principal,
                candidate_id=candidate_id,
                record=content["record"],
                evidence=content["evidence"],
                host_facts=call.ctx.host_facts,
                host_fact_digests=call.ctx.host_fact_digests,
            )

        def ahead() -> None:
            if policy is not None and request is not None:
                policy.anticipate(request)
            self._prepare_acceptance(call, candidate_id, content["record"])

        self.idle.offer(ahead)

    def seal(self, call: Call, candidate_id: str, content: Mapping[str, Any]) -> Sealed:
        """The candidate's content sealed by the vault, with the plaintext sealed (what opening
        the message gives back)."""
        plaintext = encode(dict(content))
        try:
            return self.vault.seal(call.scope, candidate_id, plaintext), plaintext
        except VaultUnavailable:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None

    def _prepare_acceptance(self, call: Call, candidate_id: str, record: dict[str, Any]) -> None:
        """Idle work: what accepting the candidate writes besides its decision, made ahead."""
        doc = self.projection_doc(record["record_id"], record)
        self.expected.prepared(call.scope, candidate_id, doc, self.seal_record(call, record))

    def policy_version(self) -> str:
        try:
            return self.policy.version()
        except PolicyUnavailable:
            raise EngramError(ErrorCode.POLICY_UNAVAILABLE) from None

    def record_leaving(self, scope: Scope, record_id: str, sources: Collection[str]) -> RecordRow:
        """The record a transition is to move: NOT_FOUND without one, ALREADY_TERMINAL once
        tombstoned, ILLEGAL_TRANSITION from a state not among ``sources``."""
        row = self.read(lambda: self.store.record_get(scope, record_id))
        if row is None:
            raise EngramError(ErrorCode.NOT_FOUND)
        if row.state == "tombstoned":
            raise EngramError(ErrorCode.ALREADY_TERMINAL)
        if row.state not in sources:
            raise EngramError(ErrorCode.ILLEGAL_TRANSITION)
        return row

    def pending_candidate(self, call: Call, candidate_id: str) -> CandidateRow:
        candidate = self.read(lambda: self.store.candidate_get(call.scope, candidate_id))
        if candidate is None or candidate.principal != call.ctx.principal:
            raise EngramError(ErrorCode.NOT_FOUND)
        return candidate

    def open_candidate(self, call: Call, candidate: CandidateRow) -> dict[str, Any]:
        """The candidate's content, checked against its digests. The plaintext its capture held
        for it (``ExpectedAdmissions``) stands for opening the message when the key that
        opens it still exists; what else was made ahead goes to ``call.expected``."""
        expected = call.expected = self.expected.take(call.scope, candidate)
        try:
            if expected is not None and self.vault.key_exists(candidate.key_ref):
                plaintext = expected.plaintext
            else:
                plaintext = self.vault.open(
                    call.scope,
                    candidate.candidate_id,
                    SealedBlob(candidate.key_ref, candidate.sealed),
                )
        except KeyDestroyed:
            raise EngramError(ErrorCode.BLOB_MISSING) from None
        except SealIntegrityError:
            raise EngramError(ErrorCode.JOURNAL_CORRUPT) from None
        except VaultUnavailable:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
        content: dict[str, Any] = decode(plaintext)
        record = content["record"]
        if (
            not record_digest_matches(record)
            or record["record_digest"] != candidate.record_digest
            or record["payload_digest"] != candidate.payload_digest
        ):
            raise EngramError(ErrorCode.JOURNAL_CORRUPT)
        return dict(content)

    def key_destruction(self, candidate: CandidateRow | None) -> str:
        if candidate is None:
            return "complete"
        try:
            exists = self.vault.key_exists(candidate.key_ref)
        except VaultUnavailable:
            return "pending"
        return "pending" if exists else "complete"

    def invalidation_progress(self, scope: Scope, record_id: str, cursor: int) -> dict[str, Any]:
        deferred = any(not surface.maintained_by_store for surface in self.surfaces)
        if deferred and self.read(
            lambda: self.store.outbox_has(scope, "drop_projection", record_id)
        ):
            return {"projection_invalidation": "pending"}
        coverage = receipt(
            "projection-invalidation",
            {
                "record_id": record_id,
                "surfaces": [
                    {"surface": surface.name, "through_cursor": str(cursor)}
                    for surface in self.surfaces
                ],
            },
        )
        return {
            "projection_invalidation": "complete",
            "coverage_receipt_digest": coverage["receipt_digest"],
        }

    def eligible(self, row: RecordRow, now_ms: int) -> bool:
        """Current in state, valid time and expiry. A missing body is not ineligibility but a
        fault (``BLOB_MISSING`` from ``body``): an operator must hear about it."""
        return (
            row.state == "accepted_current"
            and row.valid_from_ms <= now_ms
            and (row.valid_to_ms is None or now_ms <= row.valid_to_ms)
            and (row.expires_at_ms is None or now_ms < row.expires_at_ms)
        )

    def body(self, scope: Scope, row: RecordRow) -> dict[str, Any]:
        """The record ``row`` holds, opened and checked against its digest.

        ``BLOB_MISSING`` when the body is gone from the row; ``NOT_FOUND`` when its key is: only
        forget destroys a record's key, so the row is one restored from a backup taken before the
        forget, and the record stays forgotten."""
        if row.body is None:
            raise EngramError(ErrorCode.BLOB_MISSING)
        record = self.bodies(scope, [row]).get(row.record_id)
        if record is None:
            raise EngramError(ErrorCode.NOT_FOUND)
        return record

    def bodies(self, scope: Scope, rows: Sequence[RecordRow]) -> dict[str, dict[str, Any]]:
        """The records of ``rows`` whose bodies can be opened (one key-store read for all), by
        record id; a row without a body or whose key is destroyed is left out."""
        sealed = {row.record_id: row.body for row in rows if row.body is not None}
        if not sealed:
            return {}
        try:
            opened = self.record_keys.open_many(scope, sealed)
        except SealIntegrityError:
            raise EngramError(ErrorCode.JOURNAL_CORRUPT) from None
        except VaultUnavailable:
            raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
        digests = {row.record_id: row.record_digest for row in rows}
        return {
            record_id: checked_record(record_id, plaintext, digests[record_id])
            for record_id, plaintext in opened.items()
        }


def checked_record(record_id: str, plaintext: bytes, record_digest: str) -> dict[str, Any]:
    try:
        plaintext = unpack(plaintext)
    except ValueError:
        raise EngramError(ErrorCode.JOURNAL_CORRUPT) from None
    record: dict[str, Any] = decode(plaintext)
    if stored_body_matches(plaintext, record_digest):
        # The bytes hash to the row's digest; the decoded record must carry it at its top.
        if record.get("record_digest") == record_digest and record.get("record_id") == record_id:
            return record
    elif record_digest_matches(record) and record["record_digest"] == record_digest:
        return dict(record)
    raise EngramError(ErrorCode.JOURNAL_CORRUPT)


def _projectable(row: RecordRow | None) -> bool:
    """Whether a record belongs in the projections: current and not shredded (and, checked when
    its body is opened, its key not destroyed)."""
    return row is not None and row.state == "accepted_current" and row.body is not None


class _Contention:
    """Backoff for commits refused because another writer of the scope got there first.

    Full jitter (a random sleep below a cap doubling from 5 ms to ``contention_backoff_cap_ms``),
    for as long as the call may run: until its deadline (then ``DEADLINE_EXCEEDED``), or, for a
    call without one, ``contention_budget_ms`` (then ``FENCE_LOST``). The wait is measured on the
    monotonic clock, so an engine clock that does not move (a test's) still ends it.
    """

    def __init__(self, kernel: Kernel, call: Call) -> None:
        settings = kernel.settings
        deadline_ms = call.ctx.deadline_ms
        self._bounded_by_deadline = deadline_ms is not None
        budget_ms = (
            settings.contention_budget_ms
            if deadline_ms is None
            else max(0, deadline_ms - kernel.clock.now_ms())
        )
        self._ends = time.monotonic() + budget_ms / 1000
        self._cap_s = settings.contention_backoff_cap_ms / 1000
        self._attempt = 0

    @property
    def contended(self) -> bool:
        """Has the call lost the head to another writer already?"""
        return self._attempt > 0

    def back_off(self) -> None:
        self._attempt += 1
        left = self._ends - time.monotonic()
        if left <= 0:
            if self._bounded_by_deadline:
                raise EngramError(ErrorCode.DEADLINE_EXCEEDED)
            raise EngramError(ErrorCode.FENCE_LOST)
        ceiling = min(self._cap_s, 0.005 * 2 ** min(self._attempt, 16))
        time.sleep(min(left, random.uniform(0, ceiling)))  # noqa: S311 - jitter, not crypto


def _call_digest(
    kind: str, call: Call, model: ClosedModel, target: str | None, **binding: Any
) -> str:
    """A digest over what the call asks for: its tool, target and arguments (the idempotency
    key aside: a retry asks for the same thing), with what binds it (``binding``)."""
    arguments = model.model_dump(mode="json", exclude_none=True, exclude={"idempotency_key"})
    return digest(
        kind,
        {
            "tool": call.tool,
            "target": target if target is not None else "",
            "arguments": arguments,
            **binding,
        },
    )


def _summary(call: Call, target: str | None, reason_ref: str | None) -> str:
    parts = [f"Tool: {call.tool}", f"Target: {target or '(new memory)'}"]
    if reason_ref is not None:
        parts.append(f"Reason: {reason_ref}")
    parts.append(f"Scope: tenant {call.ctx.tenant_id}, workspace {call.ctx.workspace_id}")
    parts.append(f"Requested by: {call.ctx.principal}")
    return "\n".join(parts)


def _with(changes: ChangeSet, item: OutboxItem) -> ChangeSet:
    """``changes`` with one more outbox item, committed with it."""
    return replace(changes, outbox=(*changes.outbox, item))

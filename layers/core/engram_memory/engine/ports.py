"""Ports: the small interfaces the engine needs from the outside world.

Each port has an embedded adapter (``adapters.local``) and, later, an AWS adapter; one behavioural
suite runs over both. Adapters raise only the exceptions defined here (translating vendor
exceptions with ``raise ... from exc``); the engine maps them to contract codes once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal, Protocol, runtime_checkable

from engram_memory.contract.errors import Violation
from engram_memory.contract.types import format_instant
from engram_memory.engine.context import HostFactDigests, Scope, TrustedContext

CandidateState = Literal["pending", "rejected", "withdrawn", "admitted"]
RecordState = Literal[
    "accepted_current", "accepted_disputed", "historical", "expired", "trust_invalid", "tombstoned"
]

# --------------------------------------------------------------------------------------------
# Port exceptions
# --------------------------------------------------------------------------------------------


class PortError(Exception):
    """Base of every exception an adapter may raise through a port."""


class StoreUnavailable(PortError):
    """The store could not be reached or refused the operation; nothing was committed."""


class CommitOutcomeUnknown(PortError):
    """The commit may or may not have been applied (e.g. a timeout while committing)."""


class CommitConflict(PortError):
    """A commit condition failed; nothing was written.

    ``reason`` says which: ``head`` (the journal moved), ``ledger`` (the idempotency key is taken),
    ``state`` (the target's state moved), ``approval`` (the confirmation was already used).
    """

    def __init__(self, reason: Literal["head", "ledger", "state", "approval"]) -> None:
        super().__init__(reason)
        self.reason = reason


class VaultUnavailable(PortError):
    """The vault could not seal, open or destroy right now (transient)."""


class KeyDestroyed(PortError):
    """The data key of a sealed blob no longer exists: the blob can never be opened."""


class SealIntegrityError(PortError):
    """The ciphertext failed authentication or does not belong to the given context."""


class IndexUnavailable(PortError):
    """A projection index could not be queried or updated right now."""


class IndexMissing(IndexUnavailable):
    """The index itself does not exist: a new deployment's, before its first write creates it,
    or a lost one (``reindex`` rebuilds it). A search cannot tell "no match" from it; it holds
    no record."""


class IndexUnreachable(IndexUnavailable):
    """A projection index this engine can never query, by design rather than by an outage: the
    cloud operator's seat, outside the OpenSearch domain's network and role mapping."""


class EmbedderUnavailable(PortError):
    """The embedder could not embed right now (model missing, runtime failure)."""


class PolicyUnavailable(PortError):
    """An external admission decision hook is down."""


# --------------------------------------------------------------------------------------------
# Store
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalHead:
    cursor: int
    event_hash: str


@dataclass(frozen=True, slots=True)
class JournalEvent:
    cursor: int
    event_hash: str
    body: bytes  # canonical JSON of the event, including ``previous_event_hash``


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    principal: str
    idempotency_key: str
    tool: str
    target: str | None
    intent_hash: str
    output: bytes  # canonical JSON of the first committed output value
    cursor: int


@runtime_checkable
class LedgerByCursor(Protocol):
    """A store that finds the ledger entries of journal cursors (the embedded SQLite store):
    who committed each step of a record's history, and the operator's reason. A store without
    it (DynamoDB keys its ledger by principal and idempotency key only) shows neither, but for
    the terminal transitions whose events say so themselves (``journal.WHY_FIELDS``)."""

    def ledger_at(self, scope: Scope, cursors: Sequence[int]) -> dict[int, LedgerEntry]: ...


@dataclass(frozen=True, slots=True)
class CandidateRow:
    candidate_id: str
    principal: str
    state: CandidateState
    payload_digest: str
    record_digest: str
    record_id: str
    capture_cursor: int
    key_ref: str
    sealed: bytes
    policy_version: str
    created_at_ms: int
    # The admission policy's hold (``pending_adjudication``): the digest of the decision receipt
    # that held it, or None when no policy held it. A held candidate stays ``pending`` (the
    # contract's state) until an operator decides; leaving ``pending`` clears it.
    held: str | None = None


@dataclass(frozen=True, slots=True)
class RecordRow:
    record_id: str
    state: RecordState
    record_digest: str
    payload_digest: str
    candidate_id: str
    valid_from_ms: int
    valid_to_ms: int | None
    expires_at_ms: int | None
    accepted_cursor: int
    # The full record's canonical JSON sealed under the record's own key (``RecordKeys``); None
    # once shredded (tombstone). Destroying the key makes every copy of these bytes unreadable.
    body: bytes | None
    # False when read without its body (``records_get(..., bodies=False)``): ``body`` is then
    # None and says nothing about shredding; read the row again for its body.
    body_read: bool = True


@dataclass(frozen=True, slots=True)
class ProjectionDoc:
    """What a lexical projection indexes for one record: analyzed terms per weighted field."""

    record_id: str
    fields: Mapping[str, str]  # field name -> space-joined analyzed terms
    # The record's unit-length embedding when the host has a semantic channel (semantic.py).
    vector: tuple[float, ...] | None = None
    # The record's component texts (``records.record_text``), for an index that keeps
    # near-duplicate sketches of them (``NearDuplicateIndex``); never stored as it is, nor shown.
    text: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True)
class ProjectionChange:
    upsert: ProjectionDoc | None = None
    delete_record_id: str | None = None


@dataclass(frozen=True, slots=True)
class StateTransition:
    target_id: str
    from_state: str
    to_state: str


OutboxKind = Literal["destroy_key", "drop_projection", "upsert_projection", "audit_line"]
OUTBOX_KINDS: tuple[OutboxKind, ...] = (
    "destroy_key",
    "drop_projection",
    "upsert_projection",
    "audit_line",
)
# A ``destroy_key`` item whose target starts with this destroys a record's key (``RecordKeys``):
# ``record:<record_id>``; any other target is a candidate's ``key_ref`` (``Vault``).
RECORD_KEY_TARGET: Final = "record:"


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """Work that must complete after a commit without further calls (key shredding, projections).

    ``upsert_projection`` carries no document: it is rebuilt from the record in the canonical
    store when the item runs, so the outbox never holds record content. ``audit_line`` carries
    the committing call's audit line (``CommittedAuditLog``): ids, codes and digests, as the
    audit log holds them.
    """

    item_id: str
    kind: OutboxKind
    scope: Scope
    # key_ref (or RECORD_KEY_TARGET + record_id) for destroy_key, the line for audit_line, else
    # record_id
    target: str
    surface: str = ""  # projection surface name for the projection kinds
    enqueued_at_ms: int = 0  # when the committing call ran (0: unknown); for the outbox-age metric


@dataclass(frozen=True, slots=True)
class CandidateHold:
    """An admission policy's hold on a pending candidate: ``CandidateRow.held`` set to the digest
    of the decision receipt that held it. The candidate must still be ``pending``."""

    candidate_id: str
    decision_receipt_digest: str


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """One atomic mutation: everything here commits together or not at all.

    Conditions checked inside the commit: the journal head still equals ``expected_head``; the
    ledger key is free; each transition's ``from_state`` still holds; ``approval_id`` is unused;
    a ``hold``'s candidate is still ``pending``; with ``unless_held``, the transitioning
    candidate is not held (``CommitConflict("state")`` otherwise).

    ``expected_head`` None is a change that writes no journal event and so needs no fence on the
    head (an admission policy's hold: the ledger entry and the candidate's mark, whose own
    conditions are its fence); a change with an event always names the head it follows.
    """

    scope: Scope
    expected_head: JournalHead | None
    ledger: LedgerEntry
    event: JournalEvent | None = None
    new_candidate: CandidateRow | None = None
    candidate_transition: StateTransition | None = None
    # A policy's decision on the candidate (accept, reject) is refused while it is held; an
    # operator's adjudication and a withdraw are not. Leaving ``pending`` clears the hold.
    unless_held: bool = False
    hold: CandidateHold | None = None
    new_record: RecordRow | None = None
    record_transition: StateTransition | None = None
    shred_record_body: bool = False
    tombstone_payload_digest: str | None = None
    projection: ProjectionChange | None = None
    approval_id: str | None = None
    outbox: Sequence[OutboxItem] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.event is not None and self.expected_head is None:
            raise ValueError("a change set with a journal event names the head it follows")


class Store(Protocol):
    """The canonical store: journal, candidates, records, ledger, tombstones, outbox."""

    def head(self, scope: Scope) -> JournalHead: ...

    def ledger_get(
        self, scope: Scope, principal: str, idempotency_key: str
    ) -> LedgerEntry | None: ...

    def candidate_get(self, scope: Scope, candidate_id: str) -> CandidateRow | None: ...

    def record_get(self, scope: Scope, record_id: str) -> RecordRow | None: ...

    def records_get(
        self, scope: Scope, record_ids: Sequence[str], *, bodies: bool = True
    ) -> dict[str, RecordRow]:
        """The rows of ``record_ids`` that exist, by id. ``bodies=False`` may leave the sealed
        bodies out (``body_read`` False): a ranking reads every hit's eligibility and valid
        time, and only its page's bodies; a store where bodies cost nothing extra returns them."""
        ...

    def payload_tombstoned(self, scope: Scope, payload_digest: str) -> bool: ...

    def events(self, scope: Scope, after_cursor: int, limit: int) -> list[JournalEvent]: ...

    def commit(self, changes: ChangeSet) -> None:
        """Apply ``changes`` atomically; raise ``CommitConflict``, ``StoreUnavailable`` or
        ``CommitOutcomeUnknown``."""
        ...

    def spend_approval(self, scope: Scope, approval_id: str) -> bool:
        """Mark ``approval_id`` used without a mutation (the human declined it): any later commit
        carrying it is refused as ``CommitConflict("approval")``. False when it was already
        used (committed or declined). Raises ``StoreUnavailable``."""
        ...

    def claim_nonce(self, scope: Scope, nonce: str, expires_at_ms: int) -> bool:
        """Record a single-use nonce (e.g. a confirmation ``requestState``); False if seen before."""
        ...

    def outbox_pending(self, limit: int) -> list[OutboxItem]:
        """Pending items of every scope, at most ``limit`` (a drainer's page)."""
        ...

    def outbox_pending_in(self, scope: Scope, kind: str | None, limit: int) -> list[OutboxItem]:
        """Pending items of ``scope`` (of ``kind`` when given), at most ``limit``."""
        ...

    def outbox_done(self, item: OutboxItem) -> None:
        """Remove a finished item (idempotent). The caller holds the item as the store gave it
        or as it was committed, so a store that indexes its outbox needs no read to find it."""

    def outbox_done_all(self, items: Sequence[OutboxItem]) -> None:
        """``outbox_done`` of every one of ``items``, in one write where the store can (the
        audit lines one sync of the log made durable, settled together)."""

    def outbox_has(self, scope: Scope, kind: str, target: str) -> bool: ...

    def outbox_holds(self, item: OutboxItem) -> bool:
        """Whether ``item``, as committed, is still in the outbox (not yet done): found by its
        id where the store keys its outbox by id, as ``outbox_has`` finds it by target."""

    # -- the operations plane (host operators only; never on an agent's request path) ---------

    def scopes(self) -> list[Scope]:
        """Every scope whose journal has an event, in ``(tenant_id, workspace_id)`` order."""
        ...

    def candidates_list(
        self, scope: Scope, state: CandidateState | None, after: str, limit: int
    ) -> list[CandidateRow]:
        """``scope``'s candidates (in ``state`` when given) whose id sorts after ``after``, in
        id order, at most ``limit``."""
        ...

    def records_list(
        self, scope: Scope, state: RecordState | None, after: str, limit: int
    ) -> list[RecordRow]:
        """``scope``'s records (in ``state`` when given) whose id sorts after ``after``, in id
        order, at most ``limit``."""
        ...

    def revoke_credentials(
        self, tenant_id: str, kind: Literal["token", "principal"], value: str, at_ms: int
    ) -> int:
        """Record a revocation: of one token (``kind`` ``token``, ``value`` its ``jti``), or of
        every token of a principal issued at or before ``at_ms`` (``principal``). Idempotent: a
        repeated principal revocation moves its instant forward, a repeated token revocation
        keeps the first. Returns the instant that stands."""
        ...

    def credential_revoked(
        self, tenant_id: str, token_id: str | None, principal: str, issued_at_ms: int
    ) -> bool:
        """Whether a token (its ``jti``, principal and issue time) has been revoked. This one
        read runs on every agent call that a token carries."""
        ...

    def state_counts(self, scope: Scope) -> dict[str, int]:
        """How many candidates and records ``scope`` holds per state (``candidate:<state>``,
        ``record:<state>``) and how many outbox items wait per kind (``outbox:<kind>``); states
        with none are left out."""
        ...


# --------------------------------------------------------------------------------------------
# Vault, index, policy, confirmation, clock, audit
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SealedBlob:
    key_ref: str
    ciphertext: bytes
    # Keys an earlier attempt sealed for the same candidate (a call retried after an unknown
    # outcome): no candidate holds them once this blob's candidate commits, so they are shredded.
    superseded: tuple[str, ...] = ()


class Vault(Protocol):
    """Seals candidates under per-candidate data keys; destroying a key crypto-shreds its blob."""

    def seal(self, scope: Scope, candidate_id: str, plaintext: bytes) -> SealedBlob: ...

    def open(self, scope: Scope, candidate_id: str, blob: SealedBlob) -> bytes: ...

    def destroy(self, key_ref: str) -> None:
        """Durably delete the key; idempotent (destroying a missing key is not an error)."""
        ...

    def key_exists(self, key_ref: str) -> bool: ...


# Sealed record bodies start with this marker (``adapters.record_sealing`` writes them); a body
# without it is a plaintext body from before sealed bodies, which the stores seal when they open.
SEALED_BODY_FORMAT: Final = b"erb1"


def is_sealed_body(body: bytes) -> bool:
    """Whether a stored record body is sealed (opens only with its record key)."""
    return body.startswith(SEALED_BODY_FORMAT)


class RecordKeys(Protocol):
    """Seals admitted record bodies under per-record data keys: a key class apart from the
    vault's candidate keys, so reading records needs no permission to open candidates.

    Each record gets its own 256-bit data key (AES-GCM), wrapped under its scope's key, which an
    adapter unwraps once per process and caches: opening a body costs a key-store read and an
    AES-GCM decryption, never a KMS call or an Encryption SDK message. The keys live in the key
    store that is never backed up, so destroying a record's key makes every copy of its body (the
    live store, a backup, a point-in-time copy) unreadable for good.
    """

    def prepare(self, scope: Scope, record_id: str) -> None:
        """Make the key of a record that may be admitted later (at capture). An adapter may keep
        it until its key store's next write (embedded: the candidate's key, one commit) instead
        of writing it at once; ``seal`` makes it durable if it is not yet."""
        ...

    def seal(self, scope: Scope, record_id: str, plaintext: bytes) -> bytes:
        """Encrypt a record body; on return its key is durable. Raises ``VaultUnavailable``."""
        ...

    def open_many(self, scope: Scope, sealed: Mapping[str, bytes]) -> dict[str, bytes]:
        """Decrypt bodies by record id (one key-store read for all). A record whose key is gone
        is left out of the answer; ``SealIntegrityError`` when a body fails authentication or
        belongs to another record, ``VaultUnavailable`` when the key store cannot be read."""
        ...

    def destroy(self, scope: Scope, record_id: str) -> None:
        """Durably delete the record's key; idempotent."""
        ...

    def key_exists(self, scope: Scope, record_id: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class IndexHit:
    record_id: str
    score: float


class ProjectionSurface(Protocol):
    """Something that holds a projection of records: dropped on forget like the record."""

    @property
    def name(self) -> str:
        """The projection surface's name, as reported in coverage receipts."""
        ...

    @property
    def maintained_by_store(self) -> bool:
        """True when the store applies ``ChangeSet.projection`` inside its own commit (SQLite)."""
        ...

    @property
    def scoring_formula_ref(self) -> str:
        """What this index's scores are, for the rank receipt (rankings differ by backend)."""
        ...

    def apply(self, scope: Scope, change: ProjectionChange) -> None: ...

    def contains(self, scope: Scope, record_id: str) -> bool: ...


class LexicalIndex(ProjectionSurface, Protocol):
    def search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        """Hits ordered by score descending, then ``record_id`` ascending; at most ``depth``."""
        ...


@runtime_checkable
class NearDuplicateIndex(Protocol):
    """A lexical index that also keeps a near-duplicate sketch of each record it holds
    (``ProjectionDoc.text``), in the same commit as its row: the quality gate's neighbours come
    from it, at a cost that does not follow the size of the scope (issue 39). An index without
    one ranks the neighbours with ``LexicalIndex.search``."""

    def near_duplicates(self, scope: Scope, text: str, depth: int) -> list[IndexHit]:
        """At most ``depth`` records of ``scope`` whose sketch resembles ``text``'s, most alike
        first (score: the share of the sketch they have in common), then ``record_id``."""
        ...


@runtime_checkable
class VectorIndex(ProjectionSurface, Protocol):
    """Nearest records of a scope by cosine similarity of ``ProjectionDoc.vector``."""

    @property
    def vector_formula_ref(self) -> str:
        """What ``nearest``'s scores are, for the rank receipt."""
        ...

    def nearest(self, scope: Scope, vector: Sequence[float], depth: int) -> list[IndexHit]:
        """Hits scored by cosine similarity, descending, then ``record_id`` ascending; at most
        ``depth``. Records projected without a vector are not hits."""
        ...

    def similarities(
        self, scope: Scope, vector: Sequence[float], record_ids: Sequence[str]
    ) -> dict[str, float]:
        """The similarity of each of ``record_ids`` that has a vector in the scope, as ``nearest``
        scores it: the hybrid ranking's semantic scores for lexical hits the page's semantic
        list does not reach (engine/semantic.py)."""
        ...

    def score_at(self, scope: Scope, vector: Sequence[float], rank: int) -> float | None:
        """The similarity of the ``rank``-th nearest vector (1-based), or of the farthest when
        the scope holds fewer; None when it holds none. The hybrid ranking's normalization
        floor (engine/semantic.py), so ``nearest`` need not return that many hits."""
        ...

    def has_vector(self, scope: Scope, record_id: str) -> bool:
        """Whether the scope's vector for ``record_id`` is stored."""
        ...


class Embedder(Protocol):
    """Turns texts into unit-length vectors, locally (no network unless the host allows it)."""

    @property
    def model_id(self) -> str:
        """The model and its version, pinned in the semantic profile's config digest."""
        ...

    @property
    def dimensions(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """One unit-length vector per text; raises ``EmbedderUnavailable``."""
        ...


@dataclass(frozen=True, slots=True)
class Neighbour:
    """A current record of the candidate's scope that resembles it (``admission.neighbours``):
    its id and its component texts joined, for the policy's near-duplicate rule."""

    record_id: str
    text: str


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    scope: Scope
    principal: str
    candidate_id: str
    record: Mapping[str, Any]  # the full record the candidate would become (plaintext)
    evidence: Mapping[str, Any]
    host_facts: tuple[str, ...]  # strings that are host binding facts and must never be stored
    host_fact_digests: HostFactDigests | None = None  # the same, as keyed digests (cloud)
    # The scope's current records its lexical index ranks highest for the candidate's text.
    neighbours: tuple[Neighbour, ...] = ()


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    decision: Literal["accept", "reject", "adjudication_required"]
    rule: str  # which rule decided (an identifier, never content)
    # The current records of the same scope the candidate near-duplicates (operators only).
    resembles: tuple[str, ...] = ()


class AdmissionPolicy(Protocol):
    policy_id: str

    def version(self) -> str: ...

    def decide(self, request: AdmissionRequest) -> PolicyDecision: ...


@runtime_checkable
class AnticipatingPolicy(Protocol):
    """A policy that can do, ahead of an admission, the part of its decision that depends on
    the candidate's content alone and that it remembers (the built-in policy's secret scan
    and near-duplicate signature, both memoized per scope): the engine offers a captured
    candidate to it in the host's idle time (``Engine.accept_idle_work``), so the admission
    that usually follows finds that work done. It changes no decision."""

    def anticipate(self, request: AdmissionRequest) -> None:
        """``request`` as the admission will make it, without its neighbours."""
        ...


class Clock(Protocol):
    def now_ms(self) -> int: ...


@dataclass(frozen=True, slots=True)
class AuditEvent:
    audit_id: str
    at_ms: int
    tenant_id: str
    workspace_id: str
    principal: str
    agent_id: str | None
    session_id: str | None
    tool: str
    ok: bool
    code: str  # "OK" or the contract error code
    target: str | None = None
    digests: Mapping[str, str] = field(default_factory=dict)  # never plaintext
    # INVALID_SCHEMA only: the first offending field and the rule (never a value); the envelope
    # carries the code's constant message alone
    violation: Violation | None = None

    @classmethod
    def of_call(
        cls,
        ctx: TrustedContext,
        *,
        at_ms: int,
        tool: str,
        ok: bool,
        code: str,
        target: str | None,
        digests: Mapping[str, str],
        violation: Violation | None = None,
    ) -> AuditEvent:
        """The event of a call made in ``ctx``: who and where come from the trusted context."""
        return cls(
            ctx.audit_id,
            at_ms,
            ctx.tenant_id,
            ctx.workspace_id,
            ctx.principal,
            ctx.agent_id,
            ctx.session_id,
            tool,
            ok,
            code,
            target,
            digests,
            violation,
        )

    def as_line(self) -> dict[str, Any]:
        """The event as one audit line, the same on both hosts (the embedded audit log's JSON
        line, the cloud's structured log record): its fields, ``at`` as an instant;
        ``violation`` (an ``INVALID_SCHEMA``'s ``{pointer, rule, says, more}``) only when the
        call had one."""
        # Every field is a str, int, bool or None but ``digests`` and ``violation`` (copied
        # below): a shallow read, where ``asdict`` deep-copied each value (a fifth of an audit
        # line's CPU before its fsync).
        data = {name: getattr(self, name) for name in _AUDIT_FIELDS}
        data["at"] = format_instant(data.pop("at_ms"))
        data["digests"] = dict(self.digests)
        violation = data.pop("violation")
        if violation is not None:
            data["violation"] = violation.as_dict()
        return data

    def as_json_line(self) -> str:
        """``as_line`` as the embedded audit log writes it: one line of canonical JSON."""
        return json.dumps(self.as_line(), sort_keys=True, separators=(",", ":"))


_AUDIT_FIELDS: Final = tuple(item.name for item in fields(AuditEvent))


class AuditSink(Protocol):
    def record(self, event: AuditEvent) -> None: ...


@runtime_checkable
class CommittedAuditLog(Protocol):
    """An audit sink whose lines for committed mutations ride in the store's own commit.

    The engine puts a mutation's audit line in its change set as an ``audit_line`` outbox item,
    so the commit's one sync makes the line durable with the mutation it records; the log then
    takes the line without a sync of its own (``follow``), syncs many such lines at once, and
    hands back the items it made durable (``take_settled``) for the engine to drop from the
    outbox. Lines whose items a crash left in the outbox are appended once, by whoever drains
    it (``recover``): the items a process has appended are known to it, the others looked up
    in the log, so a line is never lost and never written twice.

    ``owed(item)`` says whether the item is still in the outbox (another process may have
    recovered it meanwhile); ``settle(items)`` drops them from it. Both are called under the
    log's lock, so a line a drainer recovered is never appended again by its committer.
    """

    def record(self, event: AuditEvent) -> None: ...

    def follow(self, item: OutboxItem, owed: Callable[[OutboxItem], bool]) -> None: ...

    def recover(
        self,
        items: Sequence[OutboxItem],
        owed: Callable[[OutboxItem], bool],
        settle: Callable[[Sequence[OutboxItem]], None],
    ) -> None: ...

    def take_settled(self) -> list[OutboxItem]: ...

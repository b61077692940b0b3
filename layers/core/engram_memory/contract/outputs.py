"""Models of the six tools' output values and of the result envelope (CONTRACT.md §2, §7, §12).

The engine builds outputs as plain canonical data (they are digested); these closed models are the
published ``outputSchema`` and the check, in tests, that every output the engine emits conforms.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from engram_memory.contract.errors import ErrorCode
from engram_memory.contract.models import (
    Citation,
    Component,
    PrimaryEvent,
    Reconciliation,
    Retention,
    ValidTime,
)
from engram_memory.contract.types import CandidateId, Digest, Instant, PageCursor, RecordId, Ref

Cursor = str  # dense decimal journal cursor: "0", "1", ...


class OutputModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrustOut(OutputModel):
    class_: Literal["asserted", "earned", "signed"] = Field(
        alias="class", description="Trust class assigned by the host's verifier."
    )
    evidence_digest: Digest = Field(description="Digest of the evidence the trust rests on.")
    verifier_id: str = Field(description="Which verifier assigned the class.")
    verifier_version: str = Field(description="Version of that verifier.")
    issued_at: Instant = Field(description="When the trust was assigned.")
    expires_at: Instant | None = Field(default=None, description="When the trust lapses, if ever.")
    revocation_epoch: int = Field(description="Revocation epoch at issue.")
    receipt_digest: Digest = Field(description="Digest of this trust receipt.")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RecordOut(OutputModel):
    """A stored record, filtered by the host's field allowlist; ``record_id`` is always present."""

    record_id: RecordId = Field(description="Stable id of the record.")
    record_digest: Digest | None = Field(default=None, description="Digest of the record.")
    schema_version: Literal[2] | None = Field(default=None, description="Payload schema version.")
    scope_ref: Ref | None = Field(
        default=None, description="Opaque scope reference injected by the host."
    )
    purpose_ref: Ref | None = Field(
        default=None, description="Purpose the record was captured under."
    )
    valid_time: ValidTime | None = Field(default=None, description="{t, t_end?} epoch ms.")
    components: list[Component] | None = Field(default=None, description="The components.")
    primary_component_id: Ref | None = Field(default=None, description="The primary component.")
    primary_event: PrimaryEvent | None = Field(default=None, description="The primary event.")
    citations: list[Citation] | None = Field(default=None, description="The citations.")
    retention: Retention | None = Field(default=None, description="Resolved retention.")
    reconciliation: Reconciliation | None = Field(
        default=None, description="Resolved reconciliation."
    )
    payload_digest: Digest | None = Field(default=None, description="Digest of the stored payload.")
    recorded_at: Instant | None = Field(default=None, description="Capture instant.")
    recorded_cursor: Cursor | None = Field(default=None, description="Capture cursor.")
    authorization_receipt_digest: Digest | None = Field(
        default=None, description="Capture authorization receipt."
    )
    trust: TrustOut | None = Field(default=None, description="Trust assigned by the host.")


class RedactedRecordOut(OutputModel):
    """A record as the host's field allowlist shows it, with the receipt of what it left out:
    what a search packet and a get both are, before their own fields."""

    record: RecordOut = Field(description="The redacted record.")
    redacted_fields: list[str] = Field(
        description="Sorted JSON pointers of omitted top-level fields."
    )
    redaction_receipt_digest: Digest = Field(description="Digest of the redaction receipt.")


class PacketOut(RedactedRecordOut):
    score: float = Field(description="Ranking score (higher is better).")
    rank: int = Field(ge=1, description="1-based rank, continuing across pages.")


class RankReceiptOut(OutputModel):
    request_digest: Digest = Field(description="Digest of query, purpose, policy and limits.")
    profile: Literal["offline_lexical_v1", "semantic_v1"] = Field(
        description="Ranking profile that ran."
    )
    profile_version: str = Field(description="Version of the profile.")
    profile_config_digest: Digest = Field(description="Digest of the profile's configuration.")
    valid_as_of: int = Field(description="Valid-time instant the ranking used, epoch ms.")
    system_as_of: Cursor = Field(description="Journal cursor the ranking used.")
    candidate_count: int = Field(ge=0, description="How many eligible candidates were ranked.")
    candidate_ids_digest: Digest = Field(description="Digest of the sorted candidate ids.")
    ordered_ids_digest: Digest = Field(description="Digest of the ranked ids in order.")
    scoring_formula_ref: str = Field(description="Reference of the scoring formula.")
    revalidation_receipt_digest: Digest = Field(description="Digest of the revalidation receipt.")
    issued_at: Instant = Field(description="When the receipt was issued.")
    receipt_digest: Digest = Field(description="Digest of this receipt.")


class SearchOutput(OutputModel):
    records: list[PacketOut] = Field(description="Ranked packets; [] means no match.")
    rank_receipt: RankReceiptOut = Field(description="What ran.")
    next_page_cursor: PageCursor | None = Field(
        default=None, description="Pass back to get the next page."
    )
    response_digest: Digest = Field(description="Digest of this value without response_digest.")


class ReadReceiptOut(OutputModel):
    record_id: RecordId = Field(description="The record read.")
    record_digest: Digest = Field(description="Its digest.")
    valid_as_of: int = Field(description="Valid-time instant checked, epoch ms.")
    system_as_of: Cursor = Field(description="Journal cursor checked.")
    validated_through_cursor: Cursor = Field(
        description="Cursor through which the record was revalidated."
    )
    authorization_receipt_digest: Digest = Field(description="Authorization receipt of this read.")
    revalidation_receipt_digest: Digest = Field(description="Revalidation receipt of this read.")
    checked_at: Instant = Field(description="When the read was checked.")
    receipt_digest: Digest = Field(description="Digest of this receipt.")


class GetOutput(RedactedRecordOut):
    read_receipt: ReadReceiptOut = Field(description="Receipt of the read.")
    packet_digest: Digest = Field(description="Digest of this value without packet_digest.")


class CaptureOutput(OutputModel):
    status: Literal["committed_pending", "duplicate_exact"] = Field(
        description="committed_pending: new sealed candidate; duplicate_exact: replay of the same key and content."
    )
    candidate_id: CandidateId = Field(description="Id of the pending candidate (not a record_id).")
    record_digest: Digest = Field(description="Digest the record will have if admitted.")
    cursor: Cursor = Field(description="Journal cursor of the capture event.")
    transaction_receipt_digest: Digest = Field(description="Digest of the transaction receipt.")


class AdmissionOutcomeOut(OutputModel):
    status: Literal["accepted", "rejected", "pending_adjudication", "duplicate_exact"] = Field(
        description="accepted (record_id set), rejected, or pending_adjudication (a human decides)."
    )
    candidate_id: CandidateId = Field(description="The candidate decided on.")
    record_id: RecordId | None = Field(default=None, description="Present when accepted.")
    cursor: Cursor = Field(description="Journal cursor of the decision.")
    decision_receipt_digest: Digest = Field(description="Digest of the policy decision envelope.")
    transaction_receipt_digest: Digest = Field(description="Digest of the transaction receipt.")


class RequestAdmissionOutput(OutputModel):
    outcome: AdmissionOutcomeOut = Field(description="The admission outcome.")
    replayed: bool = Field(
        description="True when this is the stored answer of an earlier call with the same key."
    )


class TransitionReceiptOut(OutputModel):
    event_id: str = Field(description="Id of the journal event.")
    operation: Literal["withdraw", "tombstone"] = Field(description="The operation.")
    from_state: str = Field(description="State before.")
    to_state: Literal["withdrawn", "tombstoned"] = Field(description="State after.")
    cursor: Cursor = Field(description="Journal cursor of the event.")
    event_digest: Digest = Field(description="Digest of the journal event.")
    authorization_receipt_digest: Digest = Field(
        description="Authorization (confirmation) receipt."
    )
    transaction_receipt_digest: Digest = Field(description="Digest of the transaction receipt.")


class WithdrawOutput(OutputModel):
    receipt: TransitionReceiptOut = Field(description="Receipt of the withdrawal.")
    replayed: bool = Field(description="True on a replay of the same key.")
    key_destruction: Literal["pending", "complete"] = Field(
        description="complete: the data key is durably destroyed; pending: queued, completes on its own."
    )


class ForgetOutput(OutputModel):
    receipt: TransitionReceiptOut = Field(description="Receipt of the tombstone.")
    replayed: bool = Field(description="True on a replay of the same key.")
    projection_invalidation: Literal["pending", "complete"] = Field(
        description="complete: every projection dropped the record; pending: still in progress."
    )
    coverage_receipt_digest: Digest | None = Field(
        default=None, description="Digest of the invalidation receipt, once complete."
    )


OUTPUT_MODELS: dict[str, type[OutputModel]] = {
    "search": SearchOutput,
    "get": GetOutput,
    "capture": CaptureOutput,
    "request_admission": RequestAdmissionOutput,
    "withdraw": WithdrawOutput,
    "forget": ForgetOutput,
}


class ErrorBody(OutputModel):
    code: ErrorCode = Field(description="Contract error code; act on it and on retriable only.")
    message: str = Field(
        description="The code's one constant, sanitized message (the same on every host, never"
        " a value); for INVALID_SCHEMA the field and the rule it broke are in the host's audit"
        " log under auditId."
    )
    retriable: bool = Field(description="True: back off and retry (same key for mutations).")


class FailureEnvelope(OutputModel):
    ok: Literal[False] = Field(description="Always false for a failure.")
    auditId: str = Field(description="Audit id of this call.")
    redactionClass: Literal["high"] = Field(description="Always 'high'.")
    error: ErrorBody = Field(description="The failure.")

"""Closed, frozen models of the six tools' inputs and outputs (CONTRACT.md §3, §7).

Inputs are validated strictly: no coercion (a boolean is not an integer), no extra fields at any
level, no ``null`` for an omitted optional field, UTF-8 byte bounds, NFC, canonical instants and
the capture cross-references. The JSON Schemas published to agents are generated from these
models (``contract.schemas``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from engram_memory.contract.types import (
    Attestation,
    CandidateId,
    ComponentText,
    Digest,
    IdempotencyKey,
    Instant,
    PageCursor,
    QueryText,
    RecordId,
    Ref,
    SafeInt,
)


class ClosedModel(BaseModel):
    """Base of every input model: closed, frozen, strict, and ``null`` is never a value.

    Each model's validator is built at its first use, not at import (``defer_build``): a
    server answers initialize and tools/list without validating a tool's arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_null(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for value in data.values():
                if value is None:
                    raise PydanticCustomError(
                        "null_value", "omit optional fields; null is not allowed"
                    )
        return data


# What a tool does to memory, as its MCP annotations say it (read-only; an idempotent write;
# an idempotent destructive write that needs a human's confirmation).
ToolEffect = Literal["read", "write", "destructive"]

TOOL_ERRORS: Final = (
    " Every result is an envelope: act on ok, error.code and error.retriable, never on the message."
    " retriable: back off and retry (for a mutation, with the same idempotency_key and identical"
    " arguments)."
)


class ToolInput(ClosedModel):
    """Base of the six tools' inputs: a tool is its input model, which also carries what an agent
    reads about the tool in ``tools/list`` (title, description, effect), so adding a tool means
    one input model, one output model, one use case and its wiring."""

    tool: ClassVar[ToolCard]


@dataclass(frozen=True, slots=True)
class ToolCard:
    """What an agent reads about a tool in ``tools/list`` (beside its input schema)."""

    title: str
    effect: ToolEffect
    description: str


# The fields that mean the same in every tool that takes them.
OperationKey = Annotated[
    IdempotencyKey,
    Field(description="16..256 UTF-8 bytes, NFC; one key per logical operation, reused on retry."),
]
OwnCandidate = Annotated[
    CandidateId, Field(description="A candidate_id exactly as capture returned it.")
]
ShownReason = Annotated[
    Ref, Field(description="Opaque reference to why; shown to the human who confirms.")
]
BoundPurpose = Annotated[
    Ref, Field(description="The purpose your host bound; must match it exactly.")
]


def _distinct(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise PydanticCustomError("not_distinct", "values must be distinct")
    return values


def _exact_int(value: Any) -> Any:
    # A Literal[int] compares by equality, so 2.0 would pass as 2: a float is not an integer.
    if isinstance(value, float):
        raise PydanticCustomError("int_type", "value must be an integer")
    return value


CitationIds = Annotated[
    list[Ref],
    Field(min_length=1, max_length=256, json_schema_extra={"uniqueItems": True}),
]


# --------------------------------------------------------------------------------------------
# search
# --------------------------------------------------------------------------------------------


class CapabilityPolicy(ClosedModel):
    minimum_channels: Literal["lexical", "lexical_and_semantic"] = Field(
        default="lexical",
        description=(
            "Ranking channels the answer must use. 'lexical_and_semantic' fails with "
            "RANKING_UNAVAILABLE when the semantic channel is down (no silent fallback)."
        ),
    )
    network: Literal["forbid", "allow"] = Field(
        default="forbid",
        description="'allow' grants nothing by itself: network use is the host's configuration.",
    )


class SearchInput(ToolInput):
    """Find current, accepted memories with citations and a rank receipt."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Search memory",
        effect="read",
        description=(
            "Search durable, admitted memories of this workspace (decisions with their reasons, verified"
            " facts with citations, conventions, recurring pitfalls and fixes). Use it before capture, and"
            " before answering from assumptions. Returns only current accepted records, each with its"
            " citations, a score and a rank, plus a rank receipt. records: [] means no match."
            " STALE_PAGE: search again without page_cursor. PROJECTION_OVERSIZED / RESULT_TOO_LARGE: lower"
            " limit or raise max_packet_bytes. RANKING_UNAVAILABLE: retry, or ask for lexical ranking."
            + TOOL_ERRORS
        ),
    )

    query: QueryText = Field(description="What to look for: 1..8,192 UTF-8 bytes, NFC.")
    purpose_ref: BoundPurpose
    limit: Annotated[int, Field(strict=True, ge=1, le=50)] = Field(
        default=10, description="Maximum records on this page (1..50, default 10)."
    )
    max_packet_bytes: Annotated[int, Field(strict=True, ge=4_096, le=1_048_576)] = Field(
        default=65_536,
        description="Byte budget for the page's record packets (4,096..1,048,576, default 65,536).",
    )
    capability_policy: CapabilityPolicy = Field(
        default_factory=CapabilityPolicy,
        description="Channels required for ranking; default lexical, network forbidden.",
    )
    page_cursor: PageCursor | None = Field(
        default=None,
        description="The previous page's next_page_cursor, copied exactly, with the same query and parameters.",
    )


# --------------------------------------------------------------------------------------------
# get
# --------------------------------------------------------------------------------------------


class GetInput(ToolInput):
    """Read one known, current record without ranking."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Get a memory",
        effect="read",
        description=(
            "Read one known record by record_id (copied exactly from search or admission), without ranking,"
            " with a read receipt. NOT_FOUND means unknown, out of your scope or no longer current —"
            " indistinguishable by design; do not probe variants." + TOOL_ERRORS
        ),
    )

    record_id: RecordId = Field(description="A record_id exactly as returned (mem_ + base32).")
    purpose_ref: BoundPurpose
    max_packet_bytes: Annotated[int, Field(strict=True, ge=4_096, le=1_048_576)] = Field(
        default=65_536,
        description="Byte budget for the returned packet (4,096..1,048,576, default 65,536).",
    )


# --------------------------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------------------------


class ValidTime(ClosedModel):
    t: SafeInt = Field(description="Start of validity, epoch milliseconds (safe integer).")
    t_end: SafeInt | None = Field(
        default=None, description="End of validity (inclusive), epoch milliseconds, t_end >= t."
    )

    @model_validator(mode="after")
    def _ordered(self) -> ValidTime:
        if self.t_end is not None and self.t_end < self.t:
            raise PydanticCustomError("valid_time_order", "t_end must be >= t")
        return self


class Component(ClosedModel):
    component_id: Ref = Field(description="Unique id of this component within the payload.")
    kind: Literal["context", "decision", "evidence"] = Field(description="What the text is.")
    text: ComponentText = Field(
        description="The memory text: 1..65,536 UTF-8 bytes, NFC. Never secrets."
    )
    citation_ids: CitationIds = Field(
        description="1..256 distinct citation ids, each resolving in payload.citations."
    )

    @model_validator(mode="after")
    def _distinct_citations(self) -> Component:
        _distinct(self.citation_ids)
        return self


class PrimaryEvent(ClosedModel):
    at: SafeInt = Field(description="When the event happened, epoch milliseconds (safe integer).")
    type_ref: Ref = Field(description="Opaque reference to the event type.")
    citation_id: Ref = Field(
        description="A citation of the primary component that supports the event."
    )


class Locator(ClosedModel):
    scheme: Ref = Field(description="Locator scheme, e.g. 'document' or 'url'.")
    value: Ref = Field(description="Where in the source the cited content is.")


class Citation(ClosedModel):
    citation_id: Ref = Field(description="Unique id of this citation within the payload.")
    source_ref: Ref = Field(description="Opaque reference to the cited source.")
    locator: Locator = Field(description="Where in the source.")
    content_digest: Digest = Field(description="sha256: + 64 lowercase hex of the cited content.")
    observed_at: Instant | None = Field(
        default=None, description="When the content was observed: YYYY-MM-DDTHH:mm:ss.sssZ."
    )


class Retention(ClosedModel):
    derivative_rule: Literal["retain", "make-ineligible"] = Field(
        description="'make-ineligible' (default) or 'retain' (needs explicit host permission)."
    )
    expires_at: Instant | None = Field(
        default=None,
        description="Optional expiry, strictly after the capture instant and within the host ceiling.",
    )


class Reconciliation(ClosedModel):
    family_refs: Annotated[
        list[Ref], Field(max_length=64, json_schema_extra={"uniqueItems": True})
    ] = Field(
        description="Sorted, unique reconciliation families (needs host consent), at most 64."
    )

    @model_validator(mode="after")
    def _sorted_unique(self) -> Reconciliation:
        # UTF-16 code-unit order, as upstream (JS string comparison) and RFC 8785 key sorting.
        refs = [ref.encode("utf-16-be") for ref in self.family_refs]
        if any(a >= b for a, b in pairwise(refs)):
            raise PydanticCustomError("family_refs_order", "family_refs must be sorted and unique")
        return self


class Payload(ClosedModel):
    schema_version: Annotated[Literal[2], BeforeValidator(_exact_int)] = Field(
        description="Always 2."
    )
    purpose_ref: BoundPurpose
    valid_time: ValidTime = Field(description="When the memory is true, epoch milliseconds.")
    components: Annotated[list[Component], Field(min_length=1, max_length=64)] = Field(
        description="1..64 components; ids unique; every citation resolves."
    )
    primary_component_id: Ref = Field(
        description="The component the memory is about; must resolve."
    )
    primary_event: PrimaryEvent = Field(
        description="The event the memory records; its citation is in the primary component."
    )
    citations: Annotated[list[Citation], Field(min_length=1, max_length=256)] = Field(
        description="1..256 citations with unique ids."
    )
    retention: Retention | None = Field(
        default=None,
        description="Omit unless instructed; default {derivative_rule: make-ineligible}.",
    )
    reconciliation: Reconciliation | None = Field(
        default=None,
        description="Omit unless instructed; reconciliation families need host consent.",
    )


class Evidence(ClosedModel):
    evidence_ref: Ref = Field(description="Opaque reference to the evidence.")
    evidence_digest: Digest = Field(description="sha256: + 64 lowercase hex of the evidence.")
    citation_ids: CitationIds = Field(
        description="1..256 distinct citation ids resolving in payload.citations."
    )
    attestation: Attestation | None = Field(
        default=None, description="Optional attestation, at most 4,096 UTF-8 bytes."
    )

    @model_validator(mode="after")
    def _distinct_citations(self) -> Evidence:
        _distinct(self.citation_ids)
        return self


class CaptureInput(ToolInput):
    """Submit cited material as an encrypted pending candidate."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Capture a memory (pending)",
        effect="write",
        description=(
            "Submit durable, cited knowledge worth finding again later (a decision and its reason, a"
            " verified fact with a source, a convention, a hand-off fact) as an encrypted PENDING candidate."
            " Search first: if an equivalent current record exists, cite its record_id instead. Never"
            " capture secrets, credentials, tokens, passwords, connection strings, .env values or the host's"
            " own ids; never capture chat transcripts, raw tool output, temporary task state or speculation."
            " A candidate is not searchable or readable until request_admission accepts it; a candidate_id"
            " is not a record_id. status committed_pending = new candidate; duplicate_exact = the same"
            " idempotency_key with the same content again (not a semantic duplicate check)."
            " DIGEST_CONFLICT: the key was used for other content. Omit retention and reconciliation unless"
            " instructed." + TOOL_ERRORS
        ),
    )

    idempotency_key: OperationKey
    payload: Payload = Field(description="The memory to capture.")
    evidence: Evidence = Field(description="The evidence supporting it.")

    @model_validator(mode="after")
    def _cross_references(self) -> CaptureInput:
        payload = self.payload
        citation_ids = [c.citation_id for c in payload.citations]
        component_ids = [c.component_id for c in payload.components]
        known = set(citation_ids)
        if len(known) != len(citation_ids) or len(set(component_ids)) != len(component_ids):
            raise PydanticCustomError("duplicate_id", "citation and component ids must be unique")
        for component in payload.components:
            if not set(component.citation_ids) <= known:
                raise PydanticCustomError(
                    "unresolved_citation", "component citation does not resolve"
                )
        primary = next(
            (c for c in payload.components if c.component_id == payload.primary_component_id), None
        )
        if primary is None:
            raise PydanticCustomError(
                "unresolved_component", "primary_component_id does not resolve"
            )
        event_citation = payload.primary_event.citation_id
        if event_citation not in known or event_citation not in primary.citation_ids:
            raise PydanticCustomError(
                "unresolved_citation",
                "primary_event.citation_id must be cited by the primary component",
            )
        if not set(self.evidence.citation_ids) <= known:
            raise PydanticCustomError("unresolved_citation", "evidence citation does not resolve")
        return self


# --------------------------------------------------------------------------------------------
# request_admission, withdraw, forget
# --------------------------------------------------------------------------------------------


class RequestAdmissionInput(ToolInput):
    """Ask the host's admission policy to decide on one of your pending candidates."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Request admission of a memory",
        effect="write",
        description=(
            "Ask the host's admission policy to decide on one of your pending candidates. You cannot supply"
            " or influence the decision; report the outcome exactly. accepted: the record is now current and"
            " outcome.record_id identifies it. rejected: the policy refused it (e.g. it held a secret); the"
            " candidate is destroyed. pending_adjudication: a human decides later; nothing was stored —"
            " including when forgotten content was captured again. These are successful outcomes, not"
            " errors. NOT_FOUND: unknown, not yours, or not pending." + TOOL_ERRORS
        ),
    )

    candidate_id: OwnCandidate
    idempotency_key: OperationKey


class WithdrawInput(ToolInput):
    """End one of your pending candidates and crypto-shred it (needs human confirmation)."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Withdraw a pending memory",
        effect="destructive",
        description=(
            "End one of your pending candidates (for example captured by mistake) and crypto-shred it: its"
            " data key is destroyed, so it can never be read again. Needs a human's confirmation, which the"
            " host asks for; you cannot confirm yourself. gate_failed: the human declined or the confirmation"
            " failed — ask the human through the host, do not retry blindly. ALREADY_TERMINAL: already"
            " withdrawn or rejected. ILLEGAL_TRANSITION: it was admitted; use forget on its record."
            + TOOL_ERRORS
        ),
    )

    candidate_id: OwnCandidate
    idempotency_key: OperationKey
    reason_ref: ShownReason


class ForgetInput(ToolInput):
    """Make an admitted record permanently ineligible (needs human confirmation)."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Forget a memory",
        effect="destructive",
        description=(
            "Make an admitted record permanently ineligible: search and get stop returning it at once and"
            " the same content can never be admitted again without a human. Needs a human's confirmation,"
            " which the host asks for. gate_failed: declined or failed confirmation. ALREADY_TERMINAL: it"
            " was already forgotten. projection_invalidation pending/complete reports the index clean-up,"
            " which completes on its own." + TOOL_ERRORS
        ),
    )

    record_id: RecordId = Field(description="A record_id exactly as returned.")
    idempotency_key: OperationKey
    reason_ref: ShownReason


# The tools, in the order agents see them: each grant name and its input model.
INPUT_MODELS: dict[str, type[ToolInput]] = {
    "search": SearchInput,
    "get": GetInput,
    "capture": CaptureInput,
    "request_admission": RequestAdmissionInput,
    "withdraw": WithdrawInput,
    "forget": ForgetInput,
}

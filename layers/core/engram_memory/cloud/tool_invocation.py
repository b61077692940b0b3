"""The wire format between the MCP adapter and the tool functions (and into an execution).

The MCP adapter Lambda verifies the caller and invokes one tool function per MCP request
(``RequestResponse``) with a ``ToolInvocation``::

    {"tool": "search", "arguments": {...}, "audit_id": "aud_<32 hex>",
     "context": {"tenant_id": ..., "workspace_id": ..., "principal": ..., "purpose_ref": ...,
                 "grants": [...], "confirm_required": [...],
                 "retention": {"allow_retain": false, "max_expires_in_s": 2592000},
                 "reconcile_consent": false, "agent_id"?: ..., "session_id"?: ...,
                 "deadline_ms"?: <epoch ms>,
                 "host_fact_digests"?: {"key": <64 hex>, "digests": [<64 hex>, ...]},
                 "credential_id"?: <the token's jti>, "credential_issued_at_ms"?: <epoch ms>,
                 "approver"?: <the subject who answers the principal's confirmations>},
     "approval"?: {...``engine.gate.Approval`` as JSON, when the adapter holds one...},
     "declined"?: true (the human declined that approval's question: the function spends its id),
     "approval_mac"?: the adapter's attestation of a form answer (``cloud.proofs``),
     "proof": the adapter's MAC of the invocation under the invocation key (``cloud.proofs``)}

The tool function refuses (-32603, audited) an invocation whose ``proof`` does not verify:
invoking a tool function directly is not an identity, only the adapter's signature is.

No credential crosses this boundary: the bearer token the adapter verified travels only as a
keyed digest (``engine.context.HostFactDigests``), which the admission policy can match a
memory's text against and nobody can present as a token.

The function answers with the contract envelope, with ``{"confirmation_required": {...}}`` (the
operation to approve; for withdraw/forget with the ``approval_url`` of its run), or with
``{"protocol_error": {"code": -32602 | -32603, "message": ..., "data"?: {...}}}`` for a protocol
refusal (the code's constant message, and for -32603 its ``data``: ``{"reason": ...}``; the
adapter turns it into a JSON-RPC error). Any other failure is a Lambda function error.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from engram_memory.cloud.settings import HostBinding, ToolName
from engram_memory.contract.errors import (
    ProtocolRefusal,
    RefusalReason,
    TrustedContextUnavailable,
)
from engram_memory.engine.context import (
    CONFIRMABLE,
    HostFactDigests,
    RetentionPolicy,
    Scope,
    TrustedContext,
)
from engram_memory.engine.gate import Approval, ConfirmationRequest

AUDIT_ID_PATTERN: Final = r"^aud_[0-9a-f]{32}$"  # what ``engine.service.new_audit_id`` mints
_MAX_ID_CHARS: Final = 1_024
_MAX_HOST_FACTS: Final = 8

ConfirmableTool = Literal["capture", "request_admission"]
Identifier = Annotated[StrictStr, Field(min_length=1, max_length=_MAX_ID_CHARS)]


def _not_blank(value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise ValueError("must not be blank")
    return value


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("must not repeat a name")
    return values


class _EventModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InvocationRetention(_EventModel):
    """The host's retention policy for this call (already capped by the adapter)."""

    allow_retain: StrictBool = Field(description="May the agent ask to retain memories?")
    max_expires_in_s: StrictInt = Field(ge=0, description="Ceiling of a requested expiry, s.")


Hex64 = Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")]


class InvocationHostFacts(_EventModel):
    """``HostFactDigests`` on the wire: the per-call key and the HMAC-SHA256 digests."""

    key: Hex64 = Field(description="The call's random HMAC key, hex.")
    digests: list[Hex64] = Field(max_length=_MAX_HOST_FACTS, description="One per host fact.")

    @classmethod
    def of(cls, facts: HostFactDigests) -> InvocationHostFacts:
        return cls(key=facts.key.hex(), digests=sorted(facts.digests))

    def host_fact_digests(self) -> HostFactDigests:
        return HostFactDigests(bytes.fromhex(self.key), frozenset(self.digests))


class InvocationContext(_EventModel):
    """The trusted context the MCP adapter derived from the verified token (never arguments)."""

    tenant_id: Identifier = Field(description="Tenant of the call; must be this stack's tenant.")
    workspace_id: Identifier = Field(description="Workspace the call is scoped to.")
    principal: Identifier = Field(description="The verified subject making the call.")
    purpose_ref: Identifier = Field(description="The purpose the host bound to the call.")
    grants: list[ToolName] = Field(description="Tools the principal may call (no repeats).")
    confirm_required: list[ConfirmableTool] = Field(
        description="Confirmable tools the host requires a human confirmation for (no repeats)."
    )
    retention: InvocationRetention = Field(description="The retention policy of the call.")
    reconcile_consent: StrictBool = Field(description="Host and token consent to reconciling.")
    agent_id: Identifier | None = Field(default=None, description="The agent, when known.")
    session_id: Identifier | None = Field(default=None, description="The session, when known.")
    deadline_ms: StrictInt | None = Field(
        default=None, ge=0, description="Absolute deadline of the call, epoch milliseconds."
    )
    host_fact_digests: InvocationHostFacts | None = Field(
        default=None,
        description="Keyed digests of the host binding facts no memory may contain (the token).",
    )
    # Not credentials: the token's id (jti) and issue time, for the revocation check
    # (``engine.kernel.check_revoked``: ``admin tokens revoke`` in both compositions).
    credential_id: Identifier | None = Field(
        default=None, description="The verified token's id (its jti claim), when it has one."
    )
    credential_issued_at_ms: StrictInt | None = Field(
        default=None, ge=0, description="When the verified token was issued, epoch milliseconds."
    )
    approver: Identifier | None = Field(
        default=None,
        description="Who answers the principal's confirmations on the approval page (a subject"
        " the token's approver claim names); absent: the principal, signed in as a person.",
    )

    _check_ids = field_validator(
        "tenant_id",
        "workspace_id",
        "principal",
        "purpose_ref",
        "agent_id",
        "session_id",
        "approver",
    )(_not_blank)
    _check_names = field_validator("grants", "confirm_required")(_unique)


def confirmation_required(request: ConfirmationRequest) -> dict[str, Any]:
    """The function's answer when the call needs a human approval it was not given."""
    return {
        "confirmation_required": {
            "tool": request.tool,
            "target": request.target,
            "operation_digest": request.operation_digest,
            "principal": request.principal,
            "tenant_id": request.scope.tenant_id,
            "workspace_id": request.scope.workspace_id,
            "reason_ref": request.reason_ref,
            "summary": request.summary,
        }
    }


def request_of(answer: Mapping[str, Any]) -> ConfirmationRequest:
    """The ``ConfirmationRequest`` a ``confirmation_required`` answer describes."""
    data = answer["confirmation_required"]
    return ConfirmationRequest(
        tool=str(data["tool"]),
        target=None if data.get("target") is None else str(data["target"]),
        operation_digest=str(data["operation_digest"]),
        principal=str(data["principal"]),
        scope=Scope(str(data["tenant_id"]), str(data["workspace_id"])),
        reason_ref=None if data.get("reason_ref") is None else str(data["reason_ref"]),
        summary=str(data["summary"]),
    )


class ToolInvocation(_EventModel):
    """The event of one tool function invocation (the adapter's ``Invoke`` payload)."""

    tool: Annotated[StrictStr, Field(min_length=1, max_length=64)] = Field(
        description="The tool to run; must be the tool this function serves."
    )
    arguments: JsonValue = Field(description="The tool's raw arguments, as the agent sent them.")
    context: InvocationContext = Field(description="The verified trusted context.")
    audit_id: Annotated[StrictStr, Field(pattern=AUDIT_ID_PATTERN)] = Field(
        description="The call's audit id (``new_audit_id()``), shared by adapter and function."
    )
    approval: Approval | None = Field(
        default=None, description="The human approval for this call, when it needs one."
    )
    declined: StrictBool = Field(
        default=False,
        description="The human declined ``approval``'s question: spend its id, answer gate_failed.",
    )
    approval_mac: StrictStr | None = Field(
        default=None,
        max_length=512,
        description="The adapter's attestation of a form answer (``cloud.proofs.attest_form``).",
    )
    proof: StrictStr | None = Field(
        default=None,
        max_length=512,
        description="The adapter's MAC of this invocation (``cloud.proofs.invocation_mac``).",
    )

    @classmethod
    def from_trusted(
        cls,
        tool: str,
        arguments: Any,
        ctx: TrustedContext,
        approval: Approval | None = None,
        *,
        declined: bool = False,
    ) -> ToolInvocation:
        """The invocation of ``tool`` for the adapter's verified context ``ctx``.

        Everything but ``cancellation`` crosses the boundary; ``ctx.audit_id`` must come from
        ``new_audit_id()``. Raises ``pydantic.ValidationError`` when ``ctx`` cannot be sent.
        """
        carried = approval.model_dump() if approval is not None else None
        return cls.model_validate(
            {
                "tool": tool,
                "arguments": arguments,
                "audit_id": ctx.audit_id,
                "approval": carried,
                "declined": declined,
                "context": _crossing(ctx),
            }
        )

    def to_event(self) -> dict[str, Any]:
        """The JSON payload to send to the tool function (absent optional fields omitted)."""
        return self.model_dump(mode="json", exclude_none=True)

    def trusted_context(self, binding: HostBinding) -> TrustedContext:
        """The engine's context; refuses (``TrustedContextUnavailable``) a foreign tenant.

        The retention ceiling is capped again by this function's own ceiling.
        """
        ctx = self.context
        if ctx.tenant_id != binding.tenant_id:
            raise TrustedContextUnavailable(RefusalReason.TENANT_MISMATCH)
        kept = ctx.model_dump(exclude=_NOT_KEPT_AS_SENT)
        return TrustedContext.bound(
            Scope(ctx.tenant_id, ctx.workspace_id),
            ctx.principal,
            ctx.purpose_ref,
            audit_id=self.audit_id,
            grants=frozenset(ctx.grants),
            confirm_required=frozenset(ctx.confirm_required),
            retention=RetentionPolicy(
                allow_retain=ctx.retention.allow_retain,
                max_expires_in_s=min(ctx.retention.max_expires_in_s, binding.retention_ceiling_s),
            ),
            host_fact_digests=(
                ctx.host_fact_digests.host_fact_digests()
                if ctx.host_fact_digests is not None
                else None
            ),
            **kept,
        )


# What of the context stays in the adapter's process: the audit id travels beside the context,
# the cancellation is the process's own, the host facts (the bearer token) cross as keyed digests.
STAYS_IN_THE_ADAPTER: Final = frozenset({"audit_id", "cancellation", "host_facts"})
# The fields that cross in another form than the engine's (the rest cross as they are).
_CONVERTED: Final = frozenset({"grants", "confirm_required", "retention", "host_fact_digests"})
_BOUND: Final = frozenset({"tenant_id", "workspace_id", "principal", "purpose_ref"})
# Computed once: both directions run on every tool call.
_NOT_AS_THEY_ARE: Final = STAYS_IN_THE_ADAPTER | _CONVERTED
_NOT_KEPT_AS_SENT: Final = set(_CONVERTED | _BOUND)


def _crossing(ctx: TrustedContext) -> dict[str, Any]:
    """The context as it crosses to a tool function, field for field (``InvocationContext``)."""
    crossing = {
        field.name: getattr(ctx, field.name)
        for field in dataclasses.fields(ctx)
        if field.name not in _NOT_AS_THEY_ARE
    }
    return crossing | {
        "grants": sorted(ctx.grants),
        "confirm_required": sorted(ctx.confirm_required & CONFIRMABLE),
        "retention": dataclasses.asdict(ctx.retention),
        "host_fact_digests": _digests_of(ctx),
    }


def _digests_of(ctx: TrustedContext) -> dict[str, Any] | None:
    """The context's host facts as keyed digests: the facts themselves never leave."""
    digests = HostFactDigests.of(ctx.host_facts) if ctx.host_facts else ctx.host_fact_digests
    return InvocationHostFacts.of(digests).model_dump() if digests is not None else None


def parse_invocation(payload: Any) -> ToolInvocation:
    """Validate an invocation event; ``TrustedContextUnavailable`` when it is malformed."""
    try:
        return ToolInvocation.model_validate(payload)
    except ValidationError:  # the adapter builds the event: a malformed one is the host's fault
        raise TrustedContextUnavailable(RefusalReason.INTERNAL_ERROR) from None


def context_from_event(payload: Any, env: Mapping[str, str] = os.environ) -> TrustedContext:
    """The trusted context of an invocation event, checked against this function's tenant.

    Raises ``TrustedContextUnavailable`` (-32603) for a malformed event or a foreign tenant, and
    ``ConfigurationError`` when ``ENGRAM_TENANT_ID`` is not set.
    """
    return parse_invocation(payload).trusted_context(HostBinding.from_env(env))


def protocol_error(refusal: ProtocolRefusal) -> dict[str, Any]:
    """The function's answer for a protocol refusal: the adapter makes it a JSON-RPC error
    (``mcp_adapter``), its ``data`` included."""
    error: dict[str, Any] = {"code": refusal.jsonrpc_code, "message": refusal.message}
    data = refusal.data
    if data is not None:
        error["data"] = data
    return {"protocol_error": error}

"""The composition root of the cloud deployment: the engine of one tenant's tool functions.

The MCP adapter Lambda verifies the caller and invokes one tool function per call
(``RequestResponse``) with a ``ToolInvocation``::

    {"tool": "search", "arguments": {...}, "audit_id": "aud_<32 hex>",
     "context": {"tenant_id": ..., "workspace_id": ..., "principal": ..., "purpose_ref": ...,
                 "grants": [...], "confirm_required": [...],
                 "retention": {"allow_retain": false, "max_expires_in_s": 2592000},
                 "reconcile_consent": false, "agent_id"?: ..., "session_id"?: ...,
                 "deadline_ms"?: <epoch ms>,
                 "host_fact_digests"?: {"key": <64 hex>, "digests": [<64 hex>, ...]}}}

No credential crosses this boundary: the bearer token the adapter verified travels only as a
keyed digest (``engine.context.HostFactDigests``), which the admission policy can match a
memory's text against and nobody can present as a token.

The function answers with the contract envelope, or with
``{"protocol_error": {"code": -32602 | -32603, "message": ...}}`` for a protocol refusal (the
adapter turns it into a JSON-RPC error). Any other failure is a Lambda function error.

``build_engine`` wires the engine from the environment the SAM template sets (see
``build_engine``); ``tool_handler`` is the whole of each ``functions/<tool>/app.py``. Nothing
here opens a client or reads the environment when imported: boto3, the AWS Encryption SDK and
opensearch-py are imported inside ``build_engine``, which the handler calls on its first
invocation (the cold-start singleton).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, cast

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

from .contract.errors import ProtocolRefusal, TrustedContextUnavailable, UnknownTool
from .engine.context import (
    CONFIRMABLE,
    TOOLS,
    HostFactDigests,
    RetentionPolicy,
    Scope,
    TrustedContext,
)
from .engine.gate import Approval, ConfirmationNeeded, ConfirmationRequest
from .engine.ports import (
    AuditSink,
    Clock,
    Embedder,
    LexicalIndex,
    Store,
    Vault,
    VectorIndex,
)
from .engine.service import Engine, EngineSettings, new_audit_id
from .observability import count_admission_outcome, get_logger, get_tracer, instrumented

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger, Tracer
    from boto3.session import Session
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_kms.client import KMSClient
    from mypy_boto3_s3.client import S3Client

    from .adapters.aws.execution_gate import ExecutionGate
    from .engine.ports import AdmissionPolicy

__all__ = [
    "AUDIT_ID_PATTERN",
    "DEFAULT_OPENSEARCH_INDEX",
    "DEFAULT_RETENTION_CEILING_S",
    "LAMBDA_DEADLINE_MARGIN_MS",
    "MIN_CURSOR_KEY_BYTES",
    "ConfigurationError",
    "EngineHandler",
    "HostBinding",
    "InvocationContext",
    "InvocationRetention",
    "ToolHandler",
    "ToolInvocation",
    "build_engine",
    "context_from_event",
    "parse_invocation",
    "protocol_error",
    "read_cursor_key",
    "tool_handler",
]

AUDIT_ID_PATTERN: Final = r"^aud_[0-9a-f]{32}$"  # what ``engine.service.new_audit_id`` mints
DEFAULT_OPENSEARCH_INDEX: Final = "engram-records"
DEFAULT_RETENTION_CEILING_S: Final = RetentionPolicy().max_expires_in_s
MIN_CURSOR_KEY_BYTES: Final = 32
# The tools whose human confirmation and commit run in a Step Functions execution.
GATED_TOOLS: Final = frozenset({"withdraw", "forget"})
# The engine stops starting work this long before the Lambda would be killed, so a call ends
# with DEADLINE_EXCEEDED (retriable, nothing half-done) rather than a timeout mid-commit.
LAMBDA_DEADLINE_MARGIN_MS: Final = 1_000
_MAX_ID_CHARS: Final = 1_024
_MAX_HOST_FACTS: Final = 8


class ConfigurationError(RuntimeError):
    """The function's environment is missing or invalid, or its secret unreadable.

    A deployment error: the handler lets it fail the invocation (a Lambda function error), and
    the next invocation tries again. The message names the variable, never a secret's value.
    """


# --------------------------------------------------------------------------------------------
# The invocation event (the MCP adapter builds it with ``ToolInvocation.from_trusted``)
# --------------------------------------------------------------------------------------------

ToolName = Literal["search", "get", "capture", "request_admission", "withdraw", "forget"]
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

    _check_ids = field_validator(
        "tenant_id", "workspace_id", "principal", "purpose_ref", "agent_id", "session_id"
    )(_not_blank)
    _check_names = field_validator("grants", "confirm_required")(_unique)


class InvocationApproval(_EventModel):
    """A human approval the adapter obtained (elicitation round trip) for this exact call.

    The tool function's engine checks it like any approval: bound to tool, target, operation
    digest, principal and scope, within 300 s of issue and 30 s of approval, used once.
    """

    approval_id: Annotated[StrictStr, Field(min_length=1, max_length=128)] = Field(
        description="Single-use id of the approval (the requestState nonce)."
    )
    tool: Annotated[StrictStr, Field(min_length=1, max_length=64)] = Field(
        description="Approved tool."
    )
    target: StrictStr | None = Field(default=None, description="Approved target, if any.")
    operation_digest: Annotated[StrictStr, Field(pattern=r"^sha256:[0-9a-f]{64}$")] = Field(
        description="Digest of the approved operation."
    )
    principal: Annotated[StrictStr, Field(min_length=1, max_length=1024)] = Field(
        description="Principal the approval was given for."
    )
    tenant_id: Annotated[StrictStr, Field(min_length=1, max_length=1024)] = Field(
        description="Scope."
    )
    workspace_id: Annotated[StrictStr, Field(min_length=1, max_length=1024)] = Field(
        description="Scope."
    )
    issued_at_ms: StrictInt = Field(description="When the confirmation was requested.")
    approved_at_ms: StrictInt = Field(description="When the human approved.")

    @classmethod
    def of(cls, approval: Approval) -> InvocationApproval:
        return cls(
            approval_id=approval.approval_id,
            tool=approval.tool,
            target=approval.target,
            operation_digest=approval.operation_digest,
            principal=approval.principal,
            tenant_id=approval.scope.tenant_id,
            workspace_id=approval.scope.workspace_id,
            issued_at_ms=approval.issued_at_ms,
            approved_at_ms=approval.approved_at_ms,
        )

    def approval(self) -> Approval:
        return Approval(
            approval_id=self.approval_id,
            tool=self.tool,
            target=self.target,
            operation_digest=self.operation_digest,
            principal=self.principal,
            scope=Scope(self.tenant_id, self.workspace_id),
            issued_at_ms=self.issued_at_ms,
            approved_at_ms=self.approved_at_ms,
        )


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
    approval: InvocationApproval | None = Field(
        default=None, description="The human approval for this call, when it needs one."
    )

    @classmethod
    def from_trusted(
        cls, tool: str, arguments: Any, ctx: TrustedContext, approval: Approval | None = None
    ) -> ToolInvocation:
        """The invocation of ``tool`` for the adapter's verified context ``ctx``.

        Everything but ``cancellation`` crosses the boundary; ``ctx.audit_id`` must come from
        ``new_audit_id()``. Raises ``pydantic.ValidationError`` when ``ctx`` cannot be sent.
        """
        carried = InvocationApproval.of(approval).model_dump() if approval is not None else None
        return cls.model_validate(
            {
                "tool": tool,
                "arguments": arguments,
                "audit_id": ctx.audit_id,
                "approval": carried,
                "context": {
                    "tenant_id": ctx.tenant_id,
                    "workspace_id": ctx.workspace_id,
                    "principal": ctx.principal,
                    "purpose_ref": ctx.purpose_ref,
                    "grants": sorted(ctx.grants),
                    "confirm_required": sorted(ctx.confirm_required & CONFIRMABLE),
                    "retention": {
                        "allow_retain": ctx.retention.allow_retain,
                        "max_expires_in_s": ctx.retention.max_expires_in_s,
                    },
                    "reconcile_consent": ctx.reconcile_consent,
                    "agent_id": ctx.agent_id,
                    "session_id": ctx.session_id,
                    "deadline_ms": ctx.deadline_ms,
                    "host_fact_digests": _digests_of(ctx),
                },
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
            raise TrustedContextUnavailable()
        return TrustedContext(
            tenant_id=ctx.tenant_id,
            workspace_id=ctx.workspace_id,
            principal=ctx.principal,
            purpose_ref=ctx.purpose_ref,
            audit_id=self.audit_id,
            grants=frozenset(ctx.grants),
            confirm_required=frozenset(ctx.confirm_required),
            retention=RetentionPolicy(
                allow_retain=ctx.retention.allow_retain,
                max_expires_in_s=min(ctx.retention.max_expires_in_s, binding.retention_ceiling_s),
            ),
            reconcile_consent=ctx.reconcile_consent,
            agent_id=ctx.agent_id,
            session_id=ctx.session_id,
            deadline_ms=ctx.deadline_ms,
            host_fact_digests=(
                ctx.host_fact_digests.host_fact_digests()
                if ctx.host_fact_digests is not None
                else None
            ),
        )


def _digests_of(ctx: TrustedContext) -> dict[str, Any] | None:
    """The context's host facts as keyed digests: the facts themselves never leave."""
    digests = HostFactDigests.of(ctx.host_facts) if ctx.host_facts else ctx.host_fact_digests
    return InvocationHostFacts.of(digests).model_dump() if digests is not None else None


@dataclasses.dataclass(frozen=True, slots=True)
class HostBinding:
    """What a tool function checks every context against: its tenant and retention ceiling."""

    tenant_id: str
    retention_ceiling_s: int = DEFAULT_RETENTION_CEILING_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HostBinding:
        """``ENGRAM_TENANT_ID`` (required) and ``ENGRAM_RETENTION_CEILING_S`` (seconds, >= 0)."""
        tenant_id = _required(env, "ENGRAM_TENANT_ID")
        raw = env.get("ENGRAM_RETENTION_CEILING_S", "").strip()
        if not raw:
            return cls(tenant_id)
        if not raw.isdecimal():
            raise ConfigurationError("ENGRAM_RETENTION_CEILING_S must be a whole number of seconds")
        return cls(tenant_id, int(raw))


def parse_invocation(payload: Any) -> ToolInvocation:
    """Validate an invocation event; ``TrustedContextUnavailable`` when it is malformed."""
    try:
        return ToolInvocation.model_validate(payload)
    except ValidationError:
        raise TrustedContextUnavailable() from None


def context_from_event(payload: Any, env: Mapping[str, str] = os.environ) -> TrustedContext:
    """The trusted context of an invocation event, checked against this function's tenant.

    Raises ``TrustedContextUnavailable`` (-32603) for a malformed event or a foreign tenant, and
    ``ConfigurationError`` when ``ENGRAM_TENANT_ID`` is not set.
    """
    return parse_invocation(payload).trusted_context(HostBinding.from_env(env))


def protocol_error(refusal: ProtocolRefusal) -> dict[str, Any]:
    """The function's answer for a protocol refusal: the adapter makes it a JSON-RPC error."""
    return {"protocol_error": {"code": refusal.jsonrpc_code, "message": refusal.message}}


# --------------------------------------------------------------------------------------------
# The composition
# --------------------------------------------------------------------------------------------


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"{name} must be set")
    return value


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    """``name``'s value, one of ``allowed`` (the first is the default when unset)."""
    value = env.get(name, "").strip() or allowed[0]
    if value not in allowed:
        raise ConfigurationError(f"{name} must be " + " or ".join(f"'{a}'" for a in allowed))
    return value


def _admission_mode(env: Mapping[str, str]) -> Literal["auto", "manual"]:
    return (
        "manual"
        if _choice(env, "ENGRAM_ADMISSION_MODE", ("auto", "manual")) == "manual"
        else "auto"
    )


def _fusion(env: Mapping[str, str]) -> Literal["minmax", "rrf"]:
    return "rrf" if _choice(env, "ENGRAM_FUSION", ("minmax", "rrf")) == "rrf" else "minmax"


def _semantic(env: Mapping[str, str]) -> bool:
    return _choice(env, "ENGRAM_SEMANTIC", ("off", "local")) == "local"


def read_secret_bytes(
    secrets_client: Any, secret_arn: str, *, name: str, variable: str, minimum: int
) -> bytes:
    """A Secrets Manager secret's binary value, or its string value as UTF-8.

    Raises ``ConfigurationError`` naming ``variable`` when the secret cannot be read or is shorter
    than ``minimum`` bytes; the value never appears in the message.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = secrets_client.get_secret_value(SecretId=secret_arn)
    except (BotoCoreError, ClientError) as exc:
        raise ConfigurationError(f"the {name} secret ({variable}) is unreadable") from exc
    binary = response.get("SecretBinary")
    value = bytes(binary) if binary is not None else str(response.get("SecretString", "")).encode()
    if len(value) < minimum:
        raise ConfigurationError(f"the {name} secret must hold at least {minimum} bytes")
    return value


def read_cursor_key(secrets_client: Any, secret_arn: str) -> bytes:
    """The search cursor HMAC key, read once per cold start (see ``read_secret_bytes``)."""
    return read_secret_bytes(
        secrets_client,
        secret_arn,
        name="cursor",
        variable="ENGRAM_CURSOR_SECRET_ARN",
        minimum=MIN_CURSOR_KEY_BYTES,
    )


def build_engine(
    env: Mapping[str, str] = os.environ,
    *,
    session: Session | None = None,
    dynamodb_client: DynamoDBClient | None = None,
    s3_client: S3Client | None = None,
    kms_client: KMSClient | None = None,
    secrets_client: Any = None,
    opensearch_client: Any = None,
    store: Store | None = None,
    vault: Vault | None = None,
    lexical_index: LexicalIndex | None = None,
    admission_policy: AdmissionPolicy | None = None,
    clock: Clock | None = None,
    audit: AuditSink | None = None,
    embedder: Embedder | None = None,
) -> Engine:
    """The cloud engine of one tenant, from the environment the SAM template sets.

    - store: ``DynamoStore`` over ``ENGRAM_TABLE`` with large attributes in
      ``ENGRAM_BLOB_BUCKET``;
    - vault: ``KmsVault`` under the key ARN ``ENGRAM_DATA_KEY_ARN``, data keys in
      ``ENGRAM_KEY_TABLE``;
    - lexical index: ``OpenSearchLexicalIndex`` at ``ENGRAM_OPENSEARCH_ENDPOINT``, index
      ``ENGRAM_OPENSEARCH_INDEX`` (default ``engram-records``), SigV4 service
      ``ENGRAM_OPENSEARCH_SERVICE`` (``es``, the default, for a domain; ``aoss`` for
      OpenSearch Serverless);
    - admission policy: ``BuiltinAdmissionPolicy(ENGRAM_ADMISSION_MODE)`` (``auto`` | ``manual``,
      default ``auto``);
    - search cursor key: the secret ``ENGRAM_CURSOR_SECRET_ARN``, read once, here;
    - semantic channel (off by default): ``ENGRAM_SEMANTIC=local`` loads the local embedder (the
      ``semantic`` extra must be in the layer; ``ConfigurationError`` otherwise), or pass
      ``embedder``; the vectors live in the lexical index's documents (OpenSearch k-NN), which
      must then also be a ``VectorIndex``. ``ENGRAM_FUSION`` = ``minmax`` (default) | ``rrf``;
    - clock: the system clock; audit: ``PowertoolsAuditSink``; clients: from ``session`` (default: a boto3 session in
      ``AWS_REGION``), created on first use.

    Every dependency may be passed instead (tests, local endpoints); a variable is only required
    when the dependency it configures is built here. ``ENGRAM_TENANT_ID`` and
    ``ENGRAM_RETENTION_CEILING_S`` bind the contexts, not the engine (``HostBinding``). Raises
    ``ConfigurationError`` for a missing or invalid variable or an unreadable secret.
    """
    sessions: list[Session] = [session] if session is not None else []

    def aws_session() -> Session:
        if not sessions:
            import boto3

            region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
            if not region:
                raise ConfigurationError("AWS_REGION must be set")
            sessions.append(boto3.session.Session(region_name=region))
        return sessions[0]

    mode = _admission_mode(env)

    if store is None:
        from .adapters.aws.dynamo_store import DynamoStore

        store = DynamoStore(
            table_name=_required(env, "ENGRAM_TABLE"),
            bucket=_required(env, "ENGRAM_BLOB_BUCKET"),
            dynamodb=dynamodb_client,
            s3=s3_client,
            session=aws_session(),
        )
    if vault is None:
        from .adapters.aws.kms_vault import KmsVault

        try:
            vault = KmsVault(
                kms_key_id=_required(env, "ENGRAM_DATA_KEY_ARN"),
                key_table=_required(env, "ENGRAM_KEY_TABLE"),
                kms_client=kms_client,
                dynamodb_client=dynamodb_client,
                session=aws_session(),
            )
        except ValueError as exc:
            raise ConfigurationError("ENGRAM_DATA_KEY_ARN must be a KMS key ARN") from exc
    if lexical_index is None:
        from .adapters.aws.opensearch_index import OpenSearchLexicalIndex

        service = env.get("ENGRAM_OPENSEARCH_SERVICE", "").strip() or "es"
        if service not in ("es", "aoss"):
            raise ConfigurationError("ENGRAM_OPENSEARCH_SERVICE must be 'es' or 'aoss'")
        index_name = env.get("ENGRAM_OPENSEARCH_INDEX", "").strip() or DEFAULT_OPENSEARCH_INDEX
        try:
            if opensearch_client is not None:
                lexical_index = OpenSearchLexicalIndex(
                    client=opensearch_client, index_name=index_name
                )
            else:
                lexical_index = OpenSearchLexicalIndex(
                    endpoint=_required(env, "ENGRAM_OPENSEARCH_ENDPOINT"),
                    region=aws_session().region_name,
                    index_name=index_name,
                    session=aws_session(),
                    service=service,
                )
        except ValueError as exc:
            raise ConfigurationError(
                "ENGRAM_OPENSEARCH_ENDPOINT must be https://host[:port] and "
                "ENGRAM_OPENSEARCH_INDEX a lowercase index name"
            ) from exc
    if admission_policy is None:
        from .policy.builtin import BuiltinAdmissionPolicy

        admission_policy = BuiltinAdmissionPolicy(mode)
    if secrets_client is None:
        from botocore.config import Config

        secrets_client = aws_session().client(
            "secretsmanager",
            config=Config(connect_timeout=2, read_timeout=5, retries={"mode": "standard"}),
        )
    cursor_key = read_cursor_key(secrets_client, _required(env, "ENGRAM_CURSOR_SECRET_ARN"))
    if clock is None:
        from .adapters.local.clock import SystemClock

        clock = SystemClock()
    if audit is None:
        from .observability import PowertoolsAuditSink

        audit = PowertoolsAuditSink()
    fusion = _fusion(env)
    if embedder is None and _semantic(env):
        from .adapters.local.embedder import SemanticExtraMissing, load_local_embedder

        try:
            embedder = load_local_embedder()
        except SemanticExtraMissing as exc:
            raise ConfigurationError(f"ENGRAM_SEMANTIC is 'local' but {exc}") from None
    vector_index: VectorIndex | None = None
    if embedder is not None:
        if not callable(getattr(lexical_index, "nearest", None)):
            raise ConfigurationError("ENGRAM_SEMANTIC needs an index that stores vectors")
        vector_index = cast("VectorIndex", lexical_index)
    return Engine(
        store=store,
        vault=vault,
        lexical_index=lexical_index,
        admission_policy=admission_policy,
        clock=clock,
        audit=audit,
        settings=EngineSettings(cursor_key=cursor_key, fusion=fusion),
        embedder=embedder,
        vector_index=vector_index,
    )


# --------------------------------------------------------------------------------------------
# The tool functions' handler
# --------------------------------------------------------------------------------------------


class EngineHandler:
    """A Lambda handler whose cold-start singletons are the ``engine`` and the ``HostBinding``.

    Created at import of the handler module (cheap: no client, no environment read); the first
    invocation builds both (``build(env)``, ``HostBinding.from_env``) and keeps them for the
    warm container; tests may set them beforehand. Subclasses implement ``_handle``, which runs
    instrumented (``observability.instrumented``).
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] = os.environ,
        build: Callable[[Mapping[str, str]], Engine] = build_engine,
    ) -> None:
        self.engine: Engine | None = None
        self.binding: HostBinding | None = None
        self._env = env
        self._build = build
        self._lock = threading.Lock()
        self._entry = instrumented(self._handle)

    def __call__(self, event: Any, context: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._entry(event, context)
        return answer

    def _ready(self) -> tuple[Engine, HostBinding]:
        with self._lock:
            return self._ready_locked()

    def _ready_locked(self) -> tuple[Engine, HostBinding]:
        if self.binding is None:
            self.binding = HostBinding.from_env(self._env)
        if self.engine is None:
            self.engine = self._build(self._env)
        return self.engine, self.binding

    def _handle(self, event: Any, context: Any) -> dict[str, Any]:
        raise NotImplementedError


class ToolHandler(EngineHandler):
    """The Lambda handler of the function serving ``tool`` (``functions/<tool>/app.py``).

    Created at import of the handler module (cheap: no client, no environment read). The first
    invocation builds the engine (``build(env)``) and the ``HostBinding`` and keeps them for
    the warm container: ``engine`` and ``binding`` are the cold-start singletons, and may be
    set beforehand (tests). withdraw and forget also build their ``ExecutionGate``
    (``build_gate(tool, env)``, default ``build_execution_gate``): the confirmation and the
    commit then run in the tool's state machine. A ``build_gate`` answering ``None`` composes
    the function without one: it answers ``confirmation_required`` and commits itself when the
    adapter calls again carrying the human's approval. Each invocation: validate the event, refuse another tool's event
    (-32602) or a malformed/foreign context (-32603) — both audited —, bound the call by the
    Lambda's remaining time, run ``engine.handle`` and return its envelope.
    """

    def __init__(
        self,
        tool: str,
        *,
        env: Mapping[str, str] = os.environ,
        build: Callable[[Mapping[str, str]], Engine] = build_engine,
        build_gate: Callable[[str, Mapping[str, str]], ExecutionGate | None] | None = None,
    ) -> None:
        if tool not in TOOLS:
            raise ValueError(f"not one of the six tools: {tool!r}")
        self.tool = tool
        self.gate: ExecutionGate | None = None
        self._gate_built = False
        self._build_gate = build_gate or build_execution_gate
        self._logger: Logger = get_logger()
        self._tracer: Tracer = get_tracer()
        super().__init__(env=env, build=build)

    def use_gate(self, gate: ExecutionGate | None) -> None:
        """Compose withdraw/forget with ``gate`` (``None``: no state machine) instead of the
        environment's."""
        with self._lock:
            self.gate, self._gate_built = gate, True

    def _gate(self) -> ExecutionGate | None:
        """withdraw/forget's Step Functions gate, built on first use; ``None`` for other tools."""
        if self.tool not in GATED_TOOLS:
            return None
        with self._lock:
            if not self._gate_built:
                self.gate = self._build_gate(self.tool, self._env)
                self._gate_built = True
            return self.gate

    def _refuse(
        self,
        engine: Engine,
        refusal: ProtocolRefusal,
        reason: str,
        audit_id: str,
        ctx: TrustedContext | None = None,
    ) -> dict[str, Any]:
        unknown = isinstance(refusal, UnknownTool)
        code = "PROTOCOL_UNKNOWN_TOOL" if unknown else "PROTOCOL_CONTEXT_UNAVAILABLE"
        engine.refuse(self.tool, ctx, audit_id, code)
        self._logger.warning("invocation refused", extra={"reason": reason, "code": code})
        return protocol_error(refusal)

    def _handle(self, event: Any, context: Any) -> dict[str, Any]:
        engine, binding = self._ready()
        self._tracer.put_annotation("tool", self.tool)
        try:
            invocation = parse_invocation(event)
        except TrustedContextUnavailable as refusal:
            return self._refuse(engine, refusal, "invalid_event", new_audit_id())
        self._logger.append_keys(audit_id=invocation.audit_id, tool=self.tool)
        self._tracer.put_annotation("audit_id", invocation.audit_id)
        try:
            ctx = invocation.trusted_context(binding)
        except TrustedContextUnavailable as refusal:
            return self._refuse(engine, refusal, "foreign_tenant", invocation.audit_id)
        if invocation.tool != self.tool:
            return self._refuse(engine, UnknownTool(), "wrong_function", ctx.audit_id, ctx)
        ctx = _bounded_by_lambda(ctx, engine.clock, context)
        gate = self._gate()
        carried = invocation.approval.approval() if invocation.approval is not None else None
        try:
            # a gated tool with its state machine never commits here (see execution_gate)
            answer = engine.handle(
                self.tool, invocation.arguments, ctx, None if gate is not None else carried
            )
        except ProtocolRefusal as refusal:  # audited by the engine
            return protocol_error(refusal)
        if isinstance(answer, ConfirmationNeeded):
            if gate is not None:
                return gate.run(engine, invocation, ctx, answer.request)
            return confirmation_required(answer.request)  # the adapter asks, then calls again
        envelope = answer if gate is None else gate.reported(engine, invocation, ctx, answer)
        if self.tool == "request_admission" and envelope.get("ok"):
            count_admission_outcome(str(envelope["output"]["value"]["outcome"]["status"]))
        return envelope


def build_execution_gate(tool: str, env: Mapping[str, str]) -> ExecutionGate:
    """The gate of ``tool`` (withdraw | forget) from the environment the SAM template sets.

    ``ENGRAM_WITHDRAW_STATE_MACHINE_ARN`` / ``ENGRAM_FORGET_STATE_MACHINE_ARN`` (the function's
    own machine), ``ENGRAM_TABLE`` (parked approvals) and ``ENGRAM_APPROVAL_BASE_URL`` (the
    approval page's origin, e.g. the HTTP API's URL); clients in ``AWS_REGION``.
    """
    import boto3
    from botocore.config import Config

    from .adapters.aws.execution_gate import ExecutionGate
    from .adapters.aws.step_functions import ApprovalStore

    machine = _required(env, f"ENGRAM_{tool.upper()}_STATE_MACHINE_ARN")
    table = _required(env, "ENGRAM_TABLE")
    base_url = _required(env, "ENGRAM_APPROVAL_BASE_URL")
    if not base_url.startswith("https://"):
        raise ConfigurationError("ENGRAM_APPROVAL_BASE_URL must be an https:// URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigurationError("AWS_REGION must be set")
    session = boto3.session.Session(region_name=region)
    config = Config(connect_timeout=2, read_timeout=5, retries={"mode": "standard"})
    return ExecutionGate(
        sfn=session.client("stepfunctions", config=config),
        approvals=ApprovalStore(session.client("dynamodb", config=config), table),
        state_machine_arn=machine,
        approval_base_url=base_url,
    )


def _bounded_by_lambda(ctx: TrustedContext, clock: Clock, context: Any) -> TrustedContext:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return ctx
    deadline = clock.now_ms() + int(remaining()) - LAMBDA_DEADLINE_MARGIN_MS
    if ctx.deadline_ms is not None and ctx.deadline_ms <= deadline:
        return ctx
    return dataclasses.replace(ctx, deadline_ms=deadline)


def tool_handler(tool: str) -> ToolHandler:
    """The Lambda handler of ``tool``'s function: ``handler = tool_handler("search")``."""
    return ToolHandler(tool)

"""The cloud functions' settings: each function kind's environment, parsed once by one model.

The SAM template sets the environment; each kind of function reads it with its own pydantic
model, once per cold start (``from_env``):

- ``ToolFunctionSettings`` — the six tool functions (the engine and the host binding), and for
  withdraw/forget also ``WithdrawGateSettings`` / ``ForgetGateSettings`` (their state machine);
- ``AdapterSettings`` — the MCP adapter;
- ``ApprovalSettings`` — the approval page;
- ``WorkflowSettings`` — the state machines' steps;
- ``DrainerSettings`` — the outbox drainer.

(The OpenSearch security custom resource takes its settings from the CloudFormation request's
``ResourceProperties``, ``opensearch_security.SecurityConfig``, not from the environment.)

A missing or invalid variable is a ``ConfigurationError`` of one line naming the variable and
what to set it to (``ENGRAM_TABLE is not set: the canonical DynamoDB table's name``); the
handler lets it fail the invocation, and the next invocation tries again. A blank value counts
as unset. Every AWS client of the stack is built with ``client_config`` (one timeout and retry
policy, ``adapters.aws.client_config``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Self

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)

from engram_memory.adapters.aws.client_config import client_config
from engram_memory.engine.context import TOOLS, RetentionPolicy
from engram_memory.engine.keyring import KeyRing

if TYPE_CHECKING:
    from boto3.session import Session

__all__ = [
    "DEFAULT_AGENTS_GROUP",
    "DEFAULT_APPROVER_CLAIM",
    "DEFAULT_GROUPS_CLAIM",
    "LAMBDA_DEADLINE_MARGIN_MS",
    "AdapterSettings",
    "ApprovalSettings",
    "CognitoClaimsSettings",
    "ConfigurationError",
    "DrainerSettings",
    "EngineEnvironment",
    "ForgetGateSettings",
    "GateSettings",
    "HostBinding",
    "ToolFunctionSettings",
    "WithdrawGateSettings",
    "WorkflowSettings",
    "client_config",
    "gate_settings",
    "read_cursor_key",
    "read_secret_bytes",
    "read_secret_versions",
]

DEFAULT_RETENTION_CEILING_S: Final = RetentionPolicy().max_expires_in_s
DEFAULT_OPENSEARCH_INDEX: Final = "engram-records"
DEFAULT_APPROVER_CLAIM: Final = "engram_approver"  # binding.host_config's default too
DEFAULT_GROUPS_CLAIM: Final = "groups"
DEFAULT_AGENTS_GROUP: Final = "engram-agents"  # the stack's Cognito pool's group of agents
MIN_CURSOR_KEY_BYTES: Final = 32
MIN_SESSION_KEY_BYTES: Final = 32
KMS_KEY_ARN_PATTERN: Final = r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/[A-Za-z0-9-]+$"
# The engine stops starting work this long before the Lambda would be killed, so a call ends
# with DEADLINE_EXCEEDED (retriable, nothing half-done) rather than a timeout mid-commit.
LAMBDA_DEADLINE_MARGIN_MS: Final = 1_000


class ConfigurationError(RuntimeError):
    """The function's environment is missing or invalid, or its secret unreadable.

    A deployment error: the handler lets it fail the invocation (a Lambda function error), and
    the next invocation tries again. The message names the variable, never a secret's value.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class HostBinding:
    """What a tool function checks every context against: its tenant and retention ceiling."""

    tenant_id: str
    retention_ceiling_s: int = DEFAULT_RETENTION_CEILING_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HostBinding:
        """``ENGRAM_TENANT_ID`` (required) and ``ENGRAM_RETENTION_CEILING_S`` (seconds, >= 0)."""
        return _BindingSettings.from_env(env).binding()


# --------------------------------------------------------------------------------------------
# The models
# --------------------------------------------------------------------------------------------


def _env(name: str, what: str, **field: Any) -> Any:
    """A field read from the variable ``name``; ``what`` says what to set it to."""
    return Field(validation_alias=name, description=what, **field)


def _csv(value: Any) -> Any:
    return (
        [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, str)
        else value
    )


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


Text = Annotated[str, Field(min_length=1)]
Csv = Annotated[list[str], BeforeValidator(_csv)]
Https = Annotated[str, Field(pattern=r"^https://[^\s/?#]+(/[^\s?#]*)?$")]


def _known_tool(name: str) -> str:
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r} (the tools are {', '.join(TOOLS)})")
    return name


# A tool's grant name (engine.context.TOOLS: the contract's tools, so a new tool needs no edit here).
ToolName = Annotated[str, AfterValidator(_known_tool)]


class _Settings(BaseModel):
    """A function kind's environment: ``from_env`` parses it once."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=False)

    region: str = Field(
        default="",
        validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
        description="the function's AWS region (the Lambda runtime sets it)",
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Self:
        """The settings in ``env``; ``ConfigurationError`` (one line) for the first bad variable."""
        present = {name: value.strip() for name, value in env.items() if value and value.strip()}
        try:
            return cls.model_validate(present)
        except ValidationError as exc:
            raise ConfigurationError(cls._explain(exc)) from None

    @classmethod
    def _explain(cls, exc: ValidationError) -> str:
        error = exc.errors()[0]
        variable = str(error["loc"][0]) if error["loc"] else "?"
        what = next(
            (
                f.description
                for f in cls.model_fields.values()
                if variable in _aliases(f.validation_alias)
            ),
            None,
        )
        problem = "is not set" if error["type"] == "missing" else "is invalid"
        return f"{variable} {problem}: set it to {what or 'a valid value'}"

    def session(self) -> Session:
        """A boto3 session in this function's region (needed only when a client is built)."""
        import boto3

        if not self.region:
            raise ConfigurationError("AWS_REGION is not set: set it to the function's AWS region")
        return boto3.session.Session(region_name=self.region)


def _aliases(alias: Any) -> list[str]:
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return []


# The variables several function kinds read, each declared once.
_TENANT: Final = ("ENGRAM_TENANT_ID", "this stack's tenant id")


class _BindingSettings(_Settings):
    tenant_id: Text = _env(*_TENANT)
    retention_ceiling_s: int = _env(
        "ENGRAM_RETENTION_CEILING_S",
        "the retention ceiling, a whole number of seconds >= 0",
        default=DEFAULT_RETENTION_CEILING_S,
        ge=0,
    )

    def binding(self) -> HostBinding:
        return HostBinding(self.tenant_id, self.retention_ceiling_s)


def _approver_claim(**field: Any) -> Any:
    return _env(
        "ENGRAM_APPROVER_CLAIM",
        "the agent-token claim naming the agent's approver (a claim name, default"
        f" {DEFAULT_APPROVER_CLAIM})",
        default=DEFAULT_APPROVER_CLAIM,
        pattern=r"^[A-Za-z][A-Za-z0-9_:.-]{0,127}$",
        **field,
    )


class CognitoClaimsSettings(_Settings):
    """The user pool's pre-token-generation trigger (``functions/cognito_claims/app.py``)."""

    tenant_id: Text = _env(*_TENANT)
    approver_claim: str = _approver_claim()


class StoredRecordsSettings(_Settings):
    """Where the records are, and the keys that open their sealed bodies."""

    table: Text = _env("ENGRAM_TABLE", "the canonical DynamoDB table's name")
    blob_bucket: Text = _env("ENGRAM_BLOB_BUCKET", "the S3 bucket of large attributes")
    key_table: Text = _env("ENGRAM_KEY_TABLE", "the DynamoDB table of wrapped data keys")
    data_key_arn: str = _env(
        "ENGRAM_DATA_KEY_ARN",
        "the tenant's KMS key ARN (arn:aws:kms:<region>:<account>:key/<id>)",
        pattern=KMS_KEY_ARN_PATTERN,
    )


class EngineEnvironment(_BindingSettings, StoredRecordsSettings):
    """What ``composition.build_engine`` reads: the engine of one tenant, and its binding."""

    cursor_secret_arn: Text = _env(
        "ENGRAM_CURSOR_SECRET_ARN", "the Secrets Manager ARN of the search cursor key"
    )
    opensearch_endpoint: Https = _env(
        "ENGRAM_OPENSEARCH_ENDPOINT", "the OpenSearch endpoint, https://host[:port]"
    )
    opensearch_index: str = _env(
        "ENGRAM_OPENSEARCH_INDEX",
        "a lowercase OpenSearch index name",
        default=DEFAULT_OPENSEARCH_INDEX,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
    )
    opensearch_replicas: int | None = _env(
        "ENGRAM_OPENSEARCH_REPLICAS",
        "the index's replica count, a whole number 0-2 (0 on a one-node domain)",
        default=None,
        ge=0,
        le=2,
    )
    opensearch_service: Literal["es", "aoss"] = _env(
        "ENGRAM_OPENSEARCH_SERVICE",
        "'es' (an OpenSearch domain) or 'aoss' (OpenSearch Serverless)",
        default="es",
    )
    admission_mode: Literal["auto", "manual"] = _env(
        "ENGRAM_ADMISSION_MODE", "'auto' or 'manual'", default="auto"
    )
    fusion: Literal["minmax", "rrf"] = _env("ENGRAM_FUSION", "'minmax' or 'rrf'", default="minmax")
    time_aware: bool = _env(
        "ENGRAM_TIME_AWARE",
        "'true' or 'false' (rank records whose valid_time falls in a date the query names higher)",
        default=True,
    )
    semantic: Literal["off", "local"] = _env(
        "ENGRAM_SEMANTIC", "'off' or 'local' (the semantic extra in the layer)", default="off"
    )
    embedding_model_dir: str | None = _env(
        "ENGRAM_EMBEDDING_MODEL_DIR",
        "a directory holding model.onnx, tokenizer.json and embedding.json (unset: the shipped"
        " all-MiniLM-L6-v2)",
        default=None,
    )
    embedding_model_sha256: str | None = _env(
        "ENGRAM_EMBEDDING_MODEL_SHA256",
        "the sha256 of ENGRAM_EMBEDDING_MODEL_DIR's model.onnx (64 lower-case hex digits)",
        default=None,
        pattern=r"^[0-9a-f]{64}$",
    )


def _mac_key(variable: str, what: str) -> Any:
    return _env(
        variable, f"{what} (arn:aws:kms:<region>:<account>:key/<id>)", pattern=KMS_KEY_ARN_PATTERN
    )


_INVOCATION_KEY: Final = ("ENGRAM_INVOCATION_KEY_ARN", "the KMS HMAC key ARN of tool invocations")
_PROOF_KEY: Final = ("ENGRAM_APPROVAL_PROOF_KEY_ARN", "the KMS HMAC key ARN of approval proofs")
_APPROVAL_PAGE: Final = (
    "ENGRAM_APPROVAL_BASE_URL",
    "the approval page's https:// origin (the HTTP API's URL)",
)
_PAGE_REQUIRED: Final = (
    "ENGRAM_APPROVAL_PAGE_REQUIRED",
    "'true' (withdraw and forget need the approval page, never the client's form) or 'false'",
)


class ToolFunctionSettings(EngineEnvironment):
    """The six tool functions (``functions/<tool>/app.py``): each verifies the adapter's MAC of
    its invocation (``cloud.proofs``)."""

    invocation_key_arn: str = _mac_key(*_INVOCATION_KEY)


class DrainerSettings(EngineEnvironment):
    """The outbox drainer (``functions/outbox_drainer/app.py``)."""


class WorkflowSettings(EngineEnvironment):
    """The state machines' steps (``functions/workflow/app.py``)."""

    approval_base_url: str = _env(*_APPROVAL_PAGE, default="")
    # the commit step verifies the run's call (the adapter's MAC) and the approval's proof
    invocation_key_arn: str = _mac_key(*_INVOCATION_KEY)
    approval_proof_key_arn: str = _mac_key(*_PROOF_KEY)
    approval_page_required: bool = _env(*_PAGE_REQUIRED, default=False)


class GateSettings(_Settings):
    """withdraw's or forget's execution gate: its own state machine and the approval page."""

    table: Text = _env("ENGRAM_TABLE", "the canonical DynamoDB table's name (parked approvals)")
    approval_base_url: Https = _env(*_APPROVAL_PAGE)
    state_machine_arn: str
    approval_topic_arn: str | None = _env(
        "ENGRAM_APPROVAL_TOPIC_ARN",
        "the SNS topic ARN that announces approval requests",
        default=None,
        pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$",
    )


class WithdrawGateSettings(GateSettings):
    state_machine_arn: Text = _env(
        "ENGRAM_WITHDRAW_STATE_MACHINE_ARN", "the withdraw state machine's ARN"
    )


class ForgetGateSettings(GateSettings):
    state_machine_arn: Text = _env(
        "ENGRAM_FORGET_STATE_MACHINE_ARN", "the forget state machine's ARN"
    )


def gate_settings(tool: str, env: Mapping[str, str] = os.environ) -> GateSettings:
    """The gate settings of ``tool`` (withdraw | forget)."""
    models: dict[str, type[GateSettings]] = {
        "withdraw": WithdrawGateSettings,
        "forget": ForgetGateSettings,
    }
    return models[tool].from_env(env)


class AdapterSettings(_BindingSettings):
    """The MCP adapter (``functions/mcp_adapter/app.py``)."""

    retention_ceiling_s: int | None = _env(  # type: ignore[assignment]  # unset: the host's default
        "ENGRAM_RETENTION_CEILING_S",
        "the retention ceiling, a whole number of seconds >= 0",
        default=None,
        ge=0,
    )
    tool_functions: Annotated[dict[ToolName, Text], BeforeValidator(_json), Field(min_length=1)] = (
        _env(
            "ENGRAM_TOOL_FUNCTIONS",
            'a JSON object of tool names to function names ({"search": ...})',
        )
    )
    # checked further by ``host.config.HostConfig`` (``mcp_adapter._host_config``)
    resource_uri: Text = _env("ENGRAM_RESOURCE_URI", "the MCP endpoint's URL (the token audience)")
    issuer: Text = _env("ENGRAM_ISSUER", "the OIDC issuer's URL")
    request_state_secret_arn: Text = _env(
        "ENGRAM_REQUEST_STATE_SECRET_ARN", "the Secrets Manager ARN of the request-state secret"
    )
    allowed_origins: Csv = _env(
        "ENGRAM_ALLOWED_ORIGINS", "comma-separated browser origins", default_factory=list
    )
    allowed_hosts: Csv = _env(
        "ENGRAM_ALLOWED_HOSTS", "comma-separated extra Host values", default_factory=list
    )
    audience_aliases: Csv = _env(
        "ENGRAM_AUDIENCE_ALIASES",
        "comma-separated client ids an agent token may name as aud besides ENGRAM_RESOURCE_URI",
        default_factory=list,
    )
    invocation_key_arn: str = _mac_key(*_INVOCATION_KEY)
    approval_page_required: bool = _env(*_PAGE_REQUIRED, default=False)
    # checked further by ``host.config.HostConfig`` (not a claim the host reads otherwise)
    approver_claim: str = _approver_claim()


class ApprovalSettings(StoredRecordsSettings):
    """The approval page (``functions/approval/app.py``) and its OpenID Connect sign-in.

    The OIDC redirect URI is ``<approval_base_url>/approvals/callback``; an ID token whose
    audience also names ``resource_uri`` (an agent's token) is refused, and so is one whose
    ``groups_claim`` lists ``agents_group`` (``cloud.approver_signin.PersonRule``).
    """

    issuer: Https = _env("ENGRAM_ISSUER", "the tenant's OIDC issuer URL (https://)")
    client_id: Text = _env(
        "ENGRAM_APPROVAL_AUDIENCE", "the approval page's OIDC client id (its ID tokens' aud)"
    )
    resource_uri: Text = _env(
        "ENGRAM_RESOURCE_URI", "the MCP endpoint's https:// URL (an agent token's audience)"
    )
    approval_base_url: Https = _env(*_APPROVAL_PAGE)
    session_secret_arn: Text = _env(
        "ENGRAM_APPROVAL_SESSION_SECRET_ARN",
        "the ARN of the secret that keys the page's session cookies and CSRF tokens",
    )
    approval_proof_key_arn: str = _mac_key(*_PROOF_KEY)
    groups_claim: Text = _env(
        "ENGRAM_APPROVER_GROUPS_CLAIM",
        "the ID-token claim listing a person's groups (groups; cognito:groups for the stack's pool)",
        default=DEFAULT_GROUPS_CLAIM,
    )
    agents_group: Text = _env(
        "ENGRAM_AGENTS_GROUP",
        "the agents' group (a name or id in the groups claim): its members never approve",
        default=DEFAULT_AGENTS_GROUP,
    )

    @property
    def base_url(self) -> str:
        return self.approval_base_url.rstrip("/")


# --------------------------------------------------------------------------------------------
# Secrets
# --------------------------------------------------------------------------------------------


def read_secret_bytes(
    secrets_client: Any,
    secret_arn: str,
    *,
    name: str,
    variable: str,
    minimum: int,
    stage: str = "AWSCURRENT",
) -> bytes:
    """A Secrets Manager secret's binary value, or its string value as UTF-8 (the version
    ``stage`` names: a rotated secret's ``AWSPREVIOUS`` too).

    Raises ``ConfigurationError`` naming ``variable`` when the secret cannot be read or is shorter
    than ``minimum`` bytes; the value never appears in the message.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        response = secrets_client.get_secret_value(SecretId=secret_arn, VersionStage=stage)
    except (BotoCoreError, ClientError) as exc:
        raise ConfigurationError(f"the {name} secret ({variable}) is unreadable") from exc
    binary = response.get("SecretBinary")
    value = bytes(binary) if binary is not None else str(response.get("SecretString", "")).encode()
    if len(value) < minimum:
        raise ConfigurationError(f"the {name} secret must hold at least {minimum} bytes")
    return value


def read_secret_versions(
    secrets_client: Any, secret_arn: str, *, name: str, variable: str, minimum: int
) -> tuple[bytes, ...]:
    """A rotating secret's current version, then its previous one when it has been rotated
    (``cloud.secret_rotation``): what a ``KeyRing`` loads (see ``read_secret_bytes``)."""

    def read(stage: str) -> bytes:
        return read_secret_bytes(
            secrets_client, secret_arn, name=name, variable=variable, minimum=minimum, stage=stage
        )

    current = read("AWSCURRENT")
    try:
        return (current, read("AWSPREVIOUS"))
    except ConfigurationError:  # never rotated: no previous version
        return (current,)


def read_cursor_key(
    secrets_client: Any, secret_arn: str, *, clock: Callable[[], float] = time.time
) -> KeyRing:
    """The search cursor HMAC key's versions, read at cold start and again as ``KeyRing``
    says: a cursor signed before a rotation still verifies after it."""

    def load() -> tuple[bytes, ...]:
        return read_secret_versions(
            secrets_client,
            secret_arn,
            name="cursor",
            variable="ENGRAM_CURSOR_SECRET_ARN",
            minimum=MIN_CURSOR_KEY_BYTES,
        )

    return KeyRing(load, minimum=MIN_CURSOR_KEY_BYTES, clock=clock)

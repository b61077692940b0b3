"""The cloud functions' settings: read from the environment the SAM template sets, once.

``ConfigurationError`` is a deployment error (a missing or invalid variable, an unreadable
secret): the handler lets it fail the invocation, and the next invocation tries again. Every
AWS client of the stack is built with ``client_config`` (one timeout and retry policy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

from ..engine.context import (
    RetentionPolicy,
)

if TYPE_CHECKING:
    from boto3.session import Session


DEFAULT_RETENTION_CEILING_S: Final = RetentionPolicy().max_expires_in_s
MIN_CURSOR_KEY_BYTES: Final = 32
# The engine stops starting work this long before the Lambda would be killed, so a call ends
# with DEADLINE_EXCEEDED (retriable, nothing half-done) rather than a timeout mid-commit.
LAMBDA_DEADLINE_MARGIN_MS: Final = 1_000
# One policy for every client: connect fast, read within the slowest call the stack makes
# (a KMS or DynamoDB round trip), standard retries. The adapter's Lambda client waits as long
# as a tool function may run and never retries a slow invocation.
CONNECT_TIMEOUT_S: Final = 2
READ_TIMEOUT_S: Final = 5


class ConfigurationError(RuntimeError):
    """The function's environment is missing or invalid, or its secret unreadable.

    A deployment error: the handler lets it fail the invocation (a Lambda function error), and
    the next invocation tries again. The message names the variable, never a secret's value.
    """


def client_config(*, read_timeout_s: float = READ_TIMEOUT_S, retries: bool = True) -> Any:
    """The botocore ``Config`` of every client the cloud functions build."""
    from botocore.config import Config

    return Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=read_timeout_s,
        retries={"mode": "standard"} if retries else {"max_attempts": 1},
    )


def aws_session(env: Mapping[str, str]) -> Session:
    """A boto3 session in ``AWS_REGION`` (``ConfigurationError`` when it is not set)."""
    import boto3

    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigurationError("AWS_REGION must be set")
    return boto3.session.Session(region_name=region)


def required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise ConfigurationError(f"{name} must be set")
    return value


def choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str:
    """``name``'s value, one of ``allowed`` (the first is the default when unset)."""
    value = env.get(name, "").strip() or allowed[0]
    if value not in allowed:
        raise ConfigurationError(f"{name} must be " + " or ".join(f"'{a}'" for a in allowed))
    return value


def admission_mode(env: Mapping[str, str]) -> Literal["auto", "manual"]:
    return (
        "manual" if choice(env, "ENGRAM_ADMISSION_MODE", ("auto", "manual")) == "manual" else "auto"
    )


def fusion(env: Mapping[str, str]) -> Literal["minmax", "rrf"]:
    return "rrf" if choice(env, "ENGRAM_FUSION", ("minmax", "rrf")) == "rrf" else "minmax"


def semantic(env: Mapping[str, str]) -> bool:
    return choice(env, "ENGRAM_SEMANTIC", ("off", "local")) == "local"


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


@dataclasses.dataclass(frozen=True, slots=True)
class HostBinding:
    """What a tool function checks every context against: its tenant and retention ceiling."""

    tenant_id: str
    retention_ceiling_s: int = DEFAULT_RETENTION_CEILING_S

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HostBinding:
        """``ENGRAM_TENANT_ID`` (required) and ``ENGRAM_RETENTION_CEILING_S`` (seconds, >= 0)."""
        tenant_id = required(env, "ENGRAM_TENANT_ID")
        raw = env.get("ENGRAM_RETENTION_CEILING_S", "").strip()
        if not raw:
            return cls(tenant_id)
        if not raw.isdecimal():
            raise ConfigurationError("ENGRAM_RETENTION_CEILING_S must be a whole number of seconds")
        return cls(tenant_id, int(raw))


# ------------------------------------------------------------------------------------------------
# The approval page's settings (the approval function; added with its sign-in)
# ------------------------------------------------------------------------------------------------

MIN_SESSION_KEY_BYTES: Final = 32


@dataclasses.dataclass(frozen=True, slots=True)
class ApprovalPageSettings:
    """What the approval function reads from its environment.

    ``ENGRAM_ISSUER`` (the tenant's OIDC issuer), ``ENGRAM_APPROVAL_AUDIENCE`` (the approval
    page's OIDC client id: the ``aud`` of the ID tokens it accepts), ``ENGRAM_RESOURCE_URI`` (the
    MCP resource: an ID token also valid for it is refused), ``ENGRAM_APPROVAL_BASE_URL`` (the
    page's https origin; the OIDC redirect URI is ``<base>/approvals/callback``),
    ``ENGRAM_TABLE``, ``ENGRAM_BLOB_BUCKET``, ``ENGRAM_APPROVAL_SESSION_SECRET_ARN`` (the key
    of the session cookies and CSRF tokens).
    """

    issuer: str
    client_id: str
    resource_uri: str
    base_url: str
    table: str
    bucket: str
    session_secret_arn: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ApprovalPageSettings:
        base_url = required(env, "ENGRAM_APPROVAL_BASE_URL").rstrip("/")
        if not base_url.startswith("https://"):
            raise ConfigurationError("ENGRAM_APPROVAL_BASE_URL must be an https:// URL")
        return cls(
            issuer=required(env, "ENGRAM_ISSUER"),
            client_id=required(env, "ENGRAM_APPROVAL_AUDIENCE"),
            resource_uri=required(env, "ENGRAM_RESOURCE_URI"),
            base_url=base_url,
            table=required(env, "ENGRAM_TABLE"),
            bucket=required(env, "ENGRAM_BLOB_BUCKET"),
            session_secret_arn=required(env, "ENGRAM_APPROVAL_SESSION_SECRET_ARN"),
        )

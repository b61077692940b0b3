"""The host configuration: what a host binds every call to (both hosts build one).

The embedded host persists it as ``<data_dir>/host.json`` (``embedded.host_file``); the cloud
builds it from its settings.

CONTRACT.md §12 fixes the embedded defaults: resource ``http://127.0.0.1:8765/mcp`` (the audience of
every token), admission policy ``auto``, retention ceiling 365 days with ``allow_retain`` false,
reconciliation consent false. The file is closed (an unknown key is an error), written atomically
with mode 0600, and a missing file means "all defaults".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from engram_memory.engine.context import RetentionPolicy

if TYPE_CHECKING:  # the policy (a secret scanner) loads only when a policy is needed
    from engram_memory.policy.builtin import BuiltinAdmissionPolicy

__all__ = [
    "DEFAULT_ALLOWED_ORIGINS",
    "DEFAULT_APPROVER_CLAIM",
    "DEFAULT_PORT",
    "DEFAULT_RESOURCE",
    "AdmissionConfig",
    "EmbeddingModelConfig",
    "HostConfig",
    "RetentionConfig",
    "SearchConfig",
    "host_matches",
]

DEFAULT_PORT: Final = 8765
DEFAULT_RESOURCE: Final = f"http://127.0.0.1:{DEFAULT_PORT}/mcp"
DEFAULT_APPROVER_CLAIM: Final = "engram_approver"
# Claims the host reads as something else: never the approver claim.
_CLAIMS_READ_ELSEWHERE: Final = frozenset(
    {"iss", "aud", "sub", "iat", "nbf", "exp", "jti", "tenant_id", "workspace_id", "purpose_ref"}
    | {"agent_id", "sid", "engram_tools", "engram_confirm", "engram_retention", "engram_reconcile"}
    | {"engram_grants", "scope", "scp"}
)
DEFAULT_ALLOWED_ORIGINS: Final = ("http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*")
_DEFAULT_PORTS: Final = {"http": "80", "https": "443"}
_MAX_ERRORS_SHOWN: Final = 3


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class AdmissionConfig(_Closed):
    """How ``request_admission`` decides: the built-in policy's mode and the host's own rules."""

    mode: Literal["auto", "manual"] = Field(
        default="auto",
        description="`auto` accepts what passes every rule; `manual` holds it for an operator.",
    )
    host_rules: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Host admission rules (see `policy.builtin.parse_host_rules`).",
    )
    near_duplicates: Literal["pending_adjudication", "rejected", "off"] = Field(
        default="pending_adjudication",
        description=(
            "What a near-duplicate of a current record of the same scope gets: held for an"
            " operator (`pending_adjudication`), `rejected`, or no check (`off`)."
        ),
    )
    near_duplicate_threshold: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description="Shingled-MinHash similarity (0-1] at which a capture is a near-duplicate.",
    )
    min_text_chars: int = Field(
        default=12,
        ge=0,
        description="Fewer letters and digits than this is low information, rejected (0: off).",
    )

    @field_validator("host_rules")
    @classmethod
    def _valid_rules(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not value:
            return value
        from engram_memory.policy.builtin import parse_host_rules

        try:
            parse_host_rules(value)
        except ValidationError as error:
            raise ValueError(describe_validation_error(error)) from None
        return value


class RetentionConfig(_Closed):
    """The host's retention ceiling; a token's ``engram_retention`` can only tighten it."""

    allow_retain: bool = Field(default=False, description="May an agent ask to retain a record.")
    max_expires_in_s: int = Field(
        default=31_536_000, ge=1, description="Longest expiry an agent may ask for, in seconds."
    )


class EmbeddingModelConfig(_Closed):
    """Another sentence-embedding model for the semantic channel, from a local directory."""

    path: str = Field(
        min_length=1,
        description=(
            "A directory holding model.onnx, tokenizer.json and embedding.json (pooling, normalize,"
            " max_tokens, dimensions); relative paths are relative to the data directory."
        ),
    )
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="The sha256 of model.onnx (lower-case hex)."
    )


class SearchConfig(_Closed):
    """How search ranks (CONTRACT.md §7.1; engine/semantic.py)."""

    semantic: Literal["off", "local"] = Field(
        default="off",
        description=(
            "`local`: the semantic channel with the local embedder (needs the semantic extra:"
            " pip install 'engram-memory[semantic]'); `off`: lexical only, and"
            " `lexical_and_semantic` searches answer RANKING_UNAVAILABLE."
        ),
    )
    fusion: Literal["minmax", "rrf"] = Field(
        default="minmax",
        description="How the lexical and semantic lists are fused: `minmax` (default) or `rrf`.",
    )
    time_aware: bool = Field(
        default=True,
        description=(
            'Rank records whose valid_time falls in a date the query names ("on 7 July, 2023",'
            ' "in May", "last week") higher: engine/temporal.py. `false`: the ranking of'
            " profile versions before it."
        ),
    )
    embedding_model: EmbeddingModelConfig | None = Field(
        default=None,
        description=(
            "The model of the `local` semantic channel; absent: the shipped all-MiniLM-L6-v2."
            " Changing it needs `engram-memory admin reindex` (stored vectors are not re-embedded)."
        ),
    )

    @model_validator(mode="after")
    def _model_needs_channel(self) -> SearchConfig:
        if self.embedding_model is not None and self.semantic != "local":
            raise ValueError('embedding_model needs "semantic": "local"')
        return self


class HostConfig(_Closed):
    """The embedded host's configuration (closed and immutable; see the module docstring)."""

    resource: str = Field(
        default=DEFAULT_RESOURCE,
        description="The service's resource URI: the `aud` every token must carry.",
    )
    issuer: str = Field(
        default="engram-memory-local", min_length=1, description="The `iss` of local tokens."
    )
    tenant_id: str = Field(
        default="local", min_length=1, max_length=256, description="The tenant of this host."
    )
    allowed_origins: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_ORIGINS),
        description="Browser origins accepted on HTTP: `scheme://host[:port]`, port `*` = any.",
    )
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    retention: RetentionConfig = Field(default_factory=RetentionConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    reconcile_consent: bool = Field(
        default=False, description="Host consent to the reconciliation families."
    )
    default_token_ttl_s: int = Field(
        default=86_400, ge=1, description="Lifetime of tokens minted without --expires-in."
    )
    http_session_idle_s: float = Field(
        default=600,
        gt=0,
        le=86_400,
        description=(
            "Seconds an MCP HTTP session may stay idle (no request in flight) before the server"
            " closes it and frees its memory; its id then answers 404 and the client"
            " initializes anew."
        ),
    )
    console_remote: bool = Field(
        default=False,
        description="Let the operator console answer clients that are not on this machine.",
    )
    approval_page_required: bool = Field(
        default=False,
        description=(
            "withdraw and forget are approved by a person on the approval page (or at the"
            " host's terminal), never by the answer to the client's form: for hosts that do"
            " not trust their agents' clients."
        ),
    )
    approver_claim: str = Field(
        default=DEFAULT_APPROVER_CLAIM,
        pattern=r"^[A-Za-z][A-Za-z0-9_:.-]{0,127}$",
        description=(
            "The agent-token claim naming who approves the agent's confirmations on the cloud"
            " approval page (the approver's `sub`)."
        ),
    )

    @field_validator("resource")
    @classmethod
    def _valid_resource(cls, value: str) -> str:
        parts = urlsplit(value)
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.fragment
            or "#" in value
            or parts.username is not None
            or any(ch.isspace() for ch in value)
        ):
            raise ValueError(
                "the resource must be an absolute http(s) URL without a fragment or credentials,"
                " e.g. http://127.0.0.1:8765/mcp"
            )
        return value

    @field_validator("issuer", "tenant_id")
    @classmethod
    def _no_blank(cls, value: str) -> str:
        if not value.strip() or value != value.strip():
            raise ValueError("must not be blank or have surrounding spaces")
        return value

    @field_validator("approver_claim")
    @classmethod
    def _own_claim(cls, value: str) -> str:
        if value in _CLAIMS_READ_ELSEWHERE:
            raise ValueError(f"{value!r} is a claim the host reads for something else")
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _valid_origins(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if _split_origin(pattern, wildcard=True) is None:
                raise ValueError(
                    f"{pattern!r} is not an origin pattern like http://localhost:* or"
                    " https://app.example.com"
                )
        return value

    def serving_on(self, bind_host: str, port: int) -> HostConfig:
        """This configuration as served on ``bind_host:port``: the resource URI (the tokens'
        audience, the RFC 9728 ``resource``) follows the port, unless ``host.json`` sets a
        resource of its own (anything but the default)."""
        if self.resource != DEFAULT_RESOURCE:
            return self
        host = "127.0.0.1" if bind_host in ("0.0.0.0", "::", "") else bind_host  # noqa: S104
        host = f"[{host}]" if ":" in host else host
        return self.model_copy(update={"resource": f"http://{host}:{port}/mcp"})

    def admission_policy(self) -> BuiltinAdmissionPolicy:
        """The built-in admission policy this configuration describes."""
        from engram_memory.policy.builtin import BuiltinAdmissionPolicy, parse_host_rules

        admission = self.admission
        return BuiltinAdmissionPolicy(
            mode=admission.mode,
            host_rules=parse_host_rules(admission.host_rules),
            near_duplicates=admission.near_duplicates,
            near_duplicate_threshold=admission.near_duplicate_threshold,
            min_text_chars=admission.min_text_chars,
        )

    def retention_policy(self) -> RetentionPolicy:
        """The host's retention ceiling as the engine's ``RetentionPolicy``."""
        return RetentionPolicy(
            allow_retain=self.retention.allow_retain,
            max_expires_in_s=self.retention.max_expires_in_s,
        )

    def origin_allowed(self, origin: str) -> bool:
        """Whether a request's ``Origin`` header value matches one of ``allowed_origins``.

        Scheme and host compare case-insensitively; a pattern port ``*`` matches any port (and
        none); an origin without a port has its scheme's default port. ``null`` never matches.
        """
        parsed = _split_origin(origin, wildcard=False)
        if parsed is None:
            return False
        scheme, host, port = parsed
        port = port or _DEFAULT_PORTS[scheme]
        for pattern in self.allowed_origins:
            allowed = _split_origin(pattern, wildcard=True)
            if allowed is None or allowed[0] != scheme or allowed[1] != host:
                continue
            if allowed[2] == "*" or (allowed[2] or _DEFAULT_PORTS[scheme]) == port:
                return True
        return False


def host_matches(host: str, patterns: list[str]) -> bool:
    """Whether a request's ``Host`` header value names one of ``patterns`` (``host[:port]``, port
    ``*`` = any port, and none). Exact: host and port are parsed and compared whole, so
    ``localhost:80.evil.example`` or ``127.0.0.1:8765@evil.example`` match nothing."""
    parsed = _split_origin("http://" + host, wildcard=False)
    if parsed is None:
        return False
    for pattern in patterns:
        allowed = _split_origin("http://" + pattern, wildcard=True)
        if allowed is None or allowed[1] != parsed[1]:
            continue
        if allowed[2] == "*" or allowed[2] == parsed[2]:
            return True
    return False


def _split_origin(value: str, *, wildcard: bool) -> tuple[str, str, str | None] | None:
    """``(scheme, host, port)`` of ``scheme://host[:port]`` (lower-cased), or None if malformed."""
    scheme, sep, rest = value.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS or not rest:
        return None
    if any(ch in rest for ch in "/?#@\\") or any(ch.isspace() for ch in rest):
        return None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            return None
        host, tail = rest[: end + 1], rest[end + 1 :]
        if tail and not tail.startswith(":"):
            return None
        port: str | None = tail[1:] if tail else None
    else:
        host, colon, port_text = rest.partition(":")
        port = port_text if colon else None
    if not host or host == "[]" or (port is not None and not _valid_port(port, wildcard)):
        return None
    return scheme, host.lower(), port


def _valid_port(port: str, wildcard: bool) -> bool:
    if port == "*":
        return wildcard
    return port.isascii() and port.isdigit() and 0 < int(port) < 65536


def describe_validation_error(error: ValidationError) -> str:
    """A short, person-readable summary of a pydantic error: ``field.path: message; ...``."""
    problems = []
    for item in error.errors()[:_MAX_ERRORS_SHOWN]:
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(f"{where}: {message}")
    hidden = error.error_count() - len(problems)
    if hidden > 0:
        problems.append(f"and {hidden} more")
    return "; ".join(problems)

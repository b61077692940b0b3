"""The OpenSearch domain's security plugin, configured by a CloudFormation custom resource.

The created domain runs with fine-grained access control (FGAC): IAM lets a request reach the
domain (its access policy), and the security plugin then decides what the request's IAM role may
do inside it. A role the plugin does not know may do nothing, so after the domain exists this
module, run by ``functions/opensearch_security/app.py`` as the domain's **master user** (the
function's own role, named in the domain's ``AdvancedSecurityOptions``), signs requests with
SigV4 (service ``es``) and puts:

1. two OpenSearch roles on the stack's index only (``PUT _plugins/_security/api/roles/<name>``),
   named after the index (``<index>_reader``, ``<index>_writer``) so that stacks sharing a domain
   never overwrite each other's: the reader may search and get documents; the writer may also
   create the index, refresh it, index, delete and bulk-write documents. Nothing else: no other
   index, no cluster administration, no security API;
2. their role mappings (``PUT _plugins/_security/api/rolesmapping/<name>``): the functions' IAM
   role ARNs as backend roles (search reads; admission, forget, the workflow steps and the outbox
   drainer write);
3. the audit log configuration (``PUT _plugins/_security/api/audit/config``), published by the
   domain to its ``AUDIT_LOGS`` log group: REST and transport events for failed logins, missing
   privileges, bad headers, TLS errors and attempts on the security index; changes to the security
   configuration itself (compliance, internal config). Successful, authorized calls
   (``AUTHENTICATED``, ``GRANTED_PRIVILEGES``) are left out: every tool call is one, the engine's
   own audit journal records each of them, and they would dominate the log's volume and cost.
   **No request bodies and no document content**: the index holds terms of memory text and the
   search queries carry the agent's query terms, so ``log_request_body`` is off, compliance logs
   reads and writes as metadata only, write diffs are off, no field or index is "watched"
   (watched fields would copy their values), and sensitive headers (the SigV4 ``Authorization``)
   are excluded.

**A shared domain** (``OpenSearchMode=existing``, ``SharedDomain: "true"``): the domain is not
the stack's, so the function signs as a role the domain's owner mapped to the security plugin's
``security_manager`` (``SecurityRoleArn``, assumed with STS), puts steps 1 and 2 only (the audit
configuration is the domain owner's, for every tenant at once), and on ``Delete`` removes the
stack's two roles and mappings, so a deleted tenant leaves no grant behind. Without fine-grained
access a shared domain would let any tenant's roles read every index: the template refuses
``existing`` without ``ExistingOpenSearchSecurityRoleName``.

Every request is a ``PUT`` of a whole document, so applying the configuration twice leaves the
domain as applying it once: ``Create`` and ``Update`` run the same steps (an ``Update`` that drops
a function role from the template replaces the mapping without it). On the stack's own domain ``Delete``
changes nothing: the roles live inside the domain and go with it. The physical id names the
endpoint and the index, so a replacement (a new endpoint) deletes on the old domain only. Every path, failures included, answers CloudFormation through the event's
``ResponseURL`` (a presigned S3 URL: it is never logged); a failure's reason names the step and
the HTTP status or the exception's type, never a credential, a signature or the URL.
"""

from __future__ import annotations

import json
import re
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from engram_memory.cloud.observability import get_logger, instrumented

if TYPE_CHECKING:
    from botocore.credentials import Credentials

__all__ = [
    "AUDIT_CONFIG",
    "REVISION",
    "SecurityConfig",
    "SecurityConfigError",
    "SecurityConfigResource",
    "SigV4Client",
]

REVISION: Final = "2"
"""What this module applies, versioned: the template passes it as the resource's ``Revision``
property, so a change here (bumped with it) makes CloudFormation send an ``Update``."""

SECURITY_API: Final = "/_plugins/_security/api"
SERVICE: Final = "es"
# What the index adapter (adapters/aws/opensearch_index.py) sends, as security-plugin actions.
READ_ACTIONS: Final = ("indices:data/read/search*", "indices:data/read/get")
WRITE_ACTIONS: Final = (
    *READ_ACTIONS,
    "indices:admin/create",
    "indices:admin/refresh*",
    "indices:data/write/index",
    "indices:data/write/delete",
    "indices:data/write/bulk*",
)
# A _bulk request is authorized at the cluster level first, then per item on the index.
WRITER_CLUSTER_ACTIONS: Final = ("indices:data/write/bulk",)
_RECORDED_CATEGORIES: Final = (
    "FAILED_LOGIN",
    "MISSING_PRIVILEGES",
    "BAD_HEADERS",
    "SSL_EXCEPTION",
    "OPENSEARCH_SECURITY_INDEX_ATTEMPT",
)
_SUCCESS_CATEGORIES: Final = ("AUTHENTICATED", "GRANTED_PRIVILEGES")
AUDIT_CONFIG: Final[Mapping[str, Any]] = {
    "enabled": True,
    "audit": {
        "enable_rest": True,
        "enable_transport": True,
        "disabled_rest_categories": list(_SUCCESS_CATEGORIES),
        "disabled_transport_categories": list(_SUCCESS_CATEGORIES),
        "log_request_body": False,
        "resolve_indices": True,
        "resolve_bulk_requests": False,
        "exclude_sensitive_headers": True,
        "ignore_users": [],
        "ignore_requests": [],
    },
    "compliance": {
        "enabled": True,
        "internal_config": True,
        "external_config": False,
        "read_metadata_only": True,
        "read_watched_fields": {},
        "read_ignore_users": [],
        "write_metadata_only": True,
        "write_log_diffs": False,
        "write_watched_indices": [],
        "write_ignore_users": [],
    },
}
"""The audit configuration; the recorded categories are every one not in the disabled lists
(``_RECORDED_CATEGORIES`` on both layers)."""

_ROLE_ARN: Final = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$")
_INDEX_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,254}$")
_OK_STATUSES: Final = frozenset({200, 201})
_GONE_STATUSES: Final = frozenset({200, 404})  # a DELETE of what is already gone succeeded
_RETRIED_STATUSES: Final = frozenset({429, 500, 502, 503, 504})
# Kept for the answer to CloudFormation after the last attempt (and the Lambda's own end).
ANSWER_MARGIN_MS: Final = 15_000
DEFAULT_RUN_MS: Final = 120_000
REQUEST_TIMEOUT_S: Final = 20.0
RESPONSE_ATTEMPTS: Final = 3


class SecurityConfigError(Exception):
    """A failure whose message is safe to hand CloudFormation as the reason."""


# --------------------------------------------------------------------------------------------
# What to apply
# --------------------------------------------------------------------------------------------


def _role_arns(properties: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = properties.get(key)
    if not isinstance(value, list) or not value:
        raise SecurityConfigError(f"{key} must be a non-empty list of IAM role ARNs")
    arns = tuple(dict.fromkeys(str(arn) for arn in value))
    malformed = [i for i, arn in enumerate(arns) if not _ROLE_ARN.match(arn)]
    if malformed:
        raise SecurityConfigError(f"{key}[{malformed[0]}] is not an IAM role ARN")
    return arns


def _flag(properties: Mapping[str, Any], key: str) -> bool:
    value = str(properties.get(key, "false")).lower()
    if value not in ("true", "false"):
        raise SecurityConfigError(f"{key} must be true or false")
    return value == "true"


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """The domain endpoint, the stack's index and the IAM roles to map, from the resource's
    properties (``Endpoint``, ``Index``, ``ReaderRoleArns``, ``WriterRoleArns``; for a shared
    domain ``SharedDomain: "true"`` and the ``SecurityRoleArn`` to sign as)."""

    endpoint: str
    index: str
    reader_role_arns: tuple[str, ...]
    writer_role_arns: tuple[str, ...]
    shared: bool = False
    security_role_arn: str | None = None

    @property
    def reader_role(self) -> str:
        return f"{self.index}_reader"

    @property
    def writer_role(self) -> str:
        return f"{self.index}_writer"

    @classmethod
    def from_properties(cls, properties: Mapping[str, Any]) -> SecurityConfig:
        endpoint = str(properties.get("Endpoint", "")).rstrip("/")
        parts = urlsplit(endpoint)
        if parts.scheme != "https" or not parts.hostname or parts.path or parts.query:
            raise SecurityConfigError("Endpoint must be https://<domain endpoint host>")
        index = str(properties.get("Index", ""))
        if not _INDEX_NAME.match(index):
            raise SecurityConfigError("Index must be an OpenSearch index name")
        readers = _role_arns(properties, "ReaderRoleArns")
        writers = _role_arns(properties, "WriterRoleArns")
        both = sorted(set(readers) & set(writers))
        if both:
            raise SecurityConfigError("a role is listed as both reader and writer")
        shared = _flag(properties, "SharedDomain")
        signer = str(properties.get("SecurityRoleArn") or "") or None
        if shared and (signer is None or not _ROLE_ARN.match(signer)):
            raise SecurityConfigError("a shared domain needs SecurityRoleArn, an IAM role ARN")
        return cls(endpoint, index, readers, writers, shared, signer if shared else None)

    def requests(self) -> list[tuple[str, dict[str, Any]]]:
        """``(path, body)`` of every ``PUT``, in order: roles, then mappings, then (on the
        stack's own domain) audit."""
        roles: dict[str, dict[str, Any]] = {
            self.reader_role: {
                "cluster_permissions": [],
                "index_permissions": [
                    {"index_patterns": [self.index], "allowed_actions": list(READ_ACTIONS)}
                ],
            },
            self.writer_role: {
                "cluster_permissions": list(WRITER_CLUSTER_ACTIONS),
                "index_permissions": [
                    {"index_patterns": [self.index], "allowed_actions": list(WRITE_ACTIONS)}
                ],
            },
        }
        mappings = {
            self.reader_role: list(self.reader_role_arns),
            self.writer_role: list(self.writer_role_arns),
        }
        steps: list[tuple[str, dict[str, Any]]] = [
            (f"{SECURITY_API}/roles/{name}", body) for name, body in roles.items()
        ]
        steps += [
            (
                f"{SECURITY_API}/rolesmapping/{name}",
                {"backend_roles": arns, "hosts": [], "users": []},
            )
            for name, arns in mappings.items()
        ]
        if not self.shared:
            steps.append((f"{SECURITY_API}/audit/config", dict(AUDIT_CONFIG)))
        return steps

    def removals(self) -> list[str]:
        """The paths a shared domain's ``Delete`` removes: the mappings, then the roles."""
        names = (self.reader_role, self.writer_role)
        return [f"{SECURITY_API}/rolesmapping/{n}" for n in names] + [
            f"{SECURITY_API}/roles/{n}" for n in names
        ]


# --------------------------------------------------------------------------------------------
# Signed requests to the domain
# --------------------------------------------------------------------------------------------


class SigV4Client:
    """JSON requests to the domain, signed with SigV4 for service ``es`` (botocore's signer)."""

    def __init__(
        self,
        endpoint: str,
        *,
        region: str,
        credentials: Credentials,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._region = region
        self._credentials = credentials
        self._context = ssl_context or ssl.create_default_context()
        self._timeout_s = timeout_s

    def put(self, path: str, body: Mapping[str, Any]) -> int:
        """``PUT path`` with a JSON body; the HTTP status (an error status is returned, not
        raised; a network failure raises ``OSError``)."""
        return self.send("PUT", path, body)

    def send(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> int:
        """``method path`` (a JSON body when given), signed; the HTTP status as ``put``'s."""
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        data = b""
        if body is not None:
            data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode("utf-8")
        headers = {} if body is None else {"content-type": "application/json"}
        request = AWSRequest(method=method, url=self.endpoint + path, data=data, headers=headers)
        SigV4Auth(self._credentials, SERVICE, self._region).add_auth(request)
        prepared = request.prepare()
        outgoing = urllib.request.Request(  # noqa: S310 - the https endpoint checked above
            prepared.url, data=data or None, headers=dict(prepared.headers.items()), method=method
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                outgoing, timeout=self._timeout_s, context=self._context
            ) as answer:
                status: int = answer.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            exc.close()
        return status


def apply(
    config: SecurityConfig,
    client: SigV4Client,
    *,
    deadline: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    removal: bool = False,
) -> list[str]:
    """PUT every step of ``config`` (``removal``: DELETE the stack's mappings and roles from a
    shared domain, what is gone already counting as removed); retry throttling, 5xx and network
    errors with backoff until ``deadline`` (a ``clock`` value). Returns the paths done;
    ``SecurityConfigError`` names the step that failed."""
    steps: list[tuple[str, Mapping[str, Any] | None]] = (
        [(path, None) for path in config.removals()] if removal else list(config.requests())
    )
    method, ok = ("DELETE", _GONE_STATUSES) if removal else ("PUT", _OK_STATUSES)
    for path, body in steps:
        _sent(client, method, path, body, ok, deadline=deadline, sleep=sleep, clock=clock)
    return [path for path, _ in steps]


def _sent(
    client: SigV4Client,
    method: str,
    path: str,
    body: Mapping[str, Any] | None,
    ok: frozenset[int],
    *,
    deadline: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    delay = 1.0
    while True:
        try:
            status: int | None = client.send(method, path, body)
            failure = f"HTTP {status}"
        except OSError as exc:  # connection refused, TLS, timeout: the domain may be waking
            cause = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            status, failure = None, type(cause).__name__
        if status in ok:
            return
        if status is not None and status not in _RETRIED_STATUSES:
            raise SecurityConfigError(f"{method} {path} answered {failure}")
        if clock() + delay > deadline:
            raise SecurityConfigError(f"{method} {path} failed until the deadline ({failure})")
        get_logger().warning("security API retry", extra={"path": path, "failure": failure})
        sleep(delay)
        delay = min(delay * 2, 15.0)


# --------------------------------------------------------------------------------------------
# The custom resource
# --------------------------------------------------------------------------------------------


def _default_credentials(role_arn: str | None = None) -> tuple[Credentials, str]:
    """The function's own credentials, or ``role_arn``'s (assumed for this one run) to sign
    as the shared domain's security manager."""
    import boto3
    from botocore.credentials import Credentials as SessionCredentials

    session = boto3.session.Session()
    credentials = session.get_credentials()
    if credentials is None or not session.region_name:
        raise SecurityConfigError("no AWS credentials or region to sign with")
    if role_arn is None:
        return credentials, session.region_name
    try:
        assumed = session.client("sts").assume_role(
            RoleArn=role_arn, RoleSessionName="engram-opensearch-security", DurationSeconds=900
        )["Credentials"]
    except Exception as exc:  # AccessDenied, a missing trust: the type, never the ARN's secrets
        raise SecurityConfigError(
            f"assuming SecurityRoleArn failed ({type(exc).__name__})"
        ) from None
    return (
        SessionCredentials(
            assumed["AccessKeyId"], assumed["SecretAccessKey"], assumed["SessionToken"]
        ),
        session.region_name,
    )


class SecurityConfigResource:
    """``Custom::OpenSearchSecurityConfig``: apply on Create/Update, nothing on Delete, and
    always answer CloudFormation (see the module docstring)."""

    def __init__(
        self,
        *,
        credentials: Callable[[str | None], tuple[Credentials, str]] = _default_credentials,
        ssl_context: ssl.SSLContext | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._credentials = credentials
        self._ssl_context = ssl_context
        self._sleep = sleep
        self._entry = instrumented(self._handle)

    def __call__(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        answer: dict[str, Any] = self._entry(event, context)
        return answer

    def _handle(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        request_type = str(event.get("RequestType", ""))
        raw_properties = event.get("ResourceProperties")
        properties: Mapping[str, Any] = (
            raw_properties if isinstance(raw_properties, Mapping) else {}
        )
        host = urlsplit(str(properties.get("Endpoint", ""))).hostname or "unknown"
        # The endpoint and the index: a replacement (another domain) deletes on the old one only.
        physical_id = f"engram-opensearch-security:{host}/{properties.get('Index', '')}"
        if request_type == "Delete":
            physical_id = str(event.get("PhysicalResourceId") or physical_id)
        status, reason = "SUCCESS", ""
        data: dict[str, Any] = {}
        try:
            if request_type in ("Create", "Update"):
                data = self._apply(properties, context)
            elif request_type == "Delete":
                data = self._remove(properties, context)
            else:
                raise SecurityConfigError("RequestType must be Create, Update or Delete")
        except SecurityConfigError as exc:
            status, reason = "FAILED", str(exc)
        except Exception as exc:  # never leave CloudFormation waiting; the type only
            status, reason = "FAILED", f"unexpected {type(exc).__name__}"
            get_logger().exception("security configuration failed")
        if status == "FAILED":
            stream = getattr(context, "log_stream_name", None)
            reason += f" (log stream {stream})" if stream else ""
        get_logger().info(
            "custom resource answered",
            extra={"request_type": request_type, "status": status, "reason": reason},
        )
        answered = respond(event, status, reason, physical_id, data, sleep=self._sleep)
        return {"Status": status, "Reason": reason, "Answered": answered}

    def _client(self, config: SecurityConfig, context: Any) -> tuple[SigV4Client, float]:
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        run_ms = int(remaining()) if remaining is not None else DEFAULT_RUN_MS
        deadline = time.monotonic() + max(0, run_ms - ANSWER_MARGIN_MS) / 1000
        credentials, region = self._credentials(config.security_role_arn)
        client = SigV4Client(
            config.endpoint, region=region, credentials=credentials, ssl_context=self._ssl_context
        )
        return client, deadline

    def _apply(self, properties: Mapping[str, Any], context: Any) -> dict[str, Any]:
        config = SecurityConfig.from_properties(properties)
        client, deadline = self._client(config, context)
        applied = apply(config, client, deadline=deadline, sleep=self._sleep)
        return {
            "Roles": f"{config.reader_role},{config.writer_role}",
            "AuditLogs": "the domain owner's" if config.shared else "enabled",
            "Steps": len(applied),
        }

    def _remove(self, properties: Mapping[str, Any], context: Any) -> dict[str, Any]:
        """Nothing on the stack's own domain (it goes with the stack); on a shared one, the
        stack's roles and mappings. Unreadable properties on Delete remove nothing: a stack
        whose create failed on them must still delete."""
        try:
            config = SecurityConfig.from_properties(properties)
        except SecurityConfigError:
            return {"Removed": 0}
        if not config.shared:
            return {"Removed": 0}
        client, deadline = self._client(config, context)
        removed = apply(config, client, deadline=deadline, sleep=self._sleep, removal=True)
        return {"Removed": len(removed)}


def respond(
    event: Mapping[str, Any],
    status: str,
    reason: str,
    physical_id: str,
    data: Mapping[str, Any],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """PUT the answer to the event's ``ResponseURL`` (an empty content type: the presigned URL
    is signed without one). Returns whether it arrived; the URL is never logged."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:1000] or status,
            "PhysicalResourceId": physical_id,
            "StackId": event.get("StackId"),
            "RequestId": event.get("RequestId"),
            "LogicalResourceId": event.get("LogicalResourceId"),
            "NoEcho": False,
            "Data": dict(data),
        }
    ).encode("utf-8")
    url = str(event.get("ResponseURL", ""))
    if urlsplit(url).scheme not in ("https", "http"):
        get_logger().error("the event has no usable ResponseURL")
        return False
    for attempt in range(RESPONSE_ATTEMPTS):
        request = urllib.request.Request(  # noqa: S310 - CloudFormation's presigned URL
            url, data=body, method="PUT", headers={"content-type": ""}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S):  # noqa: S310
                return True
        except (OSError, ValueError) as exc:
            get_logger().warning(
                "answering CloudFormation failed",
                extra={"attempt": attempt + 1, "error": type(exc).__name__},
            )
            if attempt + 1 < RESPONSE_ATTEMPTS:
                sleep(2.0 * (attempt + 1))
    return False

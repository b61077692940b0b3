"""AWS refusing a call for want of permission, seen where every call of a client passes.

An IAM policy, a KMS key policy or an SCP that no longer lets the stack's roles do their work
shows up as one of a few error codes, whatever the service: ``AccessDenied`` (S3, STS, the query
protocols), ``AccessDeniedException`` (DynamoDB, KMS, Secrets Manager, Step Functions, Lambda,
CloudWatch Logs), ``UnauthorizedOperation`` (EC2), ``AuthorizationError`` (SNS),
``KMSAccessDeniedException`` (a service refused the KMS key behind a resource), and an S3
``HEAD`` answered 403 without a body (code ``403``/``Forbidden``). Other 403s are credential
problems (``InvalidAccessKeyId``, ``ExpiredToken``, ``SignatureDoesNotMatch``), not
permissions, and are left to the calls' own errors.

``watch_denials(session, report)`` registers one botocore ``after-call`` hook on a boto3
session: every client made from that session afterwards inherits it (botocore copies the
session's event hooks into each client it creates), so the composition root registers it once
where it makes a function's session. The hook reads the parsed response only after the call
(the call's own outcome, retries and errors are untouched) and calls ``report`` with a
``Denial``: the service's IAM prefix (its SigV4 signing name: ``dynamodb``, ``kms``, ``s3``,
``secretsmanager``, ``states``, ``lambda``, ``logs``…), the operation, the error code, the HTTP
status and AWS's request id. Never the error message: it names the caller's role and the
resource (a secret's ARN, a key's), which belong in CloudTrail, not in a metric or a log line.
A ``report`` that fails is logged and swallowed: telemetry never changes a call's outcome.

The OpenSearch index (not a botocore client) reports its own 403s (``opensearch_index``): a
domain access policy's refusal and fine-grained access control's ``security_exception`` alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from boto3.session import Session

__all__ = ["DENIED_CODES", "Denial", "denial_of", "watch_denials"]

DENIED_CODES: Final = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "AuthorizationError",
        "KMSAccessDeniedException",
    }
)
# An S3 HEAD request has no body to carry a code: botocore reports the status as the code.
_BODILESS_403: Final = frozenset({"403", "Forbidden"})
_HOOK_ID: Final = "engram-memory-access-denied"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Denial:
    """One call AWS refused for want of permission (no message, no resource, no payload)."""

    service: str  # the IAM prefix / SigV4 signing name, e.g. "states" for Step Functions
    operation: str  # the API operation, e.g. "GenerateDataKey"
    code: str  # the error code AWS answered
    status: int | None  # the HTTP status
    request_id: str | None  # AWS's request id, to find the call in CloudTrail


Report = Callable[[Denial], None]


def denial_of(service: str, operation: str, status: int | None, parsed: Any) -> Denial | None:
    """The ``Denial`` a parsed botocore response is, or None (a success or another error)."""
    error = parsed.get("Error") if isinstance(parsed, Mapping) else None
    if not isinstance(error, Mapping):
        return None
    code = str(error.get("Code") or "")
    if code not in DENIED_CODES and not (status == 403 and code in _BODILESS_403):
        return None
    metadata = parsed.get("ResponseMetadata")
    request_id = metadata.get("RequestId") if isinstance(metadata, Mapping) else None
    return Denial(service, operation, code, status, str(request_id) if request_id else None)


def watch_denials(session: Session, report: Report) -> Session:
    """Register the ``after-call`` hook on ``session`` (once: a second call replaces nothing);
    every client made from it afterwards reports its denials to ``report``."""

    def after_call(http_response: Any, parsed: Any, model: Any, **_: Any) -> None:
        try:
            service = model.service_model
            denial = denial_of(
                str(service.signing_name or service.endpoint_prefix),
                str(model.name),
                getattr(http_response, "status_code", None),
                parsed,
            )
            if denial is not None:
                report(denial)
        except Exception:  # the call's own outcome must stand, whatever telemetry does
            log.exception("reporting an AWS access denial failed")

    session.events.register("after-call", after_call, unique_id=_HOOK_ID)
    return session

"""An AWS call whose one expected refusal is an answer, not a failure.

A conditional write whose condition does not hold (``ConditionalCheckFailedException``), a MAC
that does not verify (``KMSInvalidMacException``): AWS answers these as errors, but the caller
asked a question and "no" is its answer. Every other error, and AWS out of reach, is
``StoreUnavailable``: retriable, and its message names the resource, never AWS's text (which
may name the caller's role or the resource's ARN).

botocore is imported on the first call, not at import: a function's cold start that never makes
such a call does not load it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from engram_memory.engine.ports import StoreUnavailable

__all__ = ["CONDITION_FAILED", "error_code", "unless_refused"]

T = TypeVar("T")

# DynamoDB's answer to a write whose ConditionExpression does not hold.
CONDITION_FAILED: Final = "ConditionalCheckFailedException"


def unless_refused(call: Callable[[], T], refusal: str, unavailable: str) -> T | None:
    """``call()``'s answer, or None when AWS refuses it with the error code ``refusal``; any
    other AWS error is ``StoreUnavailable(unavailable)``."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call()
    except ClientError as exc:
        if error_code(exc) == refusal:
            return None
        raise StoreUnavailable(unavailable) from exc
    except BotoCoreError as exc:
        raise StoreUnavailable(unavailable) from exc


def error_code(error: BaseException | None) -> str:
    """The error code AWS answered (``ConditionalCheckFailedException``, ``ThrottlingException``,
    an S3 ``404``…), or "" for anything that is not AWS's answer (out of reach, a bug)."""
    from botocore.exceptions import ClientError

    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code") or "")
    return ""

"""adapters.aws.calls.unless_refused: the one expected refusal is an answer (None); any other AWS
error, or AWS out of reach, is StoreUnavailable with the caller's message and never AWS's."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from engram_memory.adapters.aws.calls import CONDITION_FAILED, error_code, unless_refused
from engram_memory.cloud.proofs import KmsMacKey
from engram_memory.engine.ports import StoreUnavailable

SECRET_TEXT = "arn:aws:iam::123456789012:role/the-callers-role"


def _refused(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": SECRET_TEXT}}, "PutItem")


def _raise(error: Exception) -> Any:
    raise error


def test_the_answer_when_aws_answers() -> None:
    assert unless_refused(lambda: {"ok": 1}, CONDITION_FAILED, "store unavailable") == {"ok": 1}


def test_the_named_refusal_is_none() -> None:
    call = lambda: _raise(_refused(CONDITION_FAILED))  # noqa: E731
    assert unless_refused(call, CONDITION_FAILED, "store unavailable") is None


@pytest.mark.parametrize(
    "error",
    [
        _refused("ProvisionedThroughputExceededException"),
        _refused("AccessDeniedException"),
        EndpointConnectionError(endpoint_url="https://dynamodb.eu-west-1.amazonaws.com"),
    ],
)
def test_any_other_failure_is_store_unavailable_without_aws_text(error: Exception) -> None:
    with pytest.raises(StoreUnavailable) as raised:
        unless_refused(lambda: _raise(error), CONDITION_FAILED, "store unavailable")
    assert str(raised.value) == "store unavailable" and raised.value.__cause__ is error
    assert SECRET_TEXT not in str(raised.value)


class _Kms:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def verify_mac(self, **_: Any) -> Any:
        return _raise(self.answer) if isinstance(self.answer, Exception) else self.answer


@pytest.mark.parametrize(
    ("answer", "verifies"),
    [
        ({"MacValid": True}, True),
        ({"MacValid": False}, False),
        (_refused("KMSInvalidMacException"), False),
    ],
)
def test_a_kms_mac_that_does_not_verify_is_false(answer: Any, verifies: bool) -> None:
    assert (
        KmsMacKey(_Kms(answer), "arn:aws:kms:eu-west-1:1:key/k").verifies(b"m", b"mac") is verifies
    )


def test_a_kms_key_out_of_reach_is_unavailable_not_false() -> None:
    key = KmsMacKey(_Kms(_refused("KMSInvalidStateException")), "arn:aws:kms:eu-west-1:1:key/k")
    with pytest.raises(StoreUnavailable, match="the proof key is unavailable"):
        key.verifies(b"m", b"mac")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (_refused(CONDITION_FAILED), CONDITION_FAILED),
        (ClientError({"Error": {"Message": SECRET_TEXT}}, "GetObject"), ""),
        (EndpointConnectionError(endpoint_url="https://s3.eu-west-1.amazonaws.com"), ""),
        (ValueError("a bug"), ""),
        (None, ""),
    ],
)
def test_error_code_is_aws_answer_or_empty(error: BaseException | None, code: str) -> None:
    assert error_code(error) == code

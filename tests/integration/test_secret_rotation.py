"""The stack's secrets rotate (``cloud.secret_rotation``, the four steps Secrets Manager calls, on
moto) and each reader keeps what was made under the previous version valid, not older
(``engine.keyring.KeyRing``: current and previous version, read from the secret): the approval
page's sessions until they expire, the adapter's requestState, the search page cursors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from approval_testing import APPROVAL_ENV, approval_page, session_of
from aws_testing import REGION, moto_aws
from pydantic import ValidationError

from engram_memory.cloud.approval_page import ApprovalHandler
from engram_memory.cloud.mcp_adapter import request_state_key
from engram_memory.cloud.secret_rotation import RotationRefused, rotation_handler
from engram_memory.cloud.settings import read_cursor_key
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.gate import Approval
from engram_memory.engine.paging import PageState, decode_cursor, encode_cursor
from engram_memory.mcp_surface.request_state import RequestStateInvalid, RequestStateSealer
from scripts.cloud_run.schedules import start_rotation

from engram_testing import forget_request

ACCOUNT = "123456789012"  # moto's account
STEPS = ("createSecret", "setSecret", "testSecret", "finishSecret")


@pytest.fixture
def secrets() -> Iterator[tuple[Any, str]]:
    with moto_aws():
        client = boto3.client("secretsmanager", region_name=REGION)
        arn = client.create_secret(Name="engram-dev-session", SecretString="s" * 64)["ARN"]
        yield client, arn


def rotate(client: Any, arn: str) -> str:
    """One rotation as Secrets Manager runs it: a pending version, then the four steps."""
    token = start_rotation(arn)
    handler = rotation_handler(lambda: client)
    for step in STEPS:
        handler({"SecretId": arn, "ClientRequestToken": token, "Step": step}, None)
    return str(token)


def value(client: Any, arn: str, stage: str) -> str:
    return str(client.get_secret_value(SecretId=arn, VersionStage=stage)["SecretString"])


class Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


def page(arn: str, clock: Clock) -> ApprovalHandler:
    """A cold start of the approval function reading the secret (no test key)."""
    env = {**APPROVAL_ENV, "ENGRAM_APPROVAL_SESSION_SECRET_ARN": arn}
    handler = approval_page(object(), object(), env=env, now_ms=clock)
    handler.session_key = None
    return handler


def cookie(handler: ApprovalHandler, sub: str) -> str:
    return session_of(handler, sub).split("=", 1)[1]


def test_a_rotation_makes_a_new_current_version_and_keeps_the_old_one_previous(
    secrets: tuple[Any, str],
) -> None:
    client, arn = secrets
    first = value(client, arn, "AWSCURRENT")
    token = rotate(client, arn)
    assert value(client, arn, "AWSPREVIOUS") == first
    current = value(client, arn, "AWSCURRENT")
    assert current != first and len(current) == 64
    # a retried step changes nothing
    rotation_handler(lambda: client)(
        {"SecretId": arn, "ClientRequestToken": token, "Step": "finishSecret"}, None
    )
    assert value(client, arn, "AWSCURRENT") == current


def test_a_version_not_staged_for_rotation_is_refused(secrets: tuple[Any, str]) -> None:
    client, arn = secrets
    handler = rotation_handler(lambda: client)
    start_rotation(arn)
    with pytest.raises(RotationRefused):
        handler({"SecretId": arn, "ClientRequestToken": "x" * 36, "Step": "finishSecret"}, None)
    with pytest.raises(ValidationError):
        handler({"SecretId": arn, "ClientRequestToken": "x" * 36, "Step": "dropSecret"}, None)


def test_a_session_signed_before_a_rotation_stays_valid_until_it_expires(
    secrets: tuple[Any, str],
) -> None:
    client, arn = secrets
    clock = Clock()
    warm = page(arn, clock)
    before = cookie(warm, "alice")
    rotate(client, arn)
    cold = page(arn, clock)  # a container started after the rotation
    assert cold.signed_cookies().approver(before) is not None  # the previous version verifies
    after = cookie(cold, "bob")
    clock.ms += 61_000  # the warm container reads the versions again on a cookie it cannot verify
    assert warm.signed_cookies().approver(after) is not None
    rotate(client, arn)
    assert page(arn, clock).signed_cookies().approver(before) is None  # two rotations back
    assert page(arn, clock).signed_cookies().approver(after) is not None
    clock.ms += 600_000
    assert page(arn, clock).signed_cookies().approver(after) is None  # expired


class KeyClock:
    """A ``KeyRing``'s clock: how long ago the versions were read decides a re-read."""

    def __init__(self) -> None:
        self.s = 1_800_000_000.0

    def __call__(self) -> float:
        return self.s


def an_approval() -> Approval:
    request = forget_request("mem_x", summary="forget mem_x")
    return Approval.asked(request, approval_id="apr_" + "a" * 32, issued_at_ms=1_000)


def test_a_request_state_sealed_before_a_rotation_opens_after_it_not_after_two(
    secrets: tuple[Any, str],
) -> None:
    client, arn = secrets
    state = an_approval()
    clock = KeyClock()
    warm = RequestStateSealer(request_state_key(client, arn, clock=clock))
    before = warm.seal(state)
    rotate(client, arn)
    cold = RequestStateSealer(request_state_key(client, arn))  # an adapter started after it
    assert cold.open(before) == state  # sealed under the previous version
    after = cold.seal(state)
    clock.s += 61  # not read within KEY_RETRY_S: a state it cannot open makes it read again
    assert warm.open(after) == state
    rotate(client, arn)
    oldest = RequestStateSealer(request_state_key(client, arn))
    with pytest.raises(RequestStateInvalid):
        oldest.open(before)  # two rotations back
    assert oldest.open(after) == state


def test_a_cursor_signed_before_a_rotation_verifies_after_it_not_after_two(
    secrets: tuple[Any, str],
) -> None:
    client, arn = secrets
    page = PageState("r" * 64, "b" * 64, 1_800_000_000_000, "2027-01-15T08:00:00Z", "o" * 64, 10)
    clock = KeyClock()
    warm = read_cursor_key(client, arn, clock=clock)
    before = encode_cursor(page, warm)
    rotate(client, arn)
    cold = read_cursor_key(client, arn)  # a search function started after it
    assert decode_cursor(before, cold) == page
    after = encode_cursor(page, cold)
    clock.s += 61  # not read within KEY_RETRY_S: a cursor it cannot verify makes it read again
    assert decode_cursor(after, warm) == page
    rotate(client, arn)
    with pytest.raises(EngramError) as refused:
        decode_cursor(before, read_cursor_key(client, arn))  # two rotations back
    assert refused.value.code is ErrorCode.STALE_PAGE
    assert decode_cursor(after, read_cursor_key(client, arn)) == page

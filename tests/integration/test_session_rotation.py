"""The approval page's session secret rotates (``cloud.session_rotation``, the four steps Secrets
Manager calls, on moto) and the page keeps every session signed before a rotation valid until it
expires (``approver_signin.CookieKeys``: current and previous version, read from the secret)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from approval_testing import APPROVAL_ENV, approval_page, session_of
from aws_testing import REGION, moto_aws
from pydantic import ValidationError

from engram_memory.cloud.approval_page import ApprovalHandler
from engram_memory.cloud.session_rotation import RotationRefused, rotation_handler
from scripts.cloud_run.schedules import start_rotation

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

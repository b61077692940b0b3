"""Rotation of the stack's three secrets (``functions/secret_rotation/app.py``): the request-state
sealing key, the search cursor key and the approval page's session key.

Secrets Manager calls the function four times per rotation (``Step``), each with the secret and
the new version's ``ClientRequestToken``:

- ``createSecret``: a new random value staged ``AWSPENDING`` (once: a retried step finds it);
- ``setSecret``: nothing; each key is used by this stack's functions alone, no other system
  holds it;
- ``testSecret``: the pending value is long enough to key what the secret keys;
- ``finishSecret``: ``AWSCURRENT`` moves to the new version, and Secrets Manager stages the old
  one ``AWSPREVIOUS``.

Each reader signs or seals with the current version and verifies or opens with the current and
the previous one (``engine.keyring.KeyRing``), so what was made just before a rotation stays
valid for its short life (a session, a requestState, a page cursor); the next rotation retires
it. The answer names no value; an event that is not this protocol's is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, StrictStr

from engram_memory.cloud.observability import get_logger

SECRET_LENGTH: Final = 64
PENDING: Final = "AWSPENDING"
CURRENT: Final = "AWSCURRENT"


class RotationEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    SecretId: StrictStr
    ClientRequestToken: StrictStr
    Step: Literal["createSecret", "setSecret", "testSecret", "finishSecret"]


class RotationRefused(Exception):
    """The version to rotate to is not one this rotation may finish (no value in the message)."""


def _stages(secrets: Any, event: RotationEvent) -> list[str]:
    described = secrets.describe_secret(SecretId=event.SecretId)
    if not described.get("RotationEnabled", False):
        raise RotationRefused("rotation is not enabled on the secret")
    versions: Mapping[str, list[str]] = described.get("VersionIdsToStages", {})
    if event.ClientRequestToken not in versions:
        raise RotationRefused("the version to rotate to is not a version of the secret")
    return list(versions[event.ClientRequestToken])


def _create(secrets: Any, event: RotationEvent) -> None:
    secrets.get_secret_value(SecretId=event.SecretId, VersionStage=CURRENT)  # it exists
    try:
        secrets.get_secret_value(
            SecretId=event.SecretId, VersionId=event.ClientRequestToken, VersionStage=PENDING
        )
        return  # a retried step: the pending value is there
    except secrets.exceptions.ResourceNotFoundException:
        pass
    value = secrets.get_random_password(
        PasswordLength=SECRET_LENGTH, ExcludePunctuation=True, IncludeSpace=False
    )["RandomPassword"]
    secrets.put_secret_value(
        SecretId=event.SecretId,
        ClientRequestToken=event.ClientRequestToken,
        SecretString=value,
        VersionStages=[PENDING],
    )


def _test(secrets: Any, event: RotationEvent) -> None:
    pending = secrets.get_secret_value(
        SecretId=event.SecretId, VersionId=event.ClientRequestToken, VersionStage=PENDING
    )
    if len(str(pending.get("SecretString", ""))) < SECRET_LENGTH:
        raise RotationRefused("the pending version is too short to be a key")


def _finish(secrets: Any, event: RotationEvent) -> None:
    versions = secrets.describe_secret(SecretId=event.SecretId)["VersionIdsToStages"]
    current = next((v for v, stages in versions.items() if CURRENT in stages), None)
    if current == event.ClientRequestToken:
        return  # a retried step: already current
    secrets.update_secret_version_stage(
        SecretId=event.SecretId,
        VersionStage=CURRENT,
        MoveToVersionId=event.ClientRequestToken,
        RemoveFromVersionId=current,
    )


STEPS: Final[Mapping[str, Callable[[Any, RotationEvent], None]]] = {
    "createSecret": _create,
    "setSecret": lambda secrets, event: None,
    "testSecret": _test,
    "finishSecret": _finish,
}


def rotate(secrets: Any, raw: Mapping[str, Any]) -> None:
    """One step of the rotation protocol on ``secrets`` (a Secrets Manager client)."""
    event = RotationEvent.model_validate(raw)
    stages = _stages(secrets, event)
    if CURRENT in stages:
        return  # this version is already current: nothing to do for any step
    if PENDING not in stages:
        raise RotationRefused("the version to rotate to is not staged AWSPENDING")
    STEPS[event.Step](secrets, event)
    get_logger().info("secret rotation step done", extra={"step": event.Step})


def rotation_handler(make_secrets: Callable[[], Any] | None = None) -> Callable[[Any, Any], None]:
    """The Lambda entry point; the Secrets Manager client is made once, on the first call."""
    held: list[Any] = []

    def handler(event: Any, context: Any) -> None:
        if not held:
            if make_secrets is not None:
                held.append(make_secrets())
            else:
                from engram_memory.cloud.composition import AwsClients

                held.append(AwsClients(_session).client("secretsmanager"))
        rotate(held[0], event)

    return handler


def _session() -> Any:
    import boto3

    return boto3.session.Session()

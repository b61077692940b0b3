"""What AWS runs on the stack's behalf, as AWS runs it: EventBridge's every-minute outbox drainer
and Secrets Manager's rotation of the stack's secrets (request-state, cursor, approval session).

Both go to the built functions' workers, so the calls they make are recorded with the rest of
the run (each function signs with its own role's key).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from .harness import Harness
from .settings import ACCOUNT, REGION, sample
from .smoke import outcome

ROTATION_STEPS = ("createSecret", "setSecret", "testSecret", "finishSecret")


def drain(h: Harness, why: str) -> dict[str, Any]:
    """One scheduled run of the outbox drainer (EventBridge's event); its answer."""
    answer = h.worker("OutboxDrainerFunction").invoke(sample("outbox_drainer.json"))
    h.report.check(
        "error" not in answer,
        f"schedule: the outbox drainer ran ({why}) -> {outcome(answer)}",
    )
    result: dict[str, Any] = answer.get("result") or {}
    return result


def start_rotation(secret_arn: str) -> str:
    """What Secrets Manager does before it calls the rotation function: rotation enabled, a new
    version staged AWSPENDING without a value (moto runs in this process). moto's RotateSecret
    would invoke the function through its own Lambda (a container), which is not the build."""
    from moto.secretsmanager.models import FakeSecret, secretsmanager_backends

    secret = secretsmanager_backends[ACCOUNT][REGION].secrets[secret_arn]
    assert isinstance(secret, FakeSecret)
    secret.rotation_requested = secret.rotation_enabled = True
    token = str(uuid.uuid4())
    secret.remove_version_stages_from_old_versions(["AWSPENDING"])
    secret.versions[token] = {
        "createdate": int(time.time()),
        "version_id": token,
        "version_stages": ["AWSPENDING"],
    }
    return token


def rotate_secrets(h: Harness) -> None:
    """One rotation of each secret with a rotation schedule, as Secrets Manager runs it: a
    pending version, then the four steps, each an invocation of the built rotation function;
    the new version is then current and the old one previous."""
    for name in h.stack.of_type("AWS::SecretsManager::RotationSchedule"):
        props = h.stack.resource(name)["Properties"]
        secret = str(props["SecretId"]["Ref"])
        function = str(props["RotationLambdaARN"]["Fn::GetAtt"][0])
        rotate_secret(h, secret, function)


def rotate_secret(h: Harness, secret: str, function: str) -> None:
    arn = str(h.stack.refs[secret])
    secrets = h.session.client("secretsmanager", endpoint_url=h.moto_url)
    before = secrets.get_secret_value(SecretId=arn, VersionStage="AWSCURRENT")["SecretString"]
    token = start_rotation(arn)
    worker = h.worker(function)
    answers = [
        worker.invoke({"SecretId": arn, "ClientRequestToken": token, "Step": step})
        for step in ROTATION_STEPS
    ]
    after = secrets.get_secret_value(SecretId=arn, VersionStage="AWSCURRENT")["SecretString"]
    previous = secrets.get_secret_value(SecretId=arn, VersionStage="AWSPREVIOUS")["SecretString"]
    failed = [json.dumps(a)[:200] for a in answers if "error" in a]
    h.report.check(
        not failed and after != before and previous == before,
        f"schedule: {secret} rotated through the built {function}'s four steps "
        "(a new current value, the old one previous)" + (f"; {failed[0]}" if failed else ""),
    )

"""moto out of process: a ``ThreadedMotoServer`` for DynamoDB, S3, KMS, Secrets Manager and Step
Functions, running the real ASL of ``infra/statemachines``; its Lambda tasks reach the harness's
Lambda service."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

from .settings import REGION, STATES, access_key


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start_moto() -> tuple[str, Callable[[], None]]:
    """A moto server that executes state machines: its URL, and how to stop it."""
    import logging
    import urllib.request

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    url = f"http://127.0.0.1:{port}"
    request = urllib.request.Request(  # noqa: S310 - the local moto server
        f"{url}/moto-api/config",
        data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()  # noqa: S310
    except Exception:
        moto.stop()
        raise
    return url, moto.stop


def route_lambda_tasks(lambda_url: str) -> None:
    """The state machines' Lambda tasks → the built workers (the Lambda service at the URL)."""
    import boto3
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    # moto imports boto_client_for into lambda_eval_utils without re-exporting it; its Lambda
    # tasks call it by that name, so that is the name to replace
    original = lambda_eval_utils.boto_client_for  # type: ignore[attr-defined]

    def routed(region: str, service: str, state_credentials: Any = None) -> Any:
        if service == "lambda":
            # signed as the state machines (the recorder names the machine by the event)
            return boto3.session.Session(
                region_name=REGION, aws_access_key_id=access_key(STATES), aws_secret_access_key="x"
            ).client("lambda", endpoint_url=lambda_url)
        return original(region, service, state_credentials)

    lambda_eval_utils.boto_client_for = routed  # type: ignore[attr-defined]

"""A bare Powertools handler, run from the built layer like the stack's functions.

Two uses in the cloud benchmarks: its init is the **anchor** of ``bench.cold_imports --built``
(Logger, Tracer and Metrics created and wrapped around the handler as
``engram_memory.cloud.observability`` does for every function, nothing else); and, invoked with
``{"round_trips": n}``, it is the **calibration** call of ``bench.lambda_warm --built``: n bare
DynamoDB ``GetItem`` round trips to the same moto server, with nothing else around them.
"""

import os
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer

logger = Logger(service="bare")
tracer = Tracer(service="bare", patch_modules=("botocore", "requests"))
metrics = Metrics(namespace="Bare", service="bare")
_clients: dict[str, Any] = {}


@logger.inject_lambda_context(log_event=False, clear_state=True)
@tracer.capture_lambda_handler(capture_response=False)
@metrics.log_metrics(capture_cold_start_metric=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    trips = int(event.get("round_trips", 0))
    if trips:
        if "dynamodb" not in _clients:  # built once, as a warm container keeps its clients
            import boto3

            _clients["dynamodb"] = boto3.client("dynamodb")
        key = {"pk": {"S": "calibration"}, "sk": {"S": "calibration"}}
        for _ in range(trips):
            _clients["dynamodb"].get_item(
                TableName=os.environ["ENGRAM_TABLE"], Key=key, ConsistentRead=True
            )
    return {"round_trips": trips}

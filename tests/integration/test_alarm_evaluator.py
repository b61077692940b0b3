"""The helpers that judge the stack's alarms on moto (``alarm_testing``), judged themselves.

Each rule of CloudWatch's evaluation the helpers claim — the window of ``EvaluationPeriods``
periods, ``DatapointsToAlarm`` of them, ``TreatMissingData``, the comparison at the threshold,
metric math with ``FILL``, a series being its exact dimension set — on data put into moto's
CloudWatch; the EMF extraction of every dimension set; the wire faults as botocore parses them;
the topic policy evaluation; and the template's own metric-math alarm through all of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from alarm_testing import (
    DENIED,
    alarm_state,
    denying,
    install_alarm,
    policy_allows,
    put_emf,
    resolve,
    stack_refs,
)
from aws_testing import ACCOUNT, REGION, TENANT, moto_aws
from botocore.exceptions import ClientError

NOW = datetime(2026, 12, 6, 12, 30, 30, tzinfo=UTC)  # inside the minute 12:30
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:alarms"


@pytest.fixture
def cloudwatch(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_aws():
        yield boto3.client("cloudwatch", region_name=REGION)


def _dimensions(tenant: str = TENANT) -> list[dict[str, str]]:
    return [{"Name": "service", "Value": "engram-memory"}, {"Name": "tenant", "Value": tenant}]


def _alarm(cloudwatch: Any, **overrides: Any) -> dict[str, Any]:
    definition: dict[str, Any] = {
        "AlarmName": "probe",
        "Namespace": "EngramMemory",
        "MetricName": "Faults",
        "Dimensions": _dimensions(),
        "Statistic": "Sum",
        "Period": 60,
        "EvaluationPeriods": 1,
        "Threshold": 1.0,
        "ComparisonOperator": "GreaterThanOrEqualToThreshold",
        "TreatMissingData": "notBreaching",
        **overrides,
    }
    cloudwatch.put_metric_alarm(**{k: v for k, v in definition.items() if v is not None})
    (alarm,) = cloudwatch.describe_alarms(AlarmNames=["probe"])["MetricAlarms"]
    found: dict[str, Any] = alarm
    return found


def _put(cloudwatch: Any, minutes_ago: int, value: float = 1.0, tenant: str = TENANT) -> None:
    cloudwatch.put_metric_data(
        Namespace="EngramMemory",
        MetricData=[
            {
                "MetricName": "Faults",
                "Dimensions": _dimensions(tenant),
                "Timestamp": NOW - timedelta(minutes=minutes_ago),
                "Value": value,
                "Unit": "Count",
            }
        ],
    )


def test_one_point_at_the_threshold_alarms_and_none_is_ok_when_missing_is_not_breaching(
    cloudwatch: Any,
) -> None:
    alarm = _alarm(cloudwatch)
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"
    _put(cloudwatch, 0, value=0.5)
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"  # below the threshold
    _put(cloudwatch, 0, value=0.5)
    assert alarm_state(cloudwatch, alarm, NOW) == "ALARM"  # the period's Sum reaches it
    assert alarm_state(cloudwatch, alarm, NOW + timedelta(minutes=1)) == "OK"  # period over


@pytest.mark.parametrize(
    ("treat", "state"),
    [("breaching", "ALARM"), ("notBreaching", "OK"), ("missing", "INSUFFICIENT_DATA")],
)
def test_missing_data_is_treated_as_the_alarm_says(cloudwatch: Any, treat: str, state: str) -> None:
    alarm = _alarm(cloudwatch, TreatMissingData=treat)
    assert alarm_state(cloudwatch, alarm, NOW) == state


def test_m_of_n_needs_m_breaching_periods_inside_the_window(cloudwatch: Any) -> None:
    alarm = _alarm(cloudwatch, EvaluationPeriods=5, DatapointsToAlarm=3)
    for minutes_ago in (0, 3):
        _put(cloudwatch, minutes_ago, value=7)  # many in one minute count as one period
    _put(cloudwatch, 5)  # five minutes back: the minute before the window
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"
    _put(cloudwatch, 4)
    assert alarm_state(cloudwatch, alarm, NOW) == "ALARM"


def test_a_series_is_its_exact_dimension_set(cloudwatch: Any) -> None:
    alarm = _alarm(cloudwatch)
    _put(cloudwatch, 0, tenant="another-tenant")
    cloudwatch.put_metric_data(  # the same metric with one dimension more: another series
        Namespace="EngramMemory",
        MetricData=[
            {
                "MetricName": "Faults",
                "Dimensions": [*_dimensions(), {"Name": "aws_service", "Value": "kms"}],
                "Timestamp": NOW,
                "Value": 1.0,
            }
        ],
    )
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"


def test_emf_puts_every_dimension_set_of_a_document(cloudwatch: Any) -> None:
    document = {
        "_aws": {
            "Timestamp": int(NOW.timestamp() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": "EngramMemory",
                    "Dimensions": [["service", "tenant"], ["aws_service", "service", "tenant"]],
                    "Metrics": [{"Name": "Faults", "Unit": "Count"}],
                }
            ],
        },
        "service": "engram-memory",
        "tenant": TENANT,
        "aws_service": "kms",
        "Faults": [1.0],
    }
    assert put_emf(cloudwatch, document) == 2
    assert alarm_state(cloudwatch, _alarm(cloudwatch), NOW) == "ALARM"
    per_service = _alarm(
        cloudwatch, Dimensions=[*_dimensions(), {"Name": "aws_service", "Value": "kms"}]
    )
    assert alarm_state(cloudwatch, per_service, NOW) == "ALARM"
    # ``at`` places the same document at another instant
    assert put_emf(cloudwatch, document, at=NOW - timedelta(hours=1)) == 2
    assert alarm_state(cloudwatch, _alarm(cloudwatch), NOW - timedelta(hours=1)) == "ALARM"


def test_metric_math_fills_and_adds_series(cloudwatch: Any) -> None:
    def stat(name: str) -> dict[str, Any]:
        metric = {"Namespace": "EngramMemory", "MetricName": name, "Dimensions": _dimensions()}
        return {"Metric": metric, "Period": 60, "Stat": "Sum"}

    alarm = _alarm(
        cloudwatch,
        Namespace=None,
        MetricName=None,
        Dimensions=None,
        Statistic=None,
        Period=None,
        Metrics=[
            {"Id": "a", "MetricStat": stat("Faults"), "ReturnData": False},
            {"Id": "b", "MetricStat": stat("Others"), "ReturnData": False},
            {"Id": "total", "Expression": "FILL(a, 0) + FILL(b, 0)", "ReturnData": True},
        ],
        Threshold=2.0,
    )
    _put(cloudwatch, 0)
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"  # b missing counts 0: 1 < 2
    cloudwatch.put_metric_data(
        Namespace="EngramMemory",
        MetricData=[
            {"MetricName": "Others", "Dimensions": _dimensions(), "Timestamp": NOW, "Value": 1.0}
        ],
    )
    assert alarm_state(cloudwatch, alarm, NOW) == "ALARM"


def test_the_templates_metric_math_alarm_fires_on_one_functions_repeated_throttles(
    cloudwatch: Any,
) -> None:
    """One function's throttles count (the metric math sums them); one burst does not page,
    throttling in two of the last three five-minute periods does."""
    functions = {
        name: f"engram-{TENANT}-{name.removesuffix('Function').lower()}"
        for name in (
            "McpAdapterFunction",
            "SearchFunction",
            "GetFunction",
            "CaptureFunction",
            "RequestAdmissionFunction",
            "WithdrawFunction",
            "ForgetFunction",
        )
    }
    alarm = install_alarm(
        cloudwatch, "ToolThrottlesAlarm", stack_refs(AlarmTopic=TOPIC, **functions)
    )
    assert alarm["AlarmActions"] == [TOPIC] == alarm["OKActions"]
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"

    def throttled(at: datetime) -> None:
        cloudwatch.put_metric_data(
            Namespace="AWS/Lambda",
            MetricData=[
                {
                    "MetricName": "Throttles",
                    "Dimensions": [{"Name": "FunctionName", "Value": functions["GetFunction"]}],
                    "Timestamp": at,
                    "Value": 1.0,
                }
            ],
        )

    throttled(NOW)
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"  # one burst
    throttled(NOW - timedelta(minutes=5))
    assert alarm_state(cloudwatch, alarm, NOW) == "ALARM"  # two of the last three periods


def test_resolve_names_only_what_it_was_given() -> None:
    refs = {"TenantId": "acme", "AWS::Region": REGION, "Key.Arn": "arn:k", "Topic": TOPIC}
    node = {
        "Name": {"Fn::Sub": "engram-${TenantId}-x"},
        "Keys": [{"Fn::GetAtt": ["Key", "Arn"]}, {"Fn::GetAtt": "Key.Arn"}],
        "Where": {"Fn::Sub": ["${Place}:${AWS::Region}", {"Place": {"Ref": "Topic"}}]},
    }
    assert resolve(node, refs) == {
        "Name": "engram-acme-x",
        "Keys": ["arn:k", "arn:k"],
        "Where": f"{TOPIC}:{REGION}",
    }
    with pytest.raises(KeyError):
        resolve({"Ref": "Unknown"}, refs)
    with pytest.raises(ValueError, match="Fn::Select"):
        resolve({"Fn::Select": [0, ["a"]]}, refs)


@pytest.mark.parametrize(
    ("service", "code", "status"),
    [
        ("dynamodb", "AccessDeniedException", 400),
        ("sfn", "AccessDeniedException", 400),
        ("kms", "AccessDeniedException", 400),
        ("secrets-manager", "AccessDeniedException", 400),
        ("lambda", "AccessDeniedException", 403),
        ("s3", "AccessDenied", 403),
    ],
)
def test_a_denied_call_raises_what_botocore_raises_for_the_services_answer(
    cloudwatch: Any, service: str, code: str, status: int
) -> None:
    calls: dict[str, tuple[str, str]] = {
        "dynamodb": ("dynamodb", "list_tables"),
        "sfn": ("stepfunctions", "list_state_machines"),
        "kms": ("kms", "list_keys"),
        "secrets-manager": ("secretsmanager", "list_secrets"),
        "lambda": ("lambda", "list_functions"),
        "s3": ("s3", "list_buckets"),
    }
    name, operation = calls[service]
    session = boto3.session.Session(region_name=REGION)
    call = getattr(session.client(name), operation)  # type: ignore[call-overload]
    with denying(service) as answered, pytest.raises(ClientError) as raised:
        call()
    assert raised.value.response["Error"]["Code"] == code
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert len(answered) == 1  # an AccessDenied is never retried
    call()  # outside the block moto serves the call again
    assert DENIED[service].status == status


def test_a_topic_policy_admits_a_service_only_as_its_statement_says() -> None:
    rule = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/engram-acme-kms-key-state"
    policy = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "events.amazonaws.com"},
                "Action": "sns:Publish",
                "Resource": TOPIC,
                "Condition": {"ArnEquals": {"aws:SourceArn": rule}},
            }
        ]
    }
    context = {"aws:SourceArn": rule}
    assert policy_allows(policy, "events.amazonaws.com", "SNS:Publish", TOPIC, context)
    assert not policy_allows(
        policy, "events.amazonaws.com", "sns:Publish", TOPIC, {"aws:SourceArn": rule + "-x"}
    )
    assert not policy_allows(policy, "cloudwatch.amazonaws.com", "sns:Publish", TOPIC, context)
    assert not policy_allows(policy, "events.amazonaws.com", "sns:Subscribe", TOPIC, context)
    denied = {"Statement": [*policy["Statement"], {**policy["Statement"][0], "Effect": "Deny"}]}
    assert not policy_allows(denied, "events.amazonaws.com", "sns:Publish", TOPIC, context)
    # a topic's default policy names accounts, not services: EventBridge may not publish
    default = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": "*"},
                "Action": ["SNS:Publish"],
                "Resource": TOPIC,
                "Condition": {"StringEquals": {"AWS:SourceOwner": ACCOUNT}},
            }
        ]
    }
    assert not policy_allows(default, "events.amazonaws.com", "sns:Publish", TOPIC, context)
    assert json.dumps(policy)  # plain data, as a topic's Policy attribute holds it


def test_a_functions_lone_crash_does_not_page_and_repeated_crashes_do(cloudwatch: Any) -> None:
    refs = stack_refs(AlarmTopic=TOPIC, SearchFunction=f"engram-{TENANT}-search")
    alarm = install_alarm(cloudwatch, "SearchErrorsAlarm", refs)

    def crashed(at: datetime) -> None:
        cloudwatch.put_metric_data(
            Namespace="AWS/Lambda",
            MetricData=[
                {
                    "MetricName": "Errors",
                    "Dimensions": [{"Name": "FunctionName", "Value": f"engram-{TENANT}-search"}],
                    "Timestamp": at,
                    "Value": 1.0,
                }
            ],
        )

    crashed(NOW)
    assert alarm_state(cloudwatch, alarm, NOW) == "OK"
    crashed(NOW - timedelta(minutes=10))
    assert alarm_state(cloudwatch, alarm, NOW) == "ALARM"

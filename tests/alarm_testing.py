"""The stack's alarms and its key-state rule, judged on moto as AWS would judge them.

moto stores CloudWatch alarms but never evaluates them, and its EventBridge delivers to SQS,
logs and buses but not to an SNS topic. What this module adds, each piece small enough to check
by reading (``tests/integration/test_alarm_evaluator.py`` tests it):

- **Faults on the wire** (``answering``, ``denying``): moto's request dispatcher answers a
  chosen service and operation with the HTTP response AWS sends (``DENIED``: the real
  AccessDenied shapes of DynamoDB, KMS, S3, Secrets Manager, Step Functions and Lambda), so
  botocore parses it, retries it or raises it exactly as it would in a function. Every session
  and client sees it, whoever made them: the code under test builds its own.
- **EMF as CloudWatch extracts it** (``emf_documents``, ``put_emf``): the Powertools lines a
  function printed, each metric of each dimension set of each directive put into moto's
  CloudWatch under the document's namespace, dimension values and timestamp (``at`` places a
  document at another instant: the same fault, as if it had happened then).
- **The template's alarm, as deployed** (``install_alarm``): its properties from the
  SAM-translated ``template.yaml`` with the stack's parameters, intrinsics resolved
  (``resolve``), put into moto with ``PutMetricAlarm`` and read back with ``DescribeAlarms``.
- **The alarm's verdict** (``alarm_state``): CloudWatch's evaluation of that definition against
  moto's ``GetMetricData`` answer at an instant ``now``: the ``EvaluationPeriods`` most recent
  periods (the last one holds ``now``), each period's statistic or a missing point, metric math
  (ids, numbers, ``+ - * /``, ``FILL``) evaluated here (moto does not), ``TreatMissingData``
  (``breaching``/``notBreaching`` exactly; ``missing``/``ignore`` over the periods that have
  data, without CloudWatch's longer look-back), then ALARM when at least ``DatapointsToAlarm``
  periods breach the threshold.
- **EventBridge to SNS** (``sns_rule_targets``): moto's rule matching (its own) then the
  delivery EventBridge makes to an SNS target — the event as the message, published only if the
  topic's policy lets ``events.amazonaws.com`` publish for that rule (``policy_allows``) — through
  moto's SNS, which delivers to the topic's SQS subscribers.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, Final
from unittest import mock

from aws_testing import ACCOUNT, REGION, STACK_PARAMETERS
from botocore.awsrequest import AWSResponse
from moto.core.botocore_stubber import BotocoreStubber, MockRawResponse

# --------------------------------------------------------------------------------------------
# Faults on the wire
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WireAnswer:
    """An HTTP response as AWS sends it."""

    status: int
    headers: Mapping[str, str]
    body: bytes


ROLE: Final = f"arn:aws:sts::{ACCOUNT}:assumed-role/engram-dev-fn/engram-dev-fn"


def _json_error(protocol: str, error_type: str, message: str) -> WireAnswer:
    body = json.dumps({"__type": error_type, "Message": message}).encode()
    headers = {"Content-Type": f"application/x-amz-json-{protocol}", "x-amzn-RequestId": "req-1"}
    return WireAnswer(400, headers, body)


def _not_authorized(action: str) -> str:
    return (
        f"User: {ROLE} is not authorized to perform: {action} on resource: "
        f"arn:aws:{action.split(':')[0]}:{REGION}:{ACCOUNT}:the-resource because no "
        f"identity-based policy allows the {action} action"
    )


# What each service answers a call its caller's policies do not allow (keyed by botocore's
# service id, as in its event names: ``before-send.<service id>.<Operation>``).
DENIED: Final[Mapping[str, WireAnswer]] = {
    # JSON 1.0, the coral framework's error (DynamoDB, Step Functions)
    "dynamodb": _json_error(
        "1.0", "com.amazon.coral.service#AccessDeniedException", _not_authorized("dynamodb:Query")
    ),
    "sfn": _json_error(
        "1.0",
        "com.amazon.coral.service#AccessDeniedException",
        _not_authorized("states:StartExecution"),
    ),
    # JSON 1.1 (KMS, Secrets Manager)
    "kms": _json_error("1.1", "AccessDeniedException", _not_authorized("kms:GenerateDataKey")),
    "secrets-manager": _json_error(
        "1.1", "AccessDeniedException", _not_authorized("secretsmanager:GetSecretValue")
    ),
    # REST-JSON: the type in a header, 403 (Lambda)
    "lambda": WireAnswer(
        403,
        {
            "Content-Type": "application/json",
            "x-amzn-ErrorType": "AccessDeniedException",
            "x-amzn-RequestId": "req-1",
        },
        json.dumps({"Message": _not_authorized("lambda:InvokeFunction"), "Type": "User"}).encode(),
    ),
    # REST-XML, 403 (S3)
    "s3": WireAnswer(
        403,
        {"Content-Type": "application/xml", "x-amz-request-id": "4442587FB7D0A2F9"},
        b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
        b"<Message>Access Denied</Message><RequestId>4442587FB7D0A2F9</RequestId>"
        b"<HostId>aGVsbG8=</HostId></Error>",
    ),
}
THROTTLED: Final = _json_error(
    "1.0",
    "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
    "The level of configured provisioned throughput for the table was exceeded.",
)


@contextmanager
def answering(answers: Mapping[str, WireAnswer]) -> Iterator[list[str]]:
    """moto answers each call whose ``<service id>.<Operation>`` (or ``<service id>``) is a key
    of ``answers`` with that response instead of serving it; yields the calls so answered."""
    original = BotocoreStubber.__call__
    answered: list[str] = []

    def dispatch(self: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
        _, service, operation = event_name.split(".", 2)
        answer = answers.get(f"{service}.{operation}") or answers.get(service)
        if not self.enabled or answer is None:
            return original(self, event_name, request, **kwargs)
        answered.append(f"{service}.{operation}")
        raw = MockRawResponse(answer.body)
        return AWSResponse(request.url, answer.status, dict(answer.headers), raw)  # type: ignore[arg-type]

    with mock.patch.object(BotocoreStubber, "__call__", dispatch):
        yield answered


def denying(*services: str) -> Any:
    """``answering`` each call of ``services`` (botocore service ids) with its AccessDenied."""
    return answering({service: DENIED[service] for service in services})


# --------------------------------------------------------------------------------------------
# EMF, as CloudWatch Logs extracts it
# --------------------------------------------------------------------------------------------


def emf_documents(lines: Iterable[Mapping[str, Any]], metric: str | None = None) -> list[Any]:
    """The EMF documents among printed JSON lines (those naming ``metric``, when given)."""
    found = []
    for line in lines:
        directives = line.get("_aws", {}).get("CloudWatchMetrics")
        if not directives:
            continue
        names = {m["Name"] for d in directives for m in d["Metrics"]}
        if metric is None or metric in names:
            found.append(line)
    return found


def put_emf(cloudwatch: Any, document: Mapping[str, Any], *, at: datetime | None = None) -> int:
    """Put ``document``'s metrics into CloudWatch (moto) as the EMF extraction does: each metric
    of each directive, once per dimension set, with the document's dimension values, at its
    ``Timestamp`` (or ``at``). Returns the number of series written."""
    stamp = at or datetime.fromtimestamp(document["_aws"]["Timestamp"] / 1000, UTC)
    written = 0
    for directive in document["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            dimensions = [{"Name": d, "Value": str(document[d])} for d in dimension_set]
            data = []
            for metric in directive["Metrics"]:
                value = document[metric["Name"]]
                datum: dict[str, Any] = {
                    "MetricName": metric["Name"],
                    "Dimensions": dimensions,
                    "Timestamp": stamp,
                    "Unit": metric.get("Unit", "None"),
                }
                if isinstance(value, list):
                    datum["Values"] = [float(v) for v in value]
                else:
                    datum["Value"] = float(value)
                data.append(datum)
            cloudwatch.put_metric_data(Namespace=directive["Namespace"], MetricData=data)
            written += len(data)
    return written


# --------------------------------------------------------------------------------------------
# The template's resources, as CloudFormation would create them for one stack
# --------------------------------------------------------------------------------------------


@cache
def _translated() -> str:
    from scripts.cloud_template import ROOT, translate

    return json.dumps(translate(ROOT / "template.yaml"))


def template_resource(name: str, **given: str) -> dict[str, Any]:
    """Resource ``name`` of the SAM-translated template for the test stack's parameters
    (``STACK_PARAMETERS`` and ``given``): its condition held, every ``Fn::If`` decided."""
    from scripts.cloud_template import deployed

    resources = deployed(json.loads(_translated()), **{**STACK_PARAMETERS, **given})
    return resources[name]


def stack_refs(**resources: Any) -> dict[str, Any]:
    """What ``Ref``/``Fn::GetAtt``/``${...}`` name for the test stack: its parameters (given
    or default), the pseudo parameters and ``resources`` (logical id, or ``id.Attribute``)."""
    translated = json.loads(_translated())
    parameters = {name: spec.get("Default", "") for name, spec in translated["Parameters"].items()}
    pseudo = {"AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::Partition": "aws"}
    return {**parameters, **STACK_PARAMETERS, **pseudo, **resources}


def resolve(node: Any, refs: Mapping[str, Any]) -> Any:
    """``node`` with ``Ref``, ``Fn::GetAtt``, ``Fn::Sub`` and ``Fn::Join`` resolved from
    ``refs``; any other intrinsic, or a name ``refs`` lacks, is an error (never guessed)."""
    if isinstance(node, list):
        return [resolve(item, refs) for item in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        ((key, value),) = node.items()
        if key == "Ref":
            return refs[value]
        if key == "Fn::GetAtt":
            target = value if isinstance(value, list) else value.split(".", 1)
            return refs[f"{target[0]}.{target[1]}"]
        if key == "Fn::Sub":
            text, local = (value, {}) if isinstance(value, str) else value
            names = {**refs, **{k: resolve(v, refs) for k, v in local.items()}}
            return re.sub(r"\$\{([^}!]+)\}", lambda m: str(names[m.group(1)]), text)
        if key == "Fn::Join":
            return str(value[0]).join(str(v) for v in resolve(value[1], refs))
        if key.startswith("Fn::"):
            raise ValueError(f"unresolved intrinsic {key}")
    return {key: resolve(value, refs) for key, value in node.items()}


_NUMBERS: Final = {
    "Threshold": float,
    "Period": int,
    "EvaluationPeriods": int,
    "DatapointsToAlarm": int,
}


def install_alarm(cloudwatch: Any, name: str, refs: Mapping[str, Any]) -> dict[str, Any]:
    """Alarm ``name`` of the translated template, resolved with ``refs``, put into CloudWatch
    (moto) and read back as ``DescribeAlarms`` reports it."""
    properties = resolve(template_resource(name)["Properties"], refs)
    for key, kind in _NUMBERS.items():  # a parameter's Ref resolves to its string value
        if key in properties:
            properties[key] = kind(properties[key])
    cloudwatch.put_metric_alarm(**properties)
    described = cloudwatch.describe_alarms(AlarmNames=[properties["AlarmName"]])
    (alarm,) = described["MetricAlarms"]
    found: dict[str, Any] = alarm
    return found


# --------------------------------------------------------------------------------------------
# The alarm's verdict
# --------------------------------------------------------------------------------------------

COMPARISONS: Final[Mapping[str, Callable[[float, float], bool]]] = {
    "GreaterThanOrEqualToThreshold": operator.ge,
    "GreaterThanThreshold": operator.gt,
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
}

Series = dict[datetime, float]


def _window(now: datetime, period: int, count: int) -> list[datetime]:
    """The starts of the ``count`` most recent periods, the last one holding ``now``."""
    epoch = int(now.timestamp())
    last = datetime.fromtimestamp(epoch - epoch % period, UTC)
    return [last - timedelta(seconds=period * (count - 1 - i)) for i in range(count)]


def _queries(alarm: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The alarm as ``GetMetricData`` queries: its ``Metrics``, or its one metric."""
    if alarm.get("Metrics"):
        return [copy.deepcopy(dict(q)) for q in alarm["Metrics"]]
    if alarm.get("ExtendedStatistic"):
        raise NotImplementedError("percentile alarms")
    metric = {
        "Namespace": alarm["Namespace"],
        "MetricName": alarm["MetricName"],
        "Dimensions": list(alarm.get("Dimensions", [])),
    }
    stat = {"Metric": metric, "Period": alarm["Period"], "Stat": alarm["Statistic"]}
    return [{"Id": "m", "MetricStat": stat, "ReturnData": True}]


def alarm_series(cloudwatch: Any, alarm: Mapping[str, Any], now: datetime) -> list[float | None]:
    """The value the alarm compares in each period of its evaluation window (None: missing)."""
    queries = _queries(alarm)
    period = int(alarm.get("Period") or queries[0]["MetricStat"]["Period"])
    window = _window(now, period, int(alarm["EvaluationPeriods"]))
    stats = [q for q in queries if "MetricStat" in q]
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {"Id": q["Id"], "MetricStat": q["MetricStat"], "ReturnData": True} for q in stats
        ],
        StartTime=window[0],
        EndTime=window[-1] + timedelta(seconds=period),
    )
    series: dict[str, Series] = {
        result["Id"]: {
            stamp.astimezone(UTC): value
            for stamp, value in zip(result["Timestamps"], result["Values"], strict=True)
        }
        for result in answer["MetricDataResults"]
    }
    for query in queries:
        if "Expression" in query:
            series[query["Id"]] = _math(query["Expression"], series, window)
    (returned,) = [q["Id"] for q in queries if q.get("ReturnData", True)]
    return [series[returned].get(stamp) for stamp in window]


def alarm_state(
    cloudwatch: Any, alarm: Mapping[str, Any], now: datetime, previous: str = "INSUFFICIENT_DATA"
) -> str:
    """ALARM, OK or INSUFFICIENT_DATA: the state CloudWatch gives ``alarm`` at ``now``."""
    values = alarm_series(cloudwatch, alarm, now)
    compare = COMPARISONS[alarm["ComparisonOperator"]]
    threshold = float(alarm["Threshold"])
    treat = alarm.get("TreatMissingData", "missing")
    needed = int(alarm.get("DatapointsToAlarm") or alarm["EvaluationPeriods"])
    present = [v for v in values if v is not None]
    if treat in ("missing", "ignore") and not present:
        return "INSUFFICIENT_DATA" if treat == "missing" else previous
    breaching = sum(compare(v, threshold) for v in present)
    if treat == "breaching":
        breaching += len(values) - len(present)
    return "ALARM" if breaching >= needed else "OK"


_OPERATORS: Final[Mapping[type, Callable[[float, float], float]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: lambda a, b: a / b if b else math.nan,
}


def _math(expression: str, series: Mapping[str, Series], window: list[datetime]) -> Series:
    """A metric-math expression over ``series``: ids, numbers, ``+ - * /`` (a point missing in
    either operand is missing in the result) and ``FILL(id, value)``."""

    def value(node: ast.AST) -> Series | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            return series[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = value(node.operand)
            return -inner if isinstance(inner, float) else {t: -v for t, v in inner.items()}
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _combine(_OPERATORS[type(node.op)], value(node.left), value(node.right))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "FILL"
            and len(node.args) == 2
        ):
            filled, default = value(node.args[0]), value(node.args[1])
            assert isinstance(filled, dict) and isinstance(default, float)
            return {stamp: filled.get(stamp, default) for stamp in window}
        raise NotImplementedError(f"metric math: {ast.dump(node)}")

    result = value(ast.parse(expression, mode="eval").body)
    if isinstance(result, float):
        return dict.fromkeys(window, result)
    return result


def _combine(
    op: Callable[[float, float], float], left: Series | float, right: Series | float
) -> Series | float:
    if isinstance(left, float) and isinstance(right, float):
        return op(left, right)
    if isinstance(left, float):
        assert isinstance(right, dict)
        return {t: op(left, v) for t, v in right.items()}
    if isinstance(right, float):
        return {t: op(v, right) for t, v in left.items()}
    return {t: op(v, right[t]) for t, v in left.items() if t in right}


# --------------------------------------------------------------------------------------------
# Resource policies, for the service principals a topic admits
# --------------------------------------------------------------------------------------------

_CONDITIONS: Final[Mapping[str, Callable[[str, str], bool]]] = {
    "StringEquals": operator.eq,
    "ArnEquals": operator.eq,
    "StringLike": fnmatch.fnmatchcase,
    "ArnLike": fnmatch.fnmatchcase,
}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statement_matches(
    statement: Mapping[str, Any],
    service: str,
    action: str,
    resource: str,
    context: Mapping[str, str],
) -> bool:
    principal = statement.get("Principal")
    services = principal.get("Service", []) if isinstance(principal, Mapping) else []
    if service not in _as_list(services):
        return False  # only a Service principal names a service ("*" and AWS: are accounts')
    actions = [a.lower() for a in _as_list(statement.get("Action", []))]
    if not any(fnmatch.fnmatchcase(action.lower(), a) for a in actions):
        return False
    if not any(fnmatch.fnmatchcase(resource, r) for r in _as_list(statement.get("Resource", []))):
        return False
    for name, tests in statement.get("Condition", {}).items():
        match = _CONDITIONS.get(name)
        if match is None:
            return False  # an operator this evaluator does not know never grants
        for key, expected in tests.items():
            given = context.get(key)
            if given is None or not any(match(given, str(e)) for e in _as_list(expected)):
                return False
    return True


def policy_allows(
    policy: Mapping[str, Any],
    service: str,
    action: str,
    resource: str,
    context: Mapping[str, str],
) -> bool:
    """Whether a resource policy lets AWS service ``service`` (e.g. ``events.amazonaws.com``)
    do ``action`` on ``resource`` with the request's ``context`` (``aws:SourceArn``…): an Allow
    statement matches and no Deny does. Covers what the stack's topic policy uses."""
    statements = _as_list(policy.get("Statement", []))
    matching = [s for s in statements if _statement_matches(s, service, action, resource, context)]
    return any(s["Effect"] == "Allow" for s in matching) and not any(
        s["Effect"] == "Deny" for s in matching
    )


# --------------------------------------------------------------------------------------------
# EventBridge to SNS
# --------------------------------------------------------------------------------------------


@contextmanager
def sns_rule_targets() -> Iterator[list[dict[str, Any]]]:
    """moto's EventBridge rules deliver to SNS topic targets as EventBridge does: a matched event
    (moto's matching) is published to the topic, its JSON as the message, if the topic's policy
    admits ``events.amazonaws.com`` for this rule; else it is dropped (EventBridge counts a
    ``FailedInvocations``). Yields the deliveries refused by the policy."""
    from moto.events.models import Rule
    from moto.sns.models import sns_backends
    from moto.utilities.arns import parse_arn

    original = Rule.send_to_targets
    refused: list[dict[str, Any]] = []

    def send(self: Rule, event: Any, transform_input: bool = True) -> None:
        others = [t for t in self.targets if parse_arn(t["Arn"]).service != "sns"]
        if self.event_pattern.matches_event(event):
            for target in self.targets:
                arn = parse_arn(target["Arn"])
                if arn.service != "sns":
                    continue
                backend = sns_backends[arn.account][arn.region]
                topic = backend.get_topic(target["Arn"])
                context = {"aws:SourceArn": self.arn, "aws:SourceAccount": self.account_id}
                if policy_allows(
                    json.loads(topic.policy),
                    "events.amazonaws.com",
                    "sns:Publish",
                    target["Arn"],
                    context,
                ):
                    backend.publish(json.dumps(event), arn=target["Arn"])
                else:
                    refused.append({"rule": self.arn, "topic": target["Arn"]})
        if others:
            held, self.targets = self.targets, others
            try:
                original(self, event, transform_input)
            finally:
                self.targets = held

    with mock.patch.object(Rule, "send_to_targets", send):
        yield refused

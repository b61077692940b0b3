"""Each failure alarm of the stack fires on moto, driven by the real code path (issue 34, item 5).

A function's real path runs with the fault on the wire (moto's dispatcher answering with the
service's own error: ``alarm_testing``): a tool function whose engine the composition root
built, the execution gate, the MCP adapter's Lambda client, a cold start. The EMF documents it
printed are put into moto's CloudWatch as CloudWatch's extraction would, the alarm is the
SAM-translated template's (put with ``PutMetricAlarm``, read back with ``DescribeAlarms``) and
its state is CloudWatch's evaluation of that definition against moto's ``GetMetricData``:

- ``AwsAccessDeniedAlarm``: ALARM after one call AWS refused — DynamoDB, KMS, S3, Secrets
  Manager, Step Functions, Lambda, OpenSearch (403) — and OK for the same calls unrefused;
- ``StoreUnavailableAlarm``: OK for faults within one or two minutes, ALARM for three minutes
  of the last five (DynamoDB throttling the reads after the SDK's retries);
- ``JournalCorruptAlarm``: ALARM after one ``get`` of a record whose stored body was altered;
- ``KmsKeyStateRule``: created on moto's EventBridge from the template's pattern, targeting the
  alarm topic with the template's topic policy, an SQS queue subscribed: CloudTrail's
  DisableKey and ScheduleKeyDeletion of either key (by id or ARN) and KMS's CMK Deletion
  arrive; another key, another API, a refused call do not; another rule may not publish.

Not proven here (nothing on this machine runs AWS): CloudWatch Logs' own EMF extraction and
alarm evaluation, EventBridge's own matching and delivery, SNS honouring the topic policy, and
CloudTrail emitting the events (which needs a trail recording management events).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alarm_testing import (
    THROTTLED,
    answering,
    denying,
    emf_documents,
    install_alarm,
    put_emf,
    resolve,
    sns_rule_targets,
    stack_refs,
    template_resource,
)
from aws_testing import (
    ACCOUNT,
    BUCKET,
    REGION,
    TABLE,
    TENANT,
    FakeLambdaContext,
    held_key,
    signed_with_held_key,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from opensearchpy import OpenSearch
from test_fault_metrics import RefusingCluster
from test_tool_handlers import (
    GATE_ENV,
    Cloud,
    capture_event,
    cloud,
    event,
    load_app,
    output,
    remember,
    value_of,
)

from engram_memory.adapters.aws.dynamo_store import DynamoStore, _record_key
from engram_memory.binding.tokens import TokenIssuer
from engram_memory.cloud.composition import build_adapter, build_engine, build_workflow_runs
from engram_memory.cloud.settings import ConfigurationError
from engram_memory.contract.errors import TrustedContextUnavailable
from engram_memory.engine.context import TOOLS, Scope

from engram_testing import WORKSPACE, context

__all__ = ["cloud", "output"]  # the fixtures, from the tool handlers' tests

Lines = Callable[[], list[dict[str, Any]]]
Invoke = Callable[[str, dict[str, Any]], dict[str, Any]]


@dataclass
class Stack:
    """A tenant's functions over moto, and the alarm topic their alarms publish to."""

    cloud: Cloud
    topic: str
    apps: dict[str, Any]

    def invoke(self, tool: str, ev: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.apps[tool].handler(
            signed_with_held_key(ev), FakeLambdaContext.of(f"engram-{TENANT}-{tool}")
        )
        return answer

    def judge(self, alarm_name: str, lines: list[dict[str, Any]], **placed: Any) -> str:
        """The alarm's state once CloudWatch extracted ``lines``' EMF documents: at their own
        time, or each at ``placed["at"][i]``; evaluated at the last document's instant."""
        from alarm_testing import alarm_state

        cloudwatch = self.cloud.session.client("cloudwatch")
        alarm = install_alarm(cloudwatch, alarm_name, stack_refs(AlarmTopic=self.topic))
        assert alarm["AlarmActions"] == [self.topic] == alarm["OKActions"]
        documents = emf_documents(lines)
        instants = placed.get("at") or [
            datetime.fromtimestamp(d["_aws"]["Timestamp"] / 1000, UTC) for d in documents
        ]
        for document, at in zip(documents, instants, strict=False):
            put_emf(cloudwatch, document, at=at)
        now = max(instants, default=datetime.now(UTC))
        return alarm_state(cloudwatch, alarm, now)


@pytest.fixture
def stack(cloud: Cloud) -> Stack:
    """The six tool functions, warm over one engine the composition root built from the
    template's environment (its own session: the one that reports refusals)."""
    engine = build_engine(cloud.env, lexical_index=cloud.index, clock=cloud.clock)
    apps = {tool: load_app(tool) for tool in TOOLS}
    for app in apps.values():
        app.handler.engine = engine
        app.handler.invocation_key = held_key()  # the faults here are the engine's calls'
        app.handler.use_runs(None)
    topic = cloud.session.client("sns").create_topic(Name=f"engram-{TENANT}-alarms")["TopicArn"]
    return Stack(cloud, topic, apps)


# --------------------------------------------------------------------------------------------
# AwsAccessDeniedAlarm
# --------------------------------------------------------------------------------------------


def _dynamodb(stack: Stack) -> dict[str, Any]:
    return stack.invoke("get", event("get"))  # the sample's record: a read either way


def _kms(stack: Stack) -> dict[str, Any]:
    return stack.invoke("capture", event("capture"))


def _seed_a_body_in_s3(stack: Stack) -> str:
    """A record whose sealed body is an S3 object (written by an engine that puts bodies of
    more than 64 bytes in the bucket; the functions read whatever the row points at)."""
    clients = stack.cloud.clients
    store = DynamoStore(
        table_name=TABLE,
        bucket=BUCKET,
        dynamodb=clients["dynamodb"],
        s3=clients["s3"],
        inline_limit_bytes=64,
    )
    seeding = build_engine(
        stack.cloud.env,
        store=store,
        dynamodb_client=clients["dynamodb"],
        kms_client=clients["kms"],
        secrets_client=clients["secretsmanager"],
        lexical_index=stack.cloud.index,
        clock=stack.cloud.clock,
    )
    seeded = load_app("capture"), load_app("request_admission")
    for app in seeded:
        app.handler.engine = seeding
        app.handler.invocation_key = held_key()
    sent = signed_with_held_key(event("capture"))
    captured = value_of("capture", seeded[0].handler(sent, FakeLambdaContext()))
    admitted = seeded[1].handler(
        signed_with_held_key(event("request_admission", candidate_id=captured["candidate_id"])),
        FakeLambdaContext(),
    )
    record_id: str = value_of("request_admission", admitted)["outcome"]["record_id"]
    assert clients["s3"].list_objects_v2(Bucket=BUCKET)["KeyCount"] > 0
    return record_id


def _s3(stack: Stack, record_id: str) -> dict[str, Any]:
    return stack.invoke("get", event("get", record_id=record_id))


def _secrets_manager(stack: Stack) -> None:
    cold = load_app("search")  # a cold start reads the cursor secret
    cold.handler.invocation_key = held_key()
    with pytest.raises(ConfigurationError, match="ENGRAM_CURSOR_SECRET_ARN"):
        cold.handler(signed_with_held_key(event("search")), FakeLambdaContext())


def _step_functions(stack: Stack, candidate_id: str) -> dict[str, Any]:
    withdraw = stack.apps["withdraw"].handler
    withdraw.use_runs(build_workflow_runs("withdraw", {**stack.cloud.env, **GATE_ENV}))
    return stack.invoke("withdraw", event("withdraw", candidate_id=candidate_id))


def _lambda(stack: Stack) -> None:
    secrets = stack.cloud.clients["secretsmanager"]
    state = secrets.create_secret(Name="engram-dev-request-state", SecretString="r" * 64)["ARN"]
    adapter = build_adapter(
        {
            "AWS_REGION": REGION,
            "ENGRAM_TOOL_FUNCTIONS": json.dumps({t: f"engram-{TENANT}-{t}" for t in TOOLS}),
            "ENGRAM_RESOURCE_URI": "https://memory.example.com/mcp",
            "ENGRAM_ISSUER": "https://issuer.example.com",
            "ENGRAM_ALLOWED_ORIGINS": "https://app.example.com",
            "ENGRAM_REQUEST_STATE_SECRET_ARN": state,
            "ENGRAM_TENANT_ID": TENANT,
            "ENGRAM_TABLE": TABLE,
            "ENGRAM_INVOCATION_KEY_ARN": stack.cloud.env["ENGRAM_INVOCATION_KEY_ARN"],
        },
        invocation_key=held_key(),  # the refused call here is the Lambda invoke
        jwks=TokenIssuer(
            Ed25519PrivateKey.generate(),
            issuer="https://issuer.example.com",
            audience="https://memory.example.com/mcp",
            kid="k1",
        ).public_jwks(),
        clock=stack.cloud.clock,
    )
    with pytest.raises(TrustedContextUnavailable):
        adapter.runtime.engine.handle("search", event("search")["arguments"], context())


def _opensearch(stack: Stack) -> dict[str, Any]:
    client = OpenSearch(
        hosts=[{"host": "search-engram.example", "port": 443}],
        connection_class=RefusingCluster,
        max_retries=0,
    )
    engine = build_engine(stack.cloud.env, opensearch_client=client, clock=stack.cloud.clock)
    stack.apps["search"].handler.engine = engine
    return stack.invoke("search", event("search", query="retry budget"))


def _nothing(stack: Stack) -> None:
    return None


def _pending_candidate(stack: Stack) -> str:
    captured = value_of("capture", stack.invoke("capture", capture_event("Draft.", "s" * 16)))
    candidate_id: str = captured["candidate_id"]
    return candidate_id


# service (botocore's id; "opensearch": the index's connection) -> the aws_service label, the
# set-up before the fault, and the call that meets it (its envelope, or None: it raised)
Scenario = tuple[str, Callable[[Stack], Any], Callable[[Stack, Any], dict[str, Any] | None]]
SCENARIOS: dict[str, Scenario] = {
    "dynamodb": ("dynamodb", _nothing, lambda stack, _: _dynamodb(stack)),
    "kms": ("kms", _nothing, lambda stack, _: _kms(stack)),
    "s3": ("s3", _seed_a_body_in_s3, _s3),
    "secrets-manager": ("secretsmanager", _nothing, lambda stack, _: _secrets_manager(stack)),
    "sfn": ("states", _pending_candidate, _step_functions),
    "lambda": ("lambda", _nothing, lambda stack, _: _lambda(stack)),
    "opensearch": ("es", _nothing, lambda stack, _: _opensearch(stack)),
}


@pytest.mark.parametrize("service", sorted(SCENARIOS))
def test_one_call_aws_refuses_raises_the_access_denied_alarm(
    stack: Stack, output: Lines, service: str
) -> None:
    label, set_up, call = SCENARIOS[service]
    prepared = set_up(stack)
    output()  # what the set-up printed is not the fault's

    # OpenSearch is no botocore client: its domain refuses through the index's connection
    with denying(service) if service != "opensearch" else nullcontext():
        answer = call(stack, prepared)
    lines = output()

    if answer is not None:  # the agent sees a retriable failure, never the refusal itself
        assert answer["ok"] is False and answer["error"]["retriable"] is True, answer
    denied = [line for line in lines if line.get("message") == "aws access denied"]
    assert denied and {line["aws_service"] for line in denied} == {label}
    assert stack.judge("AwsAccessDeniedAlarm", lines) == "ALARM"


def test_the_same_calls_unrefused_leave_every_failure_alarm_ok(stack: Stack, output: Lines) -> None:
    _, record_id = remember(stack.invoke, "Pin the base image by digest.", "k" * 16)
    value_of("get", stack.invoke("get", event("get", record_id=record_id)))
    value_of("search", stack.invoke("search", event("search", query="base image")))
    lines = output()

    assert emf_documents(lines, "ToolCalls")  # the calls were counted, as ever
    for alarm in ("AwsAccessDeniedAlarm", "StoreUnavailableAlarm", "JournalCorruptAlarm"):
        assert stack.judge(alarm, lines) == "OK", alarm


# --------------------------------------------------------------------------------------------
# StoreUnavailableAlarm and JournalCorruptAlarm
# --------------------------------------------------------------------------------------------

NOW = datetime(2026, 12, 6, 12, 30, 30, tzinfo=UTC)  # an instant inside the minute 12:30
# When three calls answered STORE_UNAVAILABLE (minutes before the evaluation), and the verdict.
PLACEMENTS = [
    ((0, 0, 0), "OK"),  # one bad minute: a burst the agents retry through
    ((0, 1, 1), "OK"),
    ((0, 2, 4), "ALARM"),  # three of the last five minutes
    ((0, 3, 6), "OK"),  # the third is older than the window
]


def test_store_unavailable_pages_when_three_of_five_minutes_had_it(
    stack: Stack, output: Lines
) -> None:
    _, record_id = remember(stack.invoke, "Rotate the TLS certificate.", "u" * 16)
    output()
    with answering({"dynamodb": THROTTLED}) as answered:
        for _ in range(3):
            answer = stack.invoke("get", event("get", record_id=record_id))
            assert answer["error"]["code"] == "STORE_UNAVAILABLE", answer
    assert len(answered) >= 3 * 3  # the SDK retried each read before giving up
    lines = output()
    assert [d["code"] for d in emf_documents(lines, "StoreFaults")] == ["STORE_UNAVAILABLE"] * 3
    calls = [d for d in emf_documents(lines) if "ColdStart" not in d]  # ToolCalls, StoreFaults
    assert len(calls) == 2 * 3
    # each call's two documents as if it failed at its minute; each placement an hour before
    # the previous one, so their evaluation windows never overlap
    for hours, (minutes_ago, state) in enumerate(PLACEMENTS):
        now = NOW - timedelta(hours=hours)
        at = [now - timedelta(minutes=m) for m in minutes_ago for _ in range(2)]
        assert stack.judge("StoreUnavailableAlarm", calls, at=at) == state, minutes_ago
        assert stack.judge("AwsAccessDeniedAlarm", calls, at=at) == "OK"  # no refusal


def test_one_corrupt_record_raises_the_journal_alarm(stack: Stack, output: Lines) -> None:
    _, record_id = remember(stack.invoke, "Keep the staging database on WAL.", "j" * 16)
    stack.cloud.clients["dynamodb"].update_item(
        TableName=TABLE,
        Key=_record_key(Scope(TENANT, WORKSPACE), record_id),
        UpdateExpression="SET body = :b",
        ExpressionAttributeValues={":b": {"B": b"not a sealed body"}},
    )
    output()

    answer = stack.invoke("get", event("get", record_id=record_id))

    assert answer["error"]["code"] == "JOURNAL_CORRUPT"
    lines = output()
    assert stack.judge("JournalCorruptAlarm", lines) == "ALARM"
    assert stack.judge("StoreUnavailableAlarm", lines) == "OK"


# --------------------------------------------------------------------------------------------
# KmsKeyStateRule
# --------------------------------------------------------------------------------------------


@dataclass
class KeyRule:
    keys: dict[str, dict[str, str]]  # logical id -> {"id", "arn"}
    rule_arn: str
    events: Any
    sqs: Any
    queue: str

    def send(self, detail_type: str, detail: dict[str, Any], resources: list[str]) -> None:
        """An event on the default bus, as CloudTrail or KMS delivers it."""
        (entry,) = self.events.put_events(
            Entries=[
                {
                    "Source": "aws.kms",
                    "DetailType": detail_type,
                    "Detail": json.dumps(detail),
                    "Resources": resources,
                }
            ]
        )["Entries"]
        assert "EventId" in entry, entry

    def arrived(self) -> list[dict[str, Any]]:
        messages = self.sqs.receive_message(QueueUrl=self.queue, MaxNumberOfMessages=10)
        return [json.loads(json.loads(m["Body"])["Message"]) for m in messages.get("Messages", [])]


def cloudtrail(name: str, key: str, arn: str, **extra: Any) -> dict[str, Any]:
    """The ``detail`` of CloudTrail's record of a KMS call, as EventBridge carries it."""
    parameters: dict[str, Any] = {"keyId": key}
    if name == "ScheduleKeyDeletion":
        parameters["pendingWindowInDays"] = 30
    return {
        "eventVersion": "1.08",
        "userIdentity": {
            "type": "AssumedRole",
            "arn": f"arn:aws:sts::{ACCOUNT}:assumed-role/engram-key-admin/alice",
            "accountId": ACCOUNT,
        },
        "eventTime": "2026-12-06T12:00:00Z",
        "eventSource": "kms.amazonaws.com",
        "eventName": name,
        "awsRegion": REGION,
        "sourceIPAddress": "203.0.113.7",
        "requestParameters": parameters,
        "responseElements": None,
        "resources": [{"accountId": ACCOUNT, "type": "AWS::KMS::Key", "ARN": arn}],
        "eventType": "AwsApiCall",
        "managementEvent": True,
        "eventCategory": "Management",
        **extra,
    }


@pytest.fixture
def key_rule(cloud: Cloud) -> Iterator[KeyRule]:
    """The template's rule and topic policy on moto, the stack's two keys, a queue on the
    topic (as an operator's subscription would be)."""
    session = cloud.session
    clients: list[Any] = [session.client(n) for n in ("kms", "sns", "sqs", "events")]
    kms, sns, sqs, events = clients
    keys = {}
    for name in ("EngramTableKey", "EngramDataKey", "OtherKey"):
        made = kms.create_key(Description=name)["KeyMetadata"]
        keys[name] = {"id": made["KeyId"], "arn": made["Arn"]}
    topic = sns.create_topic(Name=f"engram-{TENANT}-alarms")["TopicArn"]
    queue = sqs.create_queue(QueueName="operator")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn["Attributes"]["QueueArn"])
    refs = stack_refs(
        AlarmTopic=topic,
        **{name: key["id"] for name, key in keys.items()},
        **{f"{name}.Arn": key["arn"] for name, key in keys.items()},
    )
    rule = resolve(template_resource("KmsKeyStateRule")["Properties"], refs)
    rule_arn = events.put_rule(
        Name=rule["Name"],
        EventPattern=json.dumps(rule["EventPattern"]),
        State=rule["State"],
        Description=rule["Description"],
    )["RuleArn"]
    events.put_targets(Rule=rule["Name"], Targets=rule["Targets"])
    policy = resolve(
        template_resource("AlarmTopicPolicy")["Properties"],
        {**refs, "KmsKeyStateRule.Arn": rule_arn},
    )
    assert policy["Topics"] == [topic]
    sns.set_topic_attributes(
        TopicArn=topic, AttributeName="Policy", AttributeValue=json.dumps(policy["PolicyDocument"])
    )
    with sns_rule_targets() as refused:
        made_rule = KeyRule(keys, rule_arn, events, sqs, queue)
        yield made_rule
    assert refused == []


@pytest.mark.parametrize("key", ["EngramTableKey", "EngramDataKey"])
@pytest.mark.parametrize("name", ["DisableKey", "ScheduleKeyDeletion"])
@pytest.mark.parametrize("given", ["id", "arn"])
def test_disabling_or_scheduling_the_deletion_of_a_stack_key_reaches_the_alarm_topic(
    key_rule: KeyRule, key: str, name: str, given: str
) -> None:
    arn = key_rule.keys[key]["arn"]
    key_rule.send(
        "AWS API Call via CloudTrail", cloudtrail(name, key_rule.keys[key][given], arn), []
    )

    (delivered,) = key_rule.arrived()
    assert delivered["detail"]["eventName"] == name
    assert delivered["detail"]["userIdentity"]["arn"].endswith("engram-key-admin/alice")


def test_the_deletion_kms_reports_itself_reaches_the_alarm_topic(key_rule: KeyRule) -> None:
    data_key = key_rule.keys["EngramDataKey"]
    key_rule.send("KMS CMK Deletion", {"key-id": data_key["id"]}, [data_key["arn"]])

    (delivered,) = key_rule.arrived()
    assert delivered["detail-type"] == "KMS CMK Deletion"
    assert delivered["resources"] == [data_key["arn"]]


def test_another_key_another_call_or_a_refused_call_does_not_reach_it(key_rule: KeyRule) -> None:
    other, table = key_rule.keys["OtherKey"], key_rule.keys["EngramTableKey"]
    key_rule.send(
        "AWS API Call via CloudTrail", cloudtrail("DisableKey", other["arn"], other["arn"]), []
    )
    key_rule.send("KMS CMK Deletion", {"key-id": other["id"]}, [other["arn"]])
    for name in ("EnableKey", "CancelKeyDeletion", "Decrypt"):
        key_rule.send(
            "AWS API Call via CloudTrail", cloudtrail(name, table["arn"], table["arn"]), []
        )
    refused = cloudtrail("DisableKey", table["arn"], table["arn"], errorCode="AccessDenied")
    key_rule.send("AWS API Call via CloudTrail", refused, [])

    assert key_rule.arrived() == []


def test_only_the_stacks_rule_may_publish_to_its_topic(key_rule: KeyRule) -> None:
    table = key_rule.keys["EngramTableKey"]
    pattern = key_rule.events.describe_rule(Name=f"engram-{TENANT}-kms-key-state")["EventPattern"]
    key_rule.events.put_rule(Name="someone-elses-rule", EventPattern=pattern)
    (target,) = key_rule.events.list_targets_by_rule(Rule=f"engram-{TENANT}-kms-key-state")[
        "Targets"
    ]
    key_rule.events.put_targets(Rule="someone-elses-rule", Targets=[target])
    with sns_rule_targets() as refused:
        key_rule.send(
            "AWS API Call via CloudTrail", cloudtrail("DisableKey", table["id"], table["arn"]), []
        )
    assert [r["rule"].rsplit("/", 1)[1] for r in refused] == ["someone-elses-rule"]
    assert len(key_rule.arrived()) == 1  # the stack's own rule's delivery

"""``engram-memory admin --stack NAME ...`` against stacks created from template.yaml in moto's
CloudFormation (issues 12 and 25).

Each stack is the SAM-translated template.yaml (``scripts/cloud_template.translate``, as ``sam
deploy`` hands it over) created by moto's CloudFormation (``aws_testing.create_template_stack``),
less the resources moto cannot create and whatever refers to them; a test lists exactly which,
and proves that every resource the operator's plane reads is the template's, unchanged. The
functions' side is the engine the functions build (``build_engine``) from the stack's outputs,
with an in-memory OpenSearch stand-in; the outbox drainer is the real ``DrainerHandler``,
invoked in process where the CLI would invoke the Lambda (moto cannot run Lambda code without
Docker).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import boto3
import pytest
from aws_testing import (
    REGION,
    STACK_PARAMETERS,
    FakeLambdaContext,
    MemoryLexicalIndex,
    create_template_stack,
    decided,
    moto_aws,
    moto_template,
)

from engram_memory.adapters.local.audit import MemoryAuditLog
from engram_memory.cloud import operator_session
from engram_memory.cloud.composition import AwsClients, build_engine
from engram_memory.cloud.drainer import DrainerHandler
from engram_memory.cloud.operator_session import DRAINER_RESOURCE, REQUIRED_OUTPUTS, resolve_stack
from engram_memory.cloud.settings import HostBinding
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.service import Engine
from engram_memory.entry import main
from scripts.cloud_template import references

from engram_testing import capture_args, context

TENANT = STACK_PARAMETERS["TenantId"]
WORKSPACE = "ws-research-0001"
PURPOSE = "purpose:general"
OTHER_REGION = "eu-west-1"  # a restore target: the tenant's stack in another region
OPERATOR = "operator:arn:aws:sts::123456789012:user/moto"  # moto's caller identity
Capture = pytest.CaptureFixture[str]


def agent(**overrides: Any) -> TrustedContext:
    """An agent's context in the stack's tenant (what the MCP adapter derives from a token)."""
    return context(tenant=TENANT, workspace=WORKSPACE, purpose=PURPOSE, **overrides)


@dataclass
class Stack:
    """One deployed stack: the functions' engine and index, and the CLI against it."""

    name: str
    session: boto3.session.Session
    index: MemoryLexicalIndex = field(default_factory=MemoryLexicalIndex)
    agent_audit: MemoryAuditLog = field(default_factory=MemoryAuditLog)
    _engine: Engine | None = None

    @property
    def env(self) -> dict[str, str]:
        return resolve_stack(AwsClients.of(self.session), self.name).environment()

    def engine(self) -> Engine:
        """The engine the stack's functions build."""
        if self._engine is None:
            self._engine = build_engine(
                self.env, session=self.session, lexical_index=self.index, audit=self.agent_audit
            )
        return self._engine

    def drainer(self, event: dict[str, Any]) -> dict[str, Any]:
        handler = DrainerHandler()
        handler.engine, handler.binding = self.engine(), HostBinding(TENANT)
        answer: dict[str, Any] = handler(event, FakeLambdaContext(remaining_ms=5_000))
        return answer

    def call(self, tool: str, arguments: dict[str, Any], **ctx: Any) -> dict[str, Any]:
        answer = self.engine().handle(tool, arguments, agent(**ctx))
        assert isinstance(answer, dict)
        return answer

    def remember(self, text: str, key: str, *, admit: bool = True) -> dict[str, str]:
        key = f"idempotency-{key}"  # keys are at least 16 characters
        captured = self.call("capture", capture_args(text, key=key))
        assert captured["ok"], captured
        ids = {"candidate_id": captured["output"]["value"]["candidate_id"]}
        if admit:
            admitted = self.call(
                "request_admission",
                {"candidate_id": ids["candidate_id"], "idempotency_key": f"admit-{key}"},
            )
            ids["record_id"] = admitted["output"]["value"]["outcome"]["record_id"]
        return ids

    def search(self, query: str) -> list[str]:
        found = self.call("search", {"query": query, "purpose_ref": PURPOSE})
        assert found["ok"], found
        return [hit["record"]["record_id"] for hit in found["output"]["value"]["records"]]

    @staticmethod
    def engine_scope() -> Scope:
        return Scope(TENANT, WORKSPACE)

    def audit_lines(self) -> list[dict[str, Any]]:
        logs = self.session.client("logs")
        group = resolve_stack(AwsClients.of(self.session), self.name).audit_log_group
        events = logs.filter_log_events(logGroupName=group).get("events", [])
        return [json.loads(event["message"]) for event in events]

    def items(self) -> list[dict[str, Any]]:
        table = resolve_stack(AwsClients.of(self.session), self.name).table
        items: list[dict[str, Any]] = self.session.client("dynamodb").scan(TableName=table)["Items"]
        return items


@dataclass
class Stacks:
    session: boto3.session.Session
    capsys: Capture
    made: dict[str, Stack] = field(default_factory=dict)

    def create(self, name: str, region: str = REGION, **given: str) -> Stack:
        """A stack from template.yaml (parameters ``given`` beside STACK_PARAMETERS). One
        tenant's stack per region: its resources have fixed names (functions, log groups, key
        aliases), so a second one goes to another region."""
        session = boto3.session.Session(region_name=region)
        create_template_stack(session, name, **given)
        stack = self.made[name] = Stack(name, session)
        # as the template sets it (moto's CloudFormation ignores the table's PITR property)
        session.client("dynamodb").update_continuous_backups(
            TableName=resolve_stack(AwsClients.of(session), name).table,
            PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
        )
        return stack

    _target: str = ""

    def invoker(self, session: Any, function_name: str) -> Any:
        """``lambda_invoker`` for the stack the CLI runs against: its drainer, in process."""
        assert function_name == f"engram-{TENANT}-outbox-drainer"
        target = self.made[self._target]
        return lambda event: target.drainer(dict(event))

    def admin(self, stack: Stack, *args: str) -> tuple[int, Any, str]:
        """Run ``engram-memory admin --stack`` on ``stack``: exit code, JSON output, stderr."""
        self.capsys.readouterr()
        self._target = stack.name
        region = str(stack.session.region_name)
        code = main(["admin", "--stack", stack.name, "--region", region, *args, "--json"])
        out, err = self.capsys.readouterr()
        # the in-process drainer's log and metric lines (the Lambda's log group's, in AWS)
        out = "".join(
            line
            for line in out.splitlines(keepends=True)
            if not line.startswith(('{"level":', '{"_aws":'))
        )
        try:
            return code, json.loads(out), err
        except ValueError:  # JSON Lines (export), or nothing
            return code, out, err


@pytest.fixture
def stacks(monkeypatch: pytest.MonkeyPatch, capsys: Capture) -> Iterator[Stacks]:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_aws():
        made = Stacks(boto3.session.Session(region_name=REGION), capsys)
        # the CLI invokes the drainer Lambda; here its handler runs in process
        monkeypatch.setattr(operator_session, "lambda_invoker", made.invoker)
        yield made


# moto's CloudFormation (moto 5) has no such types: these resources of the template are left out
MOTO_LACKS: Final = {
    "AWS::ApiGatewayV2::Api": "the HTTP API",
    "AWS::ApiGatewayV2::Stage": "its stage",
    "AWS::CloudWatch::Alarm": "every alarm",
    "AWS::CodeDeploy::Application": "the application of the gradual deployments",
    "AWS::CodeDeploy::DeploymentGroup": "each gradual function's deployment group",
    "AWS::Lambda::Alias": "each gradual function's live alias (its version is created)",
    "AWS::S3::BucketPolicy": "the blob bucket's TLS-only policy",
    "AWS::SecretsManager::ResourcePolicy": "the secrets' resource policies",
    "AWS::SecretsManager::RotationSchedule": "the secrets' rotation",
    "AWS::SNS::TopicPolicy": "the alarm topic's policy",
    # its function is created; tests/integration/test_opensearch_security_resource.py drives it
    "Custom::OpenSearchSecurityConfig": "the shared domain's role mapping",
}
# ... and with them what names the HTTP API: its routes' invoke permissions and the dashboard
REFERS_TO_THE_API: Final = {
    "Dashboard",
    "McpAdapterFunctionMcpPermission",
    "McpAdapterFunctionMcpGetPermission",
    "McpAdapterFunctionMcpDeletePermission",
    "McpAdapterFunctionProtectedResourceMetadataPermission",
    "McpAdapterFunctionProtectedResourceMetadataMcpPermission",
    "ApprovalFunctionApprovalPagePermission",
    "ApprovalFunctionApprovalSignInCallbackPermission",
    "ApprovalFunctionApprovalAnswerPermission",
}


def test_the_stack_is_the_translated_template_less_exactly_what_moto_cannot_create() -> None:
    template = moto_template(**STACK_PARAMETERS)
    lacking = {n for n, why in template.removed.items() if not why.startswith("refers to ")}
    assert {template.deployed[n]["Type"] for n in lacking} == set(MOTO_LACKS)
    alarms = {n for n, r in template.deployed.items() if r["Type"] == "AWS::CloudWatch::Alarm"}
    assert len(alarms) >= 20, alarms
    gradual = {
        n
        for n, r in template.deployed.items()
        if r["Type"].startswith("AWS::CodeDeploy::") or r["Type"] == "AWS::Lambda::Alias"
    }
    assert len(gradual) == 1 + 2 * 7  # the application; the adapter's and six tools' group, alias
    assert lacking == alarms | gradual | {
        "HttpApi",
        "HttpApiApiGatewayDefaultStage",
        "EngramBlobBucketPolicy",
        "RequestStateSecretRotation",
        "ApprovalSessionSecretRotation",
        "CursorSecretRotation",
        "RequestStateSecretPolicy",
        "ApprovalSessionSecretPolicy",
        "CursorSecretPolicy",
        "AlarmTopicPolicy",
        "OpenSearchSecurityConfig",
    }
    assert {n: why for n, why in template.removed.items() if n not in lacking} == {
        name: "refers to HttpApi" for name in REFERS_TO_THE_API
    }
    assert template.removed_outputs == {"McpUrl", "ProtectedResourceMetadataUrl", "DashboardName"}
    # everything else is created as the translated template has it
    kept = template.body["Resources"]
    assert set(kept) == set(template.deployed) - set(template.removed)
    assert all(body == decided(template.deployed[name]) for name, body in kept.items())
    assert len(kept) > 60, len(kept)


def test_what_the_operator_plane_reads_is_the_templates_unchanged() -> None:
    template = moto_template(**STACK_PARAMETERS)
    read = {DRAINER_RESOURCE}
    for name in REQUIRED_OUTPUTS:
        assert template.body["Outputs"][name] == decided(template.outputs[name]), name
        read |= references(template.outputs[name]) & set(template.deployed)
    assert read == {
        "EngramTable",
        "EngramKeyTable",
        "EngramBlobBucket",
        "EngramDataKey",
        "CursorSecret",
        "OperatorAuditLogGroup",
        DRAINER_RESOURCE,
    }
    for name in read:
        assert template.body["Resources"][name] == decided(template.deployed[name]), name
    # the name the CLI invokes (a stack whose resources CloudFormation cannot list)
    drainer = template.body["Resources"][DRAINER_RESOURCE]["Properties"]["FunctionName"]
    assert drainer == {"Fn::Sub": "engram-${TenantId}-outbox-drainer"}


def test_moto_creates_every_kept_resource_and_the_cli_resolves_them(stacks: Stacks) -> None:
    stack = stacks.create("engram-dev")
    cloudformation = stack.session.client("cloudformation")
    summaries = cloudformation.list_stack_resources(StackName=stack.name)["StackResourceSummaries"]
    kept = moto_template(**STACK_PARAMETERS).body["Resources"]
    assert {s["LogicalResourceId"] for s in summaries} == set(kept)
    assert {s["ResourceStatus"] for s in summaries} == {"CREATE_COMPLETE"}
    resolved = resolve_stack(AwsClients.of(stack.session), stack.name)
    assert resolved.tenant_id == TENANT
    assert resolved.drainer_function == f"engram-{TENANT}-outbox-drainer"
    assert stack.session.client("lambda").get_function(FunctionName=resolved.drainer_function)
    secrets = stack.session.client("secretsmanager")
    cursor_key = secrets.get_secret_value(SecretId=resolved.cursor_secret_arn)["SecretString"]
    assert len(cursor_key) == 64 and cursor_key.isalnum()  # GenerateSecretString's
    tables = stack.session.client("dynamodb")
    keys = tables.describe_table(TableName=resolved.key_table)["Table"]["KeySchema"]
    assert keys == [{"AttributeName": "key_ref", "KeyType": "HASH"}]


def test_a_stack_in_a_vpc_is_created_whole_and_operated(stacks: Stacks) -> None:
    ec2 = stacks.session.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{z}")
        for i, z in enumerate("abc")
    ]
    given = {
        "VpcId": vpc,
        "VpcSubnetIds": ",".join(s["Subnet"]["SubnetId"] for s in subnets),
        "VpcRouteTableIds": ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"],
        "OpenSearchProfile": "production",
    }
    # moto creates every network resource: nothing more is left out than without a VPC
    in_vpc = moto_template(**STACK_PARAMETERS, **given)
    assert in_vpc.removed.keys() == moto_template(**STACK_PARAMETERS).removed.keys()
    stack = stacks.create("engram-dev", **given)
    search = stack.session.client("lambda").get_function(FunctionName=f"engram-{TENANT}-search")
    assert search["Configuration"]["VpcConfig"]["SubnetIds"] == given["VpcSubnetIds"].split(",")
    endpoints = {
        e["ServiceName"].rsplit(".", 1)[1] for e in ec2.describe_vpc_endpoints()["VpcEndpoints"]
    }
    # STS: the shared domain's security configuration assumes its owner's role
    assert endpoints == {"dynamodb", "s3", "kms", "secretsmanager", "sts", "xray"}
    stack.remember("A stack in a VPC is operated the same way.", "vpc-000001")
    code, status, _ = stacks.admin(stack, "status", "--workspace", WORKSPACE)
    assert code == 0 and status["records"] == {"accepted_current": 1}, status


def test_an_unknown_stack_is_one_line_and_exit_1(stacks: Stacks) -> None:
    stacks.capsys.readouterr()
    code = main(["admin", "--stack", "no-such-stack", "--region", REGION, "status"])
    err = stacks.capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "no-such-stack" in err[0], err


def test_the_operations_run_on_the_stack_audited_as_the_callers_arn(stacks: Stacks) -> None:
    stack = stacks.create("engram-dev")
    text = "The stack's operator reads pending candidates with a KMS-wrapped key."
    pending = stack.remember(text, "op-key-000001", admit=False)
    kept = stack.remember("Readers never block the writer in WAL mode.", "op-key-000002")

    code, listed, _ = stacks.admin(stack, "pending", "list", "--workspace", WORKSPACE)
    assert code == 0 and [c["candidate_id"] for c in listed] == [pending["candidate_id"]]
    code, shown, _ = stacks.admin(
        stack, "pending", "show", pending["candidate_id"], "--workspace", WORKSPACE
    )
    assert code == 0 and text in json.dumps(shown["record"])
    code, decided, _ = stacks.admin(
        stack,
        "adjudicate",
        pending["candidate_id"],
        "accept",
        "--reason",
        "reviewed",
        "--workspace",
        WORKSPACE,
    )
    assert code == 0 and decided["status"] == "accepted", decided
    adjudicated = decided["record_id"]
    # the operator's engine never writes OpenSearch: the drainer projected the record
    assert stack.index.contains(stack.engine_scope(), adjudicated)
    assert adjudicated in stack.search("operator pending candidates KMS")

    code, records, _ = stacks.admin(stack, "records", "list", "--workspace", WORKSPACE)
    assert code == 0 and {r["record_id"] for r in records} == {adjudicated, kept["record_id"]}
    code, shown, _ = stacks.admin(stack, "records", "show", adjudicated, "--workspace", WORKSPACE)
    assert code == 0 and shown["state"] == "accepted_current"
    code, history, _ = stacks.admin(
        stack, "records", "history", adjudicated, "--workspace", WORKSPACE
    )
    assert code == 0 and [e["operation"] for e in history][:2] == ["capture", "admit"]

    code, disputed, _ = stacks.admin(
        stack, "records", "dispute", adjudicated, "--reason", "contested", "--workspace", WORKSPACE
    )
    assert code == 0 and disputed["receipt"]["to_state"] == "accepted_disputed"
    assert adjudicated not in stack.search("operator pending candidates KMS")
    assert not stack.index.contains(stack.engine_scope(), adjudicated)
    code, resolved, _ = stacks.admin(
        stack, "records", "resolve", adjudicated, "--reason", "settled", "--workspace", WORKSPACE
    )
    assert code == 0 and resolved["receipt"]["to_state"] == "accepted_current"
    assert adjudicated in stack.search("operator pending candidates KMS")

    code, status, _ = stacks.admin(stack, "status", "--workspace", WORKSPACE)
    assert code == 0 and status["records"] == {"accepted_current": 2}
    assert status["index"]["reachable"] is False and status["key_store"]["health"] == "ok"
    code, exported, _ = stacks.admin(stack, "export", "--workspace", WORKSPACE)
    assert code == 0 and len(exported.strip().splitlines()) == 2

    code, _, err = stacks.admin(
        stack, "adjudicate", "candidate_unknown", "reject", "--workspace", WORKSPACE
    )
    assert code == 1 and "NOT_FOUND" in err

    lines = stack.audit_lines()
    tools = [line["tool"] for line in lines]
    for tool in (
        "admin.pending_list",
        "admin.pending_show",
        "admin.adjudicate",
        "admin.records_list",
        "admin.records_show",
        "admin.dispute",
        "admin.resolve",
        "admin.status",
        "admin.export",
    ):
        assert tool in tools, tools
    assert {line["principal"] for line in lines} == {OPERATOR}
    assert {"NOT_FOUND", "OK"} <= {line["code"] for line in lines}
    assert "KMS-wrapped" not in json.dumps(lines)  # never content


def test_forget_and_withdraw_on_the_stack_leave_receipts_and_shred(stacks: Stacks) -> None:
    stack = stacks.create("engram-dev")
    record = stack.remember("Forget me from the stack: a secret plan.", "forget-key-000001")
    draft = stack.remember("A draft the operator withdraws.", "forget-key-000002", admit=False)
    assert record["record_id"] in stack.search("secret plan stack")

    code, forgotten, _ = stacks.admin(
        stack, "records", "forget", record["record_id"], "--reason", "erasure request",
        "--workspace", WORKSPACE,
    )  # fmt: skip
    assert code == 0, forgotten
    assert forgotten["receipt"]["from_state"] == "accepted_current"
    assert forgotten["receipt"]["to_state"] == "tombstoned"
    got = stack.call("get", {"record_id": record["record_id"], "purpose_ref": PURPOSE})
    assert got["error"]["code"] == "NOT_FOUND"
    assert not stack.index.contains(stack.engine_scope(), record["record_id"])
    assert "secret plan" not in json.dumps(stack.items(), default=str)

    code, withdrawn, _ = stacks.admin(
        stack, "pending", "withdraw", draft["candidate_id"], "--reason", "not wanted",
        "--workspace", WORKSPACE,
    )  # fmt: skip
    assert code == 0 and withdrawn["receipt"]["to_state"] == "withdrawn", withdrawn
    candidate = stack.engine().store.candidate_get(stack.engine_scope(), draft["candidate_id"])
    assert candidate is not None and not stack.engine().vault.key_exists(candidate.key_ref)
    assert {line["tool"] for line in stack.audit_lines()} >= {"admin.forget", "admin.withdraw"}

    # the history says who and why, though DynamoDB's ledger cannot say which call wrote a step
    for target, reason in (
        (record["record_id"], "erasure request"),
        (draft["candidate_id"], "not wanted"),
    ):
        code, history, _ = stacks.admin(
            stack, "records", "history", target, "--workspace", WORKSPACE
        )
        assert code == 0, history
        step = history[-1]
        assert (step["reason"], step["approved_by"]) == (reason, None)
        assert step["actor"].startswith("operator:arn:aws:")


def test_backup_and_restore_through_a_dynamodb_export(stacks: Stacks) -> None:
    source = stacks.create("engram-dev")
    first = source.remember("Backups are DynamoDB exports of the canonical table.", "bk-000001")
    second = source.remember("Projections are rebuilt after a restore.", "bk-000002")
    pending = source.remember("A pending candidate rides along.", "bk-000003", admit=False)

    code, backup, _ = stacks.admin(source, "backup")
    assert code == 0, backup
    assert backup["records"] == 2 and backup["keys_included"] is False
    assert backup["journal_heads"] == {f"{TENANT}/{WORKSPACE}": 5}
    location = backup["backup"]
    assert location.startswith("s3://")

    target = stacks.create("engram-new", OTHER_REGION)
    code, _, err = stacks.admin(target, "restore", location)
    assert code == 1 and "RESTORE_REFUSED" in err and "--new-keys" in err
    assert target.items() == []  # refused before anything was written
    code, restored, _ = stacks.admin(target, "restore", location, "--new-keys")
    assert code == 0, restored
    assert isinstance(restored, dict), restored
    assert restored["journal_heads"] == backup["journal_heads"]
    # sealed bodies: on another stack's keys the journal and the records' digests come back,
    # but no body opens (keys are never in a backup), so nothing is projected or found
    assert restored["records_without_key"] == 2 and restored["projected"] == 0
    assert restored["pending_candidates_without_key"] == 1
    assert target.search("DynamoDB exports canonical table") == []
    code, _, err = stacks.admin(target, "restore", location, "--new-keys")
    assert code == 1 and "RESTORE_REFUSED" in err and "already holds memories" in err

    # the source's own table lost: restored onto its own key store, the candidate opens again
    dynamodb = source.session.client("dynamodb")
    table = resolve_stack(AwsClients.of(source.session), source.name).table
    for item in source.items():
        dynamodb.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})
    code, again, _ = stacks.admin(source, "restore", location)
    assert code == 0 and again["new_key_store"] is False, again
    assert again["pending_candidates_without_key"] == 0 and again["projected"] == 2
    assert first["record_id"] in source.search("DynamoDB exports canonical table")
    assert second["record_id"] in source.search("projections rebuilt restore")
    code, shown, _ = stacks.admin(
        source, "pending", "show", pending["candidate_id"], "--workspace", WORKSPACE
    )
    assert code == 0 and "rides along" in json.dumps(shown["record"])
    audited = {(line["tool"], line["code"]) for line in target.audit_lines()}
    assert {("admin.restore", "RESTORE_REFUSED"), ("admin.restore", "OK")} <= audited


def test_a_tampered_backup_is_backup_invalid_and_writes_nothing(stacks: Stacks) -> None:
    source = stacks.create("engram-dev")
    source.remember("The hash chain guards every backup.", "tamper-000001")
    code, backup, _ = stacks.admin(source, "backup")
    assert code == 0, backup
    bucket, _, prefix = backup["backup"].removeprefix("s3://").partition("/")
    s3 = source.session.client("s3")
    manifest = json.loads(
        s3.get_object(Bucket=bucket, Key=f"{prefix}/engram-backup.json")["Body"].read()
    )
    (data_file,) = manifest["data_files"]
    lines = gzip.decompress(s3.get_object(Bucket=bucket, Key=data_file)["Body"].read()).decode()
    tampered = []
    for line in lines.splitlines():
        item = json.loads(line)
        if item["Item"]["kind"]["S"] == "event" and item["Item"]["cursor"]["N"] == "1":
            item["Item"]["event_hash"]["S"] = "sha256:" + "0" * 64
        tampered.append(json.dumps(item))
    s3.put_object(Bucket=bucket, Key=data_file, Body=gzip.compress("\n".join(tampered).encode()))

    target = stacks.create("engram-new", OTHER_REGION)
    code, _, err = stacks.admin(target, "restore", backup["backup"], "--new-keys")
    assert code == 1 and "BACKUP_INVALID" in err and "JOURNAL_CORRUPT" in err, err
    assert target.items() == []
    code, _, err = stacks.admin(target, "restore", f"s3://{bucket}/nothing-here", "--new-keys")
    assert code == 1 and "BACKUP_INVALID" in err


def test_a_revoked_token_answers_authorization_revoked_from_the_functions(stacks: Stacks) -> None:
    stack = stacks.create("engram-dev")
    stack.remember("Revocation reaches every tool function.", "revoke-000001")
    issued = {"credential_id": "jti-revoked-1", "credential_issued_at_ms": 1_000}
    assert stack.call("search", {"query": "revocation", "purpose_ref": PURPOSE}, **issued)["ok"]

    code, revoked, err = stacks.admin(stack, "tokens", "revoke", "--token-id", "jti-revoked-1")
    assert code == 0, err
    assert revoked["revoked"] == "token" and revoked["token"] == "jti-revoked-1"
    fresh = build_engine(stack.env, session=stack.session, lexical_index=stack.index)
    answer = fresh.handle(
        "search", {"query": "revocation", "purpose_ref": PURPOSE}, agent(**issued)
    )
    assert isinstance(answer, dict) and answer["error"]["code"] == "AUTHORIZATION_REVOKED"
    other = {"credential_id": "jti-other", "credential_issued_at_ms": 1_000}
    assert stack.call("search", {"query": "revocation", "purpose_ref": PURPOSE}, **other)["ok"]
    assert ("admin.revoke", "OK") in {(e["tool"], e["code"]) for e in stack.audit_lines()}


def test_keys_rotate_on_the_stack_rotates_the_data_key_and_old_keys_still_open(
    stacks: Stacks,
) -> None:
    stack = stacks.create("engram-dev")
    pending = stack.remember("Sealed before the rotation.", "rotate-000001", admit=False)
    code, rotated, _ = stacks.admin(stack, "keys", "rotate")
    assert code == 0, rotated
    assert rotated["data_key"] == stack.env["ENGRAM_DATA_KEY_ARN"]
    assert rotated["rotated"] == "on_demand" and rotated["automatic_rotation"] is True
    kms = stack.session.client("kms")
    rotations = kms.list_key_rotations(KeyId=rotated["data_key"])["Rotations"]
    assert [r["RotationType"] for r in rotations] == ["ON_DEMAND"]
    code, shown, _ = stacks.admin(
        stack, "pending", "show", pending["candidate_id"], "--workspace", WORKSPACE
    )
    assert code == 0 and "before the rotation" in json.dumps(shown["record"])


@pytest.mark.parametrize("command", [["audit"], ["policy", "show"]])
def test_embedded_only_commands_say_where_the_cloud_keeps_them(
    stacks: Stacks, command: list[str]
) -> None:
    stacks.capsys.readouterr()
    assert main(["admin", "--stack", "engram-dev", *command]) == 2
    assert "with --stack" in stacks.capsys.readouterr().err


def test_a_record_forgotten_after_a_backup_is_unreadable_and_unsearchable_after_restore(
    stacks: Stacks,
) -> None:
    """Issue 12's Done-when, on the cloud stack: back up (a DynamoDB export), forget, restore
    the backup: the forgotten record's body is sealed under a key that forget destroyed."""
    stack = stacks.create("engram-dev")
    secret = "Forgotten-after-backup: the vault combination is 7-3-9."
    forgotten = stack.remember(secret, "doneb-000001")["record_id"]
    kept = stack.remember("Kept after restore: WAL lets readers run.", "doneb-000002")["record_id"]
    code, backup, _ = stacks.admin(stack, "backup")
    assert code == 0, backup
    code, _, err = stacks.admin(
        stack, "records", "forget", forgotten, "--reason", "erasure", "--workspace", WORKSPACE
    )
    assert code == 0, err

    dynamodb = stack.session.client("dynamodb")
    table = resolve_stack(AwsClients.of(stack.session), stack.name).table
    for item in stack.items():  # the table lost; the key table (never backed up) kept
        dynamodb.delete_item(TableName=table, Key={"pk": item["pk"], "sk": item["sk"]})
    stack.index._docs.clear()  # the OpenSearch domain lost too
    code, restored, err = stacks.admin(stack, "restore", backup["backup"])
    assert code == 0, err
    assert restored["records"] == 2 and restored["records_without_key"] == 1
    assert restored["projected"] == 1

    assert kept in stack.search("WAL readers run")
    assert forgotten not in stack.search("vault combination forgotten backup")
    assert not stack.index.contains(stack.engine_scope(), forgotten)
    got = stack.call("get", {"record_id": forgotten, "purpose_ref": PURPOSE})
    assert got["ok"] is False, got
    code, shown, _ = stacks.admin(stack, "records", "show", forgotten, "--workspace", WORKSPACE)
    assert code == 1 or shown.get("record") is None, shown
    # present in no file: not in the export's data files, the restored table or the bucket
    s3 = stack.session.client("s3")
    bucket = resolve_stack(AwsClients.of(stack.session), stack.name).blob_bucket
    for listed in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        data = s3.get_object(Bucket=bucket, Key=listed["Key"])["Body"].read()
        if listed["Key"].endswith(".gz"):
            data = gzip.decompress(data)
        assert b"vault combination" not in data, listed["Key"]
    assert "vault combination" not in json.dumps(stack.items(), default=str)


def test_import_on_the_stack_admits_each_item_and_a_rerun_adds_nothing(
    stacks: Stacks, tmp_path: Path
) -> None:
    stack = stacks.create("engram-dev")
    source = tmp_path / "memory.jsonl"
    graph = [
        {"type": "entity", "name": "Stack", "entityType": "service",
         "observations": ["Imported entities are searchable on the stack"]},
        {"type": "relation", "from": "Stack", "to": "Drainer", "relationType": "invokes"},
    ]  # fmt: skip
    source.write_text("".join(json.dumps(line) + "\n" for line in graph), encoding="utf-8")
    argv = (
        "import", str(source), "--format", "mcp-memory", "--principal", "importer",
        "--purpose", PURPOSE, "--workspace", WORKSPACE,
    )  # fmt: skip
    code, dry, err = stacks.admin(stack, *argv, "--dry-run")
    assert code == 0 and dry["accepted"] == 2, err
    code, done, err = stacks.admin(stack, *argv)
    assert code == 0 and done["accepted"] == 2, err
    assert stack.search("imported entities searchable")
    code, again, err = stacks.admin(stack, *argv)
    assert code == 0 and again["already_imported"] == 2, err
    assert "admin.import" in {line["tool"] for line in stack.audit_lines()}

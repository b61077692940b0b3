"""``engram-memory admin --stack NAME smoke``: what it reads from the stack (CloudFormation's
``McpUrl`` output and function log groups, CloudWatch Logs' ``REPORT`` lines) and how it refuses
when misconfigured, on moto. The whole command, through the API to the built functions with a
person approving on the page, runs in the cloud gate (``scripts/cloud_run/operator_smoke.py``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from aws_testing import REGION, create_template_stack, moto_aws

from engram_memory.cloud.composition import AwsClients
from engram_memory.cloud.operator_session import StackError
from engram_memory.cloud.smoke import read_reports, smoke_target
from engram_memory.entry import main

MCP_URL = "https://abcd1234.execute-api.us-east-1.amazonaws.com/mcp"
FUNCTIONS = ("engram-dev-mcp-adapter", "engram-dev-search", "engram-dev-forget")
# a stand-in agent token: the command must never echo it
TOKEN = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhZ2VudC1hbGljZSJ9.c2lnbmF0dXJlLW5ldmVyLXByaW50ZWQ"


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[boto3.session.Session]:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "ENGRAM_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with moto_aws():
        yield boto3.session.Session(region_name=REGION)


def small_stack(session: boto3.session.Session, name: str, *, mcp_url: bool = True) -> None:
    """A stack holding the functions' log groups and the operator's, with the McpUrl output."""
    groups = {
        f"Group{i}": {"Type": "AWS::Logs::LogGroup", "Properties": {"LogGroupName": group}}
        for i, group in enumerate(
            [*(f"/aws/lambda/{function}" for function in FUNCTIONS), "/engram/dev/operator-audit"]
        )
    }
    body = {
        "Parameters": {"TenantId": {"Type": "String"}},
        "Resources": groups,
        "Outputs": {"McpUrl": {"Value": MCP_URL}} if mcp_url else {},
    }
    session.client("cloudformation").create_stack(
        StackName=name,
        TemplateBody=json.dumps(body),
        Parameters=[{"ParameterKey": "TenantId", "ParameterValue": "dev"}],
    )


def test_the_smoke_calls_the_mcp_url_output_and_reads_the_functions_log_groups(
    session: boto3.session.Session,
) -> None:
    small_stack(session, "engram-memory-dev")
    clients = AwsClients.of(session)

    target = smoke_target(clients, "engram-memory-dev", None)

    assert target.endpoint == MCP_URL and target.region == REGION
    assert target.log_groups == tuple(sorted(f"/aws/lambda/{f}" for f in FUNCTIONS))
    elsewhere = smoke_target(clients, "engram-memory-dev", "https://127.0.0.1:8443/mcp")
    assert elsewhere.endpoint == "https://127.0.0.1:8443/mcp"


def test_the_templates_stack_has_a_log_group_for_every_function_and_moto_no_mcp_url(
    session: boto3.session.Session,
) -> None:
    create_template_stack(session, "engram-dev")
    clients = AwsClients.of(session)
    summaries = session.client("cloudformation").list_stack_resources(StackName="engram-dev")
    functions = {
        s["PhysicalResourceId"]
        for s in summaries["StackResourceSummaries"]
        if s["ResourceType"] == "AWS::Lambda::Function"
    }

    target = smoke_target(clients, "engram-dev", "https://127.0.0.1:8443/mcp")

    assert {f"/aws/lambda/{function}" for function in functions} <= set(target.log_groups)
    assert len(functions) >= 10
    # moto cannot create the HTTP API, so the template's McpUrl output is left out
    with pytest.raises(StackError, match=r"no McpUrl output.*--endpoint"):
        smoke_target(clients, "engram-dev", None)


def test_report_lines_since_the_start_are_read_from_every_group_in_time_order(
    session: boto3.session.Session,
) -> None:
    logs = session.client("logs")
    for function in FUNCTIONS[:2]:
        logs.create_log_group(logGroupName=f"/aws/lambda/{function}")
        logs.create_log_stream(logGroupName=f"/aws/lambda/{function}", logStreamName="s")
    since = int(time.time() * 1000) - 600_000  # CloudWatch Logs takes no events from the future

    def invocation(function: str, at_ms: int, request_id: str, init: str = "") -> None:
        lines = [
            f"START RequestId: {request_id} Version: $LATEST",
            f"END RequestId: {request_id}",
            f"REPORT RequestId: {request_id}\tDuration: 10.50 ms\tBilled Duration: 11 ms\t"
            f"Memory Size: 512 MB\tMax Memory Used: 90 MB\t{init}",
        ]
        logs.put_log_events(
            logGroupName=f"/aws/lambda/{function}",
            logStreamName="s",
            logEvents=[{"timestamp": at_ms, "message": line} for line in lines],
        )

    invocation(FUNCTIONS[0], since - 5_000, "before-the-smoke")
    invocation(FUNCTIONS[1], since + 2_000, "second", "Init Duration: 400.00 ms")
    invocation(FUNCTIONS[0], since + 1_000, "first")
    pauses: list[float] = []

    reports = read_reports(
        logs,
        [f"/aws/lambda/{f}" for f in FUNCTIONS],  # the third group does not exist
        since,
        sleep=pauses.append,
    )

    assert [(r.function, r.request_id, r.init_ms) for r in reports] == [
        (FUNCTIONS[0], "first", None),
        (FUNCTIONS[1], "second", 400.0),
    ]
    assert reports[0].billed_ms == 11 and reports[0].max_memory_mb == 90
    assert len(pauses) == 1  # read twice: the second read agreed


def one_line_refusal(capsys: pytest.CaptureFixture[str], code: int, want: int) -> str:
    out, err = capsys.readouterr()
    assert code == want, err
    assert TOKEN not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_the_command_refuses_in_one_line_and_never_prints_the_token(
    session: boto3.session.Session,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small_stack(session, "engram-no-url", mcp_url=False)
    token_file = tmp_path / "agent.token"
    token_file.write_text(TOKEN + "\n", "utf-8")
    stack = ["admin", "--stack", "engram-no-url", "--region", REGION, "smoke"]
    capsys.readouterr()

    assert "--token-file" in one_line_refusal(capsys, main(stack), 2)
    assert "--stack NAME" in one_line_refusal(capsys, main(["admin", "smoke"]), 2)
    missing = ["admin", "--stack", "no-such-stack", "--region", REGION, "smoke"]
    line = one_line_refusal(capsys, main([*missing, "--token-file", str(token_file)]), 1)
    assert "no-such-stack" in line and "not found" in line
    monkeypatch.setenv("ENGRAM_TOKEN", TOKEN)
    assert "no McpUrl output" in one_line_refusal(capsys, main(stack), 1)
    unreadable = [*stack, "--token-file", str(tmp_path / "absent")]
    assert "cannot read" in one_line_refusal(capsys, main(unreadable), 2)

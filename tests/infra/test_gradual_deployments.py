"""Gradual deployments (issue 36, item 3), on template.yaml as CloudFormation receives it.

The MCP adapter and the six tool functions publish a version on every deploy and serve through a
``live`` alias that CodeDeploy shifts to the new version (canary or linear, the
``DeploymentPreferenceType`` parameter) and shifts back when the new version's errors alarm. The
HTTP API reaches the adapter through its alias, and the adapter reaches each tool through the
tool's alias (its environment names the alias; its role may invoke nothing else), so a canary's
share of calls runs the new code end to end.

What these tests cannot show: CodeDeploy's traffic shifting and rollback themselves (moto's
CodeDeploy keeps deployment groups as records and shifts no alias). The gate's run on moto
(``make cloud-check``) invokes each tool through its alias and has the IAM simulation allow
exactly that, and deny the same invocations unqualified and on ``$LATEST``.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
from test_template import TOOL_FUNCTIONS

from scripts.cloud_template import translate

ROOT: Final = Path(__file__).resolve().parents[2]
TEMPLATE: Final = ROOT / "template.yaml"
ALIAS: Final = "live"
# Each function that deploys gradually, and the tool name the adapter calls it by (None: the
# adapter itself, which the HTTP API calls).
GRADUAL: Final[dict[str, str | None]] = {
    "McpAdapterFunction": None,
    **{function: tool for tool, function in TOOL_FUNCTIONS.items()},
}
# SAM's predefined Lambda deployment configurations (CodeDeployDefault.Lambda<Type>).
SAM_DEPLOYMENT_TYPES: Final = {
    "Canary10Percent5Minutes",
    "Canary10Percent10Minutes",
    "Canary10Percent15Minutes",
    "Canary10Percent30Minutes",
    "Linear10PercentEvery1Minute",
    "Linear10PercentEvery2Minutes",
    "Linear10PercentEvery3Minutes",
    "Linear10PercentEvery10Minutes",
    "AllAtOnce",
}


@cache
def translated(deployment_type: str | None = None) -> dict[str, Any]:
    given = {"DeploymentPreferenceType": deployment_type} if deployment_type else {}
    return translate(TEMPLATE, given)


def resources(kind: str, deployment_type: str | None = None) -> dict[str, dict[str, Any]]:
    return {
        name: body
        for name, body in translated(deployment_type)["Resources"].items()
        if body["Type"] == kind
    }


def alias_of(function: str) -> tuple[str, dict[str, Any]]:
    """The one alias of ``function``: its logical id and resource."""
    (found,) = [
        (name, body)
        for name, body in resources("AWS::Lambda::Alias").items()
        if body["Properties"]["FunctionName"] == {"Ref": function}
    ]
    return found


def deployment_group_of(function: str, deployment_type: str | None = None) -> dict[str, Any]:
    _, alias = alias_of(function)
    update = alias["UpdatePolicy"]["CodeDeployLambdaAliasUpdate"]
    group = update["DeploymentGroupName"]["Ref"]
    found: dict[str, Any] = resources("AWS::CodeDeploy::DeploymentGroup", deployment_type)[group]
    properties: dict[str, Any] = found["Properties"]
    return properties


def test_exactly_the_adapter_and_the_tools_deploy_through_an_alias() -> None:
    aliased = {
        body["Properties"]["FunctionName"]["Ref"]
        for body in resources("AWS::Lambda::Alias").values()
    }
    assert aliased == set(GRADUAL)
    # the others (workflow steps, drainer, approval page, ...) still replace at once: the issue
    # asks for the request path; the state machines invoke the workflow function unqualified
    for name in GRADUAL:
        # always deployed: SAM's offline translation leaves a Condition out of the deployment
        # group (scripts/cloud_template.translate), so none may have one
        assert "Condition" not in translated()["Resources"][name]
        _, alias = alias_of(name)
        assert alias["Properties"]["Name"] == ALIAS
        version = alias["Properties"]["FunctionVersion"]["Fn::GetAtt"]
        assert version[1] == "Version"
        published = translated()["Resources"][version[0]]
        assert published["Type"] == "AWS::Lambda::Version"
        assert published["Properties"]["FunctionName"] == {"Ref": name}


@pytest.mark.parametrize("function", sorted(GRADUAL))
def test_codedeploy_shifts_each_alias_and_rolls_back_on_failure_and_on_alarm(function: str) -> None:
    _, alias = alias_of(function)
    update = alias["UpdatePolicy"]["CodeDeployLambdaAliasUpdate"]
    application = update["ApplicationName"]["Ref"]
    assert resources("AWS::CodeDeploy::Application")[application]["Properties"] == {
        "ComputePlatform": "Lambda"
    }
    group = deployment_group_of(function)
    assert group["DeploymentStyle"] == {
        "DeploymentType": "BLUE_GREEN",
        "DeploymentOption": "WITH_TRAFFIC_CONTROL",
    }
    rollback = group["AutoRollbackConfiguration"]
    assert rollback["Enabled"] is True
    assert {"DEPLOYMENT_FAILURE", "DEPLOYMENT_STOP_ON_ALARM"} <= set(rollback["Events"])
    alarms = group["AlarmConfiguration"]
    assert alarms["Enabled"] is True
    assert [a["Name"]["Ref"] for a in alarms["Alarms"]] == [new_version_alarm(function)]


def new_version_alarm(function: str) -> str:
    return function.removesuffix("Function") + "NewVersionErrorsAlarm"


@pytest.mark.parametrize("function", sorted(GRADUAL))
def test_the_rollback_alarm_counts_only_the_new_versions_errors_behind_the_alias(
    function: str,
) -> None:
    alarm = resources("AWS::CloudWatch::Alarm")[new_version_alarm(function)]["Properties"]
    assert (alarm["Namespace"], alarm["MetricName"], alarm["Statistic"]) == (
        "AWS/Lambda",
        "Errors",
        "Sum",
    )
    _, alias = alias_of(function)
    dimensions = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
    assert dimensions["FunctionName"] == {"Ref": function}
    assert dimensions["Resource"] == {"Fn::Sub": f"${{{function}}}:{alias['Properties']['Name']}"}
    # the version this deploy publishes: the one the alias shifts to
    assert dimensions["ExecutedVersion"] == alias["Properties"]["FunctionVersion"]
    # seen inside the shortest canary (5 minutes), yet one failure rolls nothing back
    assert alarm["Period"] == 60
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"]) == (3, 2)
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"


def test_the_shift_is_a_parameter_of_sams_types_defaulting_to_a_canary() -> None:
    parameter = translated()["Parameters"]["DeploymentPreferenceType"]
    assert set(parameter["AllowedValues"]) == SAM_DEPLOYMENT_TYPES
    assert parameter["Default"] == "Canary10Percent5Minutes"
    for function in GRADUAL:
        config = deployment_group_of(function)["DeploymentConfigName"]
        assert config == {
            "Fn::Sub": [
                "CodeDeployDefault.Lambda${ConfigName}",
                {"ConfigName": "Canary10Percent5Minutes"},
            ]
        }


def test_the_emergency_deploy_shifts_all_at_once() -> None:
    for function in GRADUAL:
        config = deployment_group_of(function, "AllAtOnce")["DeploymentConfigName"]
        assert config["Fn::Sub"][1] == {"ConfigName": "AllAtOnce"}


def test_the_http_api_invokes_the_adapters_alias() -> None:
    adapter_alias, _ = alias_of("McpAdapterFunction")
    body = translated()["Resources"]["HttpApi"]["Properties"]["Body"]
    uris = [
        operation["x-amazon-apigateway-integration"]["uri"]["Fn::Sub"]
        for path in body["paths"].values()
        for operation in path.values()
        if "x-amazon-apigateway-integration" in operation
    ]
    adapter_uris = [u for u in uris if "McpAdapterFunction" in u]
    assert len(adapter_uris) == 5  # POST/GET/DELETE /mcp and the two metadata routes
    assert all(f"${{{adapter_alias}}}/invocations" in u for u in adapter_uris)
    permissions = [
        body["Properties"]
        for body in resources("AWS::Lambda::Permission").values()
        if "McpAdapterFunction" in json.dumps(body["Properties"]["FunctionName"])
    ]
    assert len(permissions) == 5
    assert all(p["FunctionName"] == {"Ref": adapter_alias} for p in permissions)


def test_the_adapter_calls_each_tool_by_its_alias_and_may_invoke_only_those() -> None:
    env = translated()["Resources"]["McpAdapterFunction"]["Properties"]["Environment"]
    mapping = json.loads(env["Variables"]["ENGRAM_TOOL_FUNCTIONS"]["Fn::Sub"])
    tools = {tool: function for function, tool in GRADUAL.items() if tool}
    assert set(mapping) == set(tools)
    for tool, function in tools.items():
        own = translated()["Resources"][function]["Properties"]["FunctionName"]["Fn::Sub"]
        assert mapping[tool] == f"{own}:{alias_of(function)[1]['Properties']['Name']}"
    policy = translated()["Resources"]["McpAdapterFunctionPolicy"]["Properties"]
    grants = [
        s
        for s in policy["PolicyDocument"]["Statement"]
        if "lambda:InvokeFunction" in json.dumps(s["Action"])
    ]
    (grant,) = grants
    assert grant["Effect"] == "Allow"
    # the alias ARNs (function:NAME:live): never the function, $LATEST, a version or "*"
    assert sorted(r["Fn::Sub"] for r in grant["Resource"]) == sorted(
        f"${{{function}.Arn}}:{alias_of(function)[1]['Properties']['Name']}"
        for function in tools.values()
    )


def test_codedeploys_role_is_for_codedeploy_only() -> None:
    roles = {
        name
        for group in resources("AWS::CodeDeploy::DeploymentGroup").values()
        for name in [group["Properties"]["ServiceRoleArn"]["Fn::GetAtt"][0]]
    }
    (role,) = roles
    props = translated()["Resources"][role]["Properties"]
    (statement,) = props["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": ["codedeploy.amazonaws.com"]}
    assert statement["Action"] == ["sts:AssumeRole"]
    # AWS's policy for CodeDeploy's Lambda deployments (read the alarms, move the alias); no
    # inline grant of the stack's data to it
    assert props["ManagedPolicyArns"] == [
        "arn:aws:iam::aws:policy/service-role/AWSCodeDeployRoleForLambda"
    ]
    assert "Policies" not in props


def test_every_rollback_alarm_has_a_runbook_section_on_upgrading() -> None:
    guide = (ROOT / "docs" / "deploying-aws.md").read_text("utf-8")
    for function in GRADUAL:
        alarm = resources("AWS::CloudWatch::Alarm")[new_version_alarm(function)]["Properties"]
        anchor = re.search(r"#(alarm-[a-z0-9-]+)$", alarm["AlarmDescription"]["Fn::Sub"])
        assert anchor is not None
        assert anchor.group(1) == "alarm-new-version-errors"
    section = guide.split('<a id="alarm-new-version-errors"></a>', 1)
    assert len(section) == 2
    assert "## Upgrading and rolling back" in guide


# --------------------------------------------------------------------------------------------
# The gate's stand-ins: Lambda answers by qualifier, the IAM judgement authorizes on it
# --------------------------------------------------------------------------------------------

SEARCH: Final = "engram-acme-search"


class _Answering:
    """A worker that answers every event (the service's contract with a worker)."""

    name = SEARCH

    def invoke(self, event: Any) -> dict[str, Any]:
        return {"result": {"ok": True}}


@pytest.fixture
def lambda_service() -> Any:
    from scripts.cloud_run.lambdas import LambdaService

    service = LambdaService()
    service.workers[SEARCH] = _Answering()  # type: ignore[assignment]
    service.aliases = {SEARCH: {ALIAS: "1"}}
    yield service
    service.server.shutdown()


@pytest.mark.parametrize(
    ("path", "status", "version"),
    [
        (f"/2015-03-31/functions/{SEARCH}%3A{ALIAS}/invocations", 200, "1"),
        (f"/2015-03-31/functions/{SEARCH}/invocations?Qualifier={ALIAS}", 200, "1"),
        (f"/2015-03-31/functions/{SEARCH}%3A1/invocations", 200, "1"),
        (f"/2015-03-31/functions/{SEARCH}/invocations", 200, "$LATEST"),
        (f"/2015-03-31/functions/{SEARCH}%3A%24LATEST/invocations", 200, "$LATEST"),
        (f"/2015-03-31/functions/{SEARCH}%3Acanary/invocations", 404, None),
        (f"/2015-03-31/functions/{SEARCH}%3A2/invocations", 404, None),
    ],
)
def test_the_lambda_stand_in_runs_what_the_qualifier_names(
    lambda_service: Any, path: str, status: int, version: str | None
) -> None:
    answered, _, headers = lambda_service.answer(path, b"{}")
    assert answered == status
    assert headers.get("x-amz-executed-version") == version
    if status == 404:
        assert headers["x-amzn-errortype"] == "ResourceNotFoundException"


def test_an_invoke_is_authorized_on_the_arn_it_names_and_probed_past_the_alias() -> None:
    from scripts.cloud_run.iam import Authorization, lambda_
    from scripts.cloud_run.probes import past_the_alias
    from scripts.cloud_run.recorder import Call
    from scripts.cloud_run.settings import ACCOUNT, REGION

    class _World:
        functions: Final = {SEARCH: "SearchFunction"}

    def authorized_on(function: str) -> list[str]:
        call = Call("McpAdapterFunction", "lambda", "Invoke", {"FunctionName": function})
        return [resource for _, resource, _, _ in lambda_(call, _World())]  # type: ignore[arg-type]

    arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{SEARCH}"
    assert authorized_on(f"{SEARCH}:{ALIAS}") == [f"{arn}:{ALIAS}"]
    assert authorized_on(f"{arn}:{ALIAS}") == [f"{arn}:{ALIAS}"]
    assert authorized_on(SEARCH) == [arn]
    invoked = Authorization.of("McpAdapterFunction", "lambda:InvokeFunction", f"{arn}:{ALIAS}", {})
    unqualified = Authorization.of("McpAdapterFunction", "lambda:InvokeFunction", arn, {})
    probes = list(past_the_alias([invoked, unqualified]))
    assert [(p.authorization.principal, p.authorization.resource) for p in probes] == [
        ("McpAdapterFunction", arn),
        ("McpAdapterFunction", f"{arn}:$LATEST"),
    ]

"""The SAM template, its state machines, dashboard and samconfig, checked offline.

Every fact is read from ``template.yaml`` (and the files it points at) rather than retyped: the
template is the source of truth. What is written here are the *rules* the template must keep —
least privilege, where backups may exist, which routes are public — plus the handful of names the
handlers rely on (function folders, environment variables, workflow step names).
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
from cfnlint.api import ManualArgs, lint, lint_file
from cfnlint.decode.cfn_yaml import load as load_cfn_yaml

from scripts.cloud_template import _decided, tool_resource, tools

ROOT: Final = Path(__file__).resolve().parents[2]
TEMPLATE_PATH: Final = ROOT / "template.yaml"
SAMCONFIG_PATH: Final = ROOT / "samconfig.toml"

# cfn-lint findings (rule id -> reason) that are accepted. Keep it empty unless a finding is a
# known false positive; every entry needs the reason next to it.
ALLOWED_LINT_FINDINGS: Final[Mapping[str, str]] = {}

# The handler folders other code relies on (functions/<name>/app.py, Handler app.handler).
FUNCTION_FOLDERS: Final = {
    "McpAdapterFunction": "mcp_adapter",
    **{tool_resource(tool): tool for tool in tools()},  # each tool's, by the registry
    "WorkflowStepFunction": "workflow",
    "ApprovalFunction": "approval",
    "OutboxDrainerFunction": "outbox_drainer",
    "OpenSearchSecurityConfigFunction": "opensearch_security",
    "SecretRotationFunction": "secret_rotation",
    "CognitoClaimsFunction": "cognito_claims",
}
# Run by CloudFormation only (a custom resource): a failure fails the deployment in front of the
# operator, so no errors or throttles alarm watches it.
DEPLOY_TIME_FUNCTIONS: Final = frozenset({"OpenSearchSecurityConfigFunction"})
# The tool functions, from the registry (a seventh tool is held to every rule below by itself).
TOOL_FUNCTIONS: Final = {tool: tool_resource(tool) for tool in tools()}
# The environment the composition roots read (engram_memory/cloud/: the tool functions, the adapter, the workflow).
REQUIRED_ENV: Final = frozenset(
    {
        "ENGRAM_TABLE",
        "ENGRAM_KEY_TABLE",
        "ENGRAM_BLOB_BUCKET",
        "ENGRAM_DATA_KEY_ARN",
        "ENGRAM_OPENSEARCH_ENDPOINT",
        "ENGRAM_OPENSEARCH_INDEX",
        "ENGRAM_TENANT_ID",
        "ENGRAM_RESOURCE_URI",
        "ENGRAM_ISSUER",
        "ENGRAM_ALLOWED_ORIGINS",
        "ENGRAM_ADMISSION_MODE",
        "ENGRAM_RETENTION_CEILING_S",
        "ENGRAM_REQUEST_STATE_SECRET_ARN",
        "ENGRAM_CURSOR_SECRET_ARN",
        "ENGRAM_WITHDRAW_STATE_MACHINE_ARN",
        "ENGRAM_FORGET_STATE_MACHINE_ARN",
        "ENGRAM_TOOL_FUNCTIONS",
        "POWERTOOLS_SERVICE_NAME",
        "POWERTOOLS_METRICS_NAMESPACE",
        "POWERTOOLS_LOG_LEVEL",
        "POWERTOOLS_TRACER_CAPTURE_RESPONSE",
    }
)
WORKFLOW_STEPS: Final = ("await_approval", "commit_transition", "finish_tail")
DASHBOARD_WIDGETS: Final = (
    "Tool calls per tool",
    "Errors by code",
    "Duration p50 per tool (ms)",
    "Duration p99 per tool (ms)",
    "Admission outcomes",
    "Confirmation gate: gate_failed",
    "DynamoDB throttles",
    "OpenSearch cluster health",
    "State machine failures",
    "Projection lag (ms)",
    "Outbox age (s) and pending items",
    "HTTP API requests",
    "HTTP API 4xx",
    "HTTP API 5xx",
    "HTTP API latency p99 (ms)",
    "Store faults: STORE_UNAVAILABLE, JOURNAL_CORRUPT",
    "AWS access denied by service",
)
# Actions that have no resource-level permissions and so may name Resource "*".
# Actions without a resource type: they can only be granted on "*".
# Actions with no resource type: AWS grants them only on "*" (the service authorization
# reference; the gate's IAM simulator refuses them on anything else).
STAR_RESOURCE_ACTIONS: Final = frozenset(
    {
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
        "secretsmanager:GetRandomPassword",
        "states:SendTaskSuccess",
        "states:SendTaskFailure",
    }
)
# The issuer every verifier trusts: the stack's own user pool when it creates one, else IssuerUrl.
TRUSTED_ISSUER: Final = {
    "Fn::If": [
        "CreateUserPool",
        {"Fn::Sub": "https://cognito-idp.${AWS::Region}.${AWS::URLSuffix}/${CognitoUserPool}"},
        {"Ref": "IssuerUrl"},
    ]
}
PSEUDO_PARAMETERS: Final = frozenset(
    {"AWS::AccountId", "AWS::Region", "AWS::Partition", "AWS::StackName", "AWS::StackId"}
    | {"AWS::URLSuffix", "AWS::NoValue"}
)


# --------------------------------------------------------------------------------------------
# Reading the template
# --------------------------------------------------------------------------------------------


@cache
def template() -> dict[str, Any]:
    """template.yaml with its short-form tags decoded (cfn-lint's loader: !Ref -> {"Ref": ...})."""
    loaded: dict[str, Any] = load_cfn_yaml(str(TEMPLATE_PATH))
    return loaded


def resources(kind: str | None = None) -> dict[str, dict[str, Any]]:
    return {
        name: body
        for name, body in template()["Resources"].items()
        if kind is None or body["Type"] == kind
    }


def decided(value: Any, **given: str) -> Any:
    """``value`` with every ``Fn::If`` decided for the parameter values ``given`` (else defaults)."""
    return _decided(template(), value, given)


def props(logical_id: str) -> dict[str, Any]:
    properties: dict[str, Any] = template()["Resources"][logical_id].get("Properties", {})
    return properties


def _merge_globals(defaults: Any, own: Any) -> Any:
    """SAM's Globals rule: maps merge key by key, lists concatenate, scalars are overridden."""
    if isinstance(defaults, dict) and isinstance(own, dict):
        merged = dict(defaults)
        for key, value in own.items():
            merged[key] = _merge_globals(defaults[key], value) if key in defaults else value
        return merged
    if isinstance(defaults, list) and isinstance(own, list):
        return [*defaults, *own]
    return own


def function_props(logical_id: str) -> dict[str, Any]:
    """A function's effective properties (Globals.Function merged under its own)."""
    merged: dict[str, Any] = _merge_globals(
        template().get("Globals", {}).get("Function", {}), props(logical_id)
    )
    return merged


def functions() -> dict[str, dict[str, Any]]:
    return {name: function_props(name) for name in resources("AWS::Serverless::Function")}


def ref_target(value: Any) -> str | None:
    """The logical id a !Ref / !GetAtt points at, else None."""
    if isinstance(value, dict) and len(value) == 1:
        if "Ref" in value:
            return str(value["Ref"])
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            return str(target[0] if isinstance(target, list) else target.split(".")[0])
    return None


def sub_template(value: Any) -> str | None:
    if isinstance(value, dict) and "Fn::Sub" in value:
        sub = value["Fn::Sub"]
        return str(sub[0] if isinstance(sub, list) else sub)
    return None


def _named_resources() -> dict[str, str]:
    """ARN tail (e.g. "function:engram-${TenantId}-search") -> logical id, for named resources."""
    tails: dict[str, str] = {}
    for name, body in resources().items():
        properties = body.get("Properties", {})
        if body["Type"] == "AWS::Serverless::Function":
            own = sub_template(properties.get("FunctionName"))
            if own:
                tails[f":function:{own}"] = name
        if body["Type"] == "AWS::Serverless::StateMachine":
            own = sub_template(properties.get("Name"))
            if own:
                tails[f":stateMachine:{own}"] = name
                tails[f":execution:{own}:*"] = name
    return tails


def resource_targets(value: Any) -> set[str]:
    """Logical ids a policy Resource entry points at: Ref/GetAtt, ${X.Arn} in a Sub, or an ARN
    built from a named resource's fixed name; "*" stays "*"."""
    if value == "*":
        return {"*"}
    if isinstance(value, list):
        return set().union(*(resource_targets(v) for v in value))
    target = ref_target(value)
    if target:
        return {target}
    if isinstance(value, dict) and "Fn::If" in value:
        return set().union(*(resource_targets(v) for v in value["Fn::If"][1:]))
    text = sub_template(value)
    if text is None:
        return {json.dumps(value, sort_keys=True)}
    found = {
        match.split(".")[0]
        for match in re.findall(r"\$\{([A-Za-z0-9]+(?:\.[A-Za-z]+)?)\}", text)
        if match.split(".")[0] in template()["Resources"]
    }
    for tail, name in _named_resources().items():
        if text.endswith(tail):
            found.add(name)
    return found or {text}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def role_of(function: str) -> str:
    role = ref_target(function_props(function)["Role"])
    assert role is not None, f"{function} must use an explicit role"
    return role


def role_statements(role: str) -> list[dict[str, Any]]:
    """Every Allow/Deny statement attached to ``role``: inline policies and AWS::IAM::RolePolicy
    (both branches of a statement chosen by ``Fn::If``: what the role may hold in some stack)."""
    statements = [
        statement
        for policy in props(role).get("Policies", [])
        for statement in as_list(policy["PolicyDocument"]["Statement"])
    ]
    for body in resources("AWS::IAM::RolePolicy").values():
        if ref_target(body["Properties"]["RoleName"]) == role:
            statements.extend(as_list(body["Properties"]["PolicyDocument"]["Statement"]))
    return [
        branch
        for statement in statements
        for branch in (statement["Fn::If"][1:] if "Fn::If" in statement else [statement])
        if branch != {"Ref": "AWS::NoValue"}
    ]


def grants(function: str) -> Iterator[tuple[str, set[str], dict[str, Any]]]:
    """(action, resource targets, statement) for every allowed action of a function's role."""
    for statement in role_statements(role_of(function)):
        if statement["Effect"] != "Allow":
            continue
        targets = resource_targets(statement["Resource"])
        for action in as_list(statement["Action"]):
            yield action, targets, statement


def allows(function: str, action: str, target: str) -> bool:
    return any(a == action and target in t for a, t, _ in grants(function))


def key_policy_grants(key: str) -> Iterator[tuple[str, set[str], dict[str, Any]]]:
    """(action, principal logical ids / ARNs, statement) of a KMS key policy."""
    for statement in as_list(props(key)["KeyPolicy"]["Statement"]):
        if "Fn::If" in statement:  # a statement only when its condition holds
            statement = statement["Fn::If"][1]
        if statement["Effect"] != "Allow":  # a Deny grants nothing (CT.KMS.PR.3's guard)
            continue
        principals = {
            ref_target(p) or json.dumps(p, sort_keys=True)
            for p in as_list(statement["Principal"]["AWS"])
        }
        for action in as_list(statement["Action"]):
            yield action, principals, statement


def state_machine_definition(machine: str) -> dict[str, Any]:
    definition: dict[str, Any] = json.loads(
        (ROOT / props(machine)["DefinitionUri"]).read_text(encoding="utf-8")
    )
    return definition


def dashboard_path() -> Path:
    body = props("Dashboard")["DashboardBody"]
    include = body["Fn::ToJsonString"]["Fn::Transform"]
    assert include["Name"] == "AWS::Include"
    location: str = include["Parameters"]["Location"]
    return ROOT / location


def intrinsic_references(node: Any) -> Iterator[tuple[str, str]]:
    """("ref" | "condition", name) for every Ref, ${Name} in a Sub, GetAtt and Fn::If."""
    if isinstance(node, list):
        for item in node:
            yield from intrinsic_references(item)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key == "Ref":
            yield "ref", value
        elif key == "Fn::GetAtt":
            yield "ref", (value[0] if isinstance(value, list) else value.split(".")[0])
        elif key == "Fn::Sub":
            text, variables = (value[0], value[1]) if isinstance(value, list) else (value, {})
            for name in re.findall(r"\$\{([^}!][^}]*)\}", text):
                if name not in variables:
                    yield "ref", name.split(".")[0]
            yield from intrinsic_references(variables)
        elif key == "Fn::If":
            yield "condition", value[0]
            yield from intrinsic_references(value[1:])
        else:
            yield from intrinsic_references(value)


# --------------------------------------------------------------------------------------------
# cfn-lint
# --------------------------------------------------------------------------------------------

LINT_CONFIG: Final = ManualArgs(include_checks=["I"], regions=["us-east-1", "eu-west-1"])


def test_the_template_passes_cfn_lint_with_no_unexplained_finding() -> None:
    findings = lint_file(TEMPLATE_PATH, config=LINT_CONFIG)
    unexplained = [
        f"{m.rule.id} {m.message} (line {m.linenumber})"
        for m in findings
        if m.rule.id not in ALLOWED_LINT_FINDINGS
    ]
    assert not unexplained, "\n".join(unexplained)
    assert not [m for m in findings if m.rule.id.startswith("E")]


@pytest.mark.parametrize("machine", ["WithdrawStateMachine", "ForgetStateMachine"])
def test_each_state_machine_definition_passes_cfn_lint_asl_validation(machine: str) -> None:
    # DefinitionUri is a local file cfn-lint does not open: lint the definition inlined.
    substitutions = {
        name: f"arn:aws:lambda:us-east-1:123456789012:function:{name}"
        for name in props(machine)["DefinitionSubstitutions"]
    }
    probe = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Resources": {
            "Machine": {
                "Type": "AWS::StepFunctions::StateMachine",
                "Properties": {
                    "RoleArn": "arn:aws:iam::123456789012:role/engram-probe",
                    "StateMachineType": props(machine)["Type"],
                    "Definition": state_machine_definition(machine),
                    "DefinitionSubstitutions": substitutions,
                },
            }
        },
    }
    findings = lint(json.dumps(probe), config=LINT_CONFIG)
    assert not findings, [f"{m.rule.id} {m.message}" for m in findings]


# --------------------------------------------------------------------------------------------
# Functions
# --------------------------------------------------------------------------------------------


def test_the_template_defines_exactly_the_thirteen_functions() -> None:
    assert set(resources("AWS::Serverless::Function")) == set(FUNCTION_FOLDERS)


@pytest.mark.parametrize("function", sorted(FUNCTION_FOLDERS))
def test_every_function_code_uri_is_its_handler_folder(function: str) -> None:
    assert function_props(function)["CodeUri"] == f"functions/{FUNCTION_FOLDERS[function]}/"


@pytest.mark.parametrize("function", sorted(FUNCTION_FOLDERS))
def test_every_function_runs_python312_on_arm64_with_tracing_and_the_core_layer(
    function: str,
) -> None:
    effective = function_props(function)
    assert effective["Runtime"] == "python3.12"
    assert effective["Architectures"] == ["arm64"]
    assert effective["Handler"] == "app.handler"
    assert effective["Tracing"] == "Active"
    assert [ref_target(layer) for layer in effective["Layers"]] == ["CoreLayer"]


@pytest.mark.parametrize("function", sorted(FUNCTION_FOLDERS))
def test_every_function_logs_to_its_own_log_group_with_retention(function: str) -> None:
    group = ref_target(function_props(function)["LoggingConfig"]["LogGroup"])
    assert group is not None
    assert template()["Resources"][group]["Type"] == "AWS::Logs::LogGroup"
    assert props(group)["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    name = sub_template(function_props(function)["FunctionName"])
    assert sub_template(props(group)["LogGroupName"]) == f"/aws/lambda/{name}"
    others = [f for f in FUNCTION_FOLDERS if f != function]
    assert all(ref_target(function_props(f)["LoggingConfig"]["LogGroup"]) != group for f in others)
    # ... and may write only there.
    log_targets = {
        frozenset(targets) for action, targets, _ in grants(function) if action.startswith("logs:")
    }
    assert log_targets == {frozenset({group})}


@pytest.mark.parametrize("function", sorted(FUNCTION_FOLDERS))
def test_every_function_is_created_after_its_role_policy(function: str) -> None:
    role = role_of(function)
    policies = {
        name
        for name, body in resources("AWS::IAM::RolePolicy").items()
        if ref_target(body["Properties"]["RoleName"]) == role
    }
    assert policies
    assert policies <= set(as_list(template()["Resources"][function].get("DependsOn", [])))


def test_every_log_group_of_the_stack_has_the_retention_parameter() -> None:
    for name in resources("AWS::Logs::LogGroup"):
        assert props(name)["RetentionInDays"] == {"Ref": "LogRetentionDays"}, name


def test_every_log_group_is_encrypted_with_the_stacks_logs_key_for_its_groups_only() -> None:
    """Audit lines name principals, agents, sessions and workspaces: the stack's own key, which
    the logs service may use for this stack's log groups and no other."""
    import fnmatch

    statements = props("LogsKey")["KeyPolicy"]["Statement"]
    (service,) = [s for s in statements if "Service" in s.get("Principal", {})]
    assert service["Principal"]["Service"] == {"Fn::Sub": "logs.${AWS::Region}.amazonaws.com"}
    patterns = [
        sub_template(p) or ""
        for p in service["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    ]
    prefix = "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}:log-group:"
    assert all(p.startswith(prefix) and "${TenantId}" in p for p in patterns)
    groups = resources("AWS::Logs::LogGroup")
    assert len(groups) >= 20
    for name in groups:
        assert props(name)["KmsKeyId"] == {"Fn::GetAtt": ["LogsKey", "Arn"]}, name
        arn = prefix + (sub_template(props(name)["LogGroupName"]) or "")
        assert any(fnmatch.fnmatchcase(arn, p) for p in patterns), name
    assert not any(p.endswith(":log-group:*") for p in patterns)
    assert template()["Resources"]["LogsKey"]["DeletionPolicy"] == "RetainExceptOnCreate"


def test_log_retention_offers_exactly_the_cloudwatch_values() -> None:
    parameter = template()["Parameters"]["LogRetentionDays"]
    allowed = [1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827]
    allowed += [2192, 2557, 2922, 3288, 3653]
    assert parameter["AllowedValues"] == allowed
    assert parameter["Default"] == 30


@pytest.mark.parametrize("function", sorted(TOOL_FUNCTIONS.values()))
def test_tool_functions_stay_under_the_api_integration_limit(function: str) -> None:
    adapter_timeout = function_props("McpAdapterFunction")["Timeout"]
    assert function_props(function)["Timeout"] <= 29
    assert function_props(function)["Timeout"] < adapter_timeout <= 29


def test_the_shared_environment_carries_every_variable_the_handlers_read() -> None:
    env = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert set(env) >= REQUIRED_ENV
    assert env["ENGRAM_OPENSEARCH_INDEX"] == {"Fn::Sub": "engram-${TenantId}-records"}
    assert env["ENGRAM_RESOURCE_URI"] == {"Ref": "Audience"}
    assert env["ENGRAM_ISSUER"] == TRUSTED_ISSUER
    assert env["POWERTOOLS_SERVICE_NAME"] == "engram-memory"
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "EngramMemory"
    assert env["POWERTOOLS_TRACER_CAPTURE_RESPONSE"] == "false"


def test_the_tool_function_map_names_the_six_tool_functions() -> None:
    env = template()["Globals"]["Function"]["Environment"]["Variables"]
    mapping = json.loads(sub_template(env["ENGRAM_TOOL_FUNCTIONS"]) or "")
    assert set(mapping) == set(TOOL_FUNCTIONS)
    for grant, function in TOOL_FUNCTIONS.items():
        # the function's alias (name:alias): tests/infra/test_gradual_deployments.py
        own = function_props(function)
        assert mapping[grant] == f"{sub_template(own['FunctionName'])}:{own['AutoPublishAlias']}"


@pytest.mark.parametrize(
    ("variable", "machine"),
    [
        ("ENGRAM_WITHDRAW_STATE_MACHINE_ARN", "WithdrawStateMachine"),
        ("ENGRAM_FORGET_STATE_MACHINE_ARN", "ForgetStateMachine"),
    ],
)
def test_the_state_machine_arns_in_the_environment_name_the_state_machines(
    variable: str, machine: str
) -> None:
    env = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert resource_targets(env[variable]) == {machine}


# --------------------------------------------------------------------------------------------
# HTTP API
# --------------------------------------------------------------------------------------------


def http_routes() -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    routes: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
    for function, effective in functions().items():
        for event in effective.get("Events", {}).values():
            if event["Type"] != "HttpApi":
                continue
            event_props = event["Properties"]
            assert ref_target(event_props["ApiId"]) == "HttpApi"
            key = (event_props["Method"].upper(), event_props["Path"])
            assert key not in routes, f"duplicate route {key}"
            routes[key] = (function, event_props)
    return routes


def test_the_jwt_authorizer_is_the_api_default_and_checks_issuer_and_audience() -> None:
    auth = props("HttpApi")["Auth"]
    authorizer = auth["Authorizers"][auth["DefaultAuthorizer"]]
    assert authorizer["IdentitySource"] == "$request.header.Authorization"
    jwt = authorizer["JwtConfiguration"]
    # the stack's own pool when it creates one: tests/infra/test_identity_edge.py
    assert jwt["issuer"] == TRUSTED_ISSUER
    assert decided(jwt["issuer"]) == {"Ref": "IssuerUrl"}
    # the resource URL, and the client ids an identity provider writes as aud (Entra ID v2,
    # Cognito) only when the operator names them: never an empty audience
    assert decided(jwt["audience"]) == [{"Ref": "Audience"}]
    assert decided(jwt["audience"], AudienceAliases="client-1") == {
        "Fn::Split": [
            ",",
            {
                "Fn::Join": [
                    ",",
                    [{"Ref": "Audience"}, {"Fn::Join": [",", {"Ref": "AudienceAliases"}]}],
                ]
            },
        ]
    }
    env = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert decided(env["ENGRAM_AUDIENCE_ALIASES"]) == {
        "Fn::Join": [",", {"Ref": "AudienceAliases"}]
    }
    rule = template()["Rules"]["ApprovalsNeedTheirOwnAudience"]["Assertions"][1]["Assert"]
    assert rule == {
        "Fn::Not": [{"Fn::Contains": [{"Ref": "AudienceAliases"}, {"Ref": "ApprovalAudience"}]}]
    }


def test_the_routes_reach_the_right_functions() -> None:
    routes = http_routes()
    assert routes[("POST", "/mcp")][0] == "McpAdapterFunction"
    assert routes[("GET", "/.well-known/oauth-protected-resource")][0] == "McpAdapterFunction"
    assert routes[("GET", "/.well-known/oauth-protected-resource/mcp")][0] == "McpAdapterFunction"
    assert routes[("GET", "/approvals/{approvalId}")][0] == "ApprovalFunction"
    assert routes[("POST", "/approvals/{approvalId}")][0] == "ApprovalFunction"
    assert routes[("GET", "/approvals/callback")][0] == "ApprovalFunction"


def test_only_the_metadata_and_the_approval_page_are_unauthenticated() -> None:
    public = {
        key
        for key, (_, event_props) in http_routes().items()
        if event_props.get("Auth", {}).get("Authorizer") == "NONE"
    }
    # the approval page signs its person in itself (OIDC code + PKCE, a session cookie): a
    # browser's form cannot carry a bearer token
    assert public == {
        ("GET", "/.well-known/oauth-protected-resource"),
        ("GET", "/.well-known/oauth-protected-resource/mcp"),
        ("GET", "/approvals/{approvalId}"),
        ("POST", "/approvals/{approvalId}"),
        ("GET", "/approvals/callback"),
    }
    # every other route keeps the default (JWT, MCP audience) authorizer
    for key, (_, event_props) in http_routes().items():
        if key not in public:
            assert "Auth" not in event_props, key
    authorizers = template()["Resources"]["HttpApi"]["Properties"]["Auth"]["Authorizers"]
    assert set(authorizers) == {"EngramJwtAuthorizer"}  # no bearer route for approvals


def test_the_approval_page_signs_in_with_its_own_client_never_the_mcp_audience() -> None:
    env = props("ApprovalFunction")["Environment"]["Variables"]
    assert env["ENGRAM_APPROVAL_SESSION_SECRET_ARN"] == {"Ref": "ApprovalSessionSecret"}
    # an ID token whose groups claim lists the agents' group signs nobody in
    assert decided(env["ENGRAM_APPROVER_GROUPS_CLAIM"]) == {"Ref": "ApproverGroupsClaim"}
    assert decided(env["ENGRAM_AGENTS_GROUP"]) == {"Ref": "AgentsGroup"}
    assert template()["Parameters"]["AgentsGroup"]["Default"] == "engram-agents"
    globals_env = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert decided(globals_env["ENGRAM_APPROVAL_AUDIENCE"]) == {"Ref": "ApprovalAudience"}
    assert decided(globals_env["ENGRAM_ISSUER"]) == {"Ref": "IssuerUrl"}
    assert globals_env["ENGRAM_RESOURCE_URI"] == {"Ref": "Audience"}  # refused in ID tokens
    assert globals_env["ENGRAM_APPROVER_CLAIM"] == {"Ref": "ApproverClaim"}  # the adapter's
    rule = template()["Rules"]["ApprovalsNeedTheirOwnAudience"]["Assertions"][0]["Assert"]
    assert rule == {"Fn::Not": [{"Fn::Equals": [{"Ref": "ApprovalAudience"}, {"Ref": "Audience"}]}]}


def test_only_the_approval_function_reads_the_session_key() -> None:
    readers = {
        function
        for function in FUNCTION_FOLDERS
        if allows(function, "secretsmanager:GetSecretValue", "ApprovalSessionSecret")
    }
    # the page, and the rotation that writes its next version
    assert readers == {"ApprovalFunction", "SecretRotationFunction"}
    secrets = {
        statement["Resource"]["Ref"]
        for action, _, statement in grants("ApprovalFunction")
        if action == "secretsmanager:GetSecretValue"
    }
    assert secrets == {"ApprovalSessionSecret"}


def test_cors_comes_from_the_allowed_origins_parameter() -> None:
    cors = props("HttpApi")["CorsConfiguration"]["Fn::If"]
    assert template()["Conditions"][cors[0]] is not None
    assert cors[1]["AllowOrigins"] == {"Ref": "AllowedOrigins"}
    assert template()["Parameters"]["AllowedOrigins"]["Type"] == "CommaDelimitedList"
    assert cors[2] == {"Ref": "AWS::NoValue"}


def test_the_api_writes_access_logs_to_a_log_group() -> None:
    settings = props("HttpApi")["AccessLogSettings"]
    group = ref_target(settings["DestinationArn"])
    assert group is not None
    assert template()["Resources"][group]["Type"] == "AWS::Logs::LogGroup"
    assert "$context.requestId" in settings["Format"]


# --------------------------------------------------------------------------------------------
# Storage and keys
# --------------------------------------------------------------------------------------------


def test_the_records_table_has_pitr_deletion_protection_ttl_and_the_cmk() -> None:
    table = props("EngramTable")
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]} == {
        "pk": "HASH",
        "sk": "RANGE",
    }
    assert table["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"] is True
    assert table["DeletionProtectionEnabled"] is True
    assert table["TimeToLiveSpecification"] == {"AttributeName": "ttl", "Enabled": True}
    assert table["SSESpecification"]["SSEEnabled"] is True
    assert table["SSESpecification"]["SSEType"] == "KMS"
    assert ref_target(table["SSESpecification"]["KMSMasterKeyId"]) == "EngramTableKey"
    assert template()["Resources"]["EngramTable"]["DeletionPolicy"] == "RetainExceptOnCreate"


def test_the_key_table_has_no_point_in_time_recovery_and_no_ttl() -> None:
    table = props("EngramKeyTable")
    assert table["BillingMode"] == "PAY_PER_REQUEST"
    assert [(k["AttributeName"], k["KeyType"]) for k in table["KeySchema"]] == [("key_ref", "HASH")]
    assert (
        table.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled", False)
        is False
    )
    assert table.get("TimeToLiveSpecification", {}).get("Enabled", False) is False
    assert table["DeletionProtectionEnabled"] is True
    assert ref_target(table["SSESpecification"]["KMSMasterKeyId"]) == "EngramTableKey"


def test_the_blob_bucket_is_private_kms_encrypted_and_unversioned() -> None:
    bucket = props("EngramBlobBucket")
    (rule,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert ref_target(rule["ServerSideEncryptionByDefault"]["KMSMasterKeyID"]) == "EngramTableKey"
    assert all(bucket["PublicAccessBlockConfiguration"].values())
    assert len(bucket["PublicAccessBlockConfiguration"]) == 4
    # a shredded body must not survive as a noncurrent version
    assert bucket.get("VersioningConfiguration", {}).get("Status") != "Enabled"
    rules = bucket["LifecycleConfiguration"]["Rules"]
    assert any(r.get("Prefix") == "orphans/" and r.get("ExpirationInDays") for r in rules)


def test_the_bucket_policy_refuses_plain_http() -> None:
    (policy,) = [
        body["Properties"]
        for body in resources("AWS::S3::BucketPolicy").values()
        if ref_target(body["Properties"]["Bucket"]) == "EngramBlobBucket"
    ]
    denials = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert any(
        s["Condition"]["Bool"]["aws:SecureTransport"] in ("false", False)
        and s["Principal"] == "*"
        and s["Action"] == "s3:*"
        for s in denials
    )


@pytest.mark.parametrize("key", ["EngramTableKey", "EngramDataKey"])
def test_both_kms_keys_rotate_and_are_retained(key: str) -> None:
    assert props(key)["EnableKeyRotation"] is True
    assert template()["Resources"][key]["DeletionPolicy"] == "RetainExceptOnCreate"


USAGE_ACTIONS: Final = ("kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:ReEncrypt")


def _key_class(statement: Mapping[str, Any]) -> str:
    """The key class a key-policy statement is limited to: ``record-scope`` (sealed record
    bodies' scope keys), ``candidate`` (contexts without a key class), or ``any``."""
    condition = statement["Condition"]
    if condition.get("StringEquals", {}).get("kms:EncryptionContext:engram:key-class"):
        return str(condition["StringEquals"]["kms:EncryptionContext:engram:key-class"])
    if condition.get("Null", {}).get("kms:EncryptionContext:engram:key-class") in ("true", True):
        return "candidate"
    return "any"


def test_the_data_key_policy_lets_capture_only_seal_and_admission_only_open() -> None:
    usage = [
        (action, principals, statement)
        for action, principals, statement in key_policy_grants("EngramDataKey")
        if action.startswith(USAGE_ACTIONS)
    ]
    by_action: dict[tuple[str, str], set[str]] = {}
    for action, principals, statement in usage:
        by_action.setdefault((action, _key_class(statement)), set()).update(principals)
        assert "kms:EncryptionContext:engram:tenant" in statement["Condition"]["StringEquals"]
    readers = {
        role_of(name)
        for name in ("SearchFunction", "GetFunction", "OutboxDrainerFunction", "ApprovalFunction")
    }
    assert by_action == {
        # Candidates: capture seals (never a record-scope key), admission opens.
        ("kms:GenerateDataKey", "candidate"): {role_of("CaptureFunction")},
        # (and the operator's role, when the stack names one: the test below)
        ("kms:Decrypt", "any"): {role_of("RequestAdmissionFunction"), "OperatorRoleArn"},
        # the operator seals an import's candidates and makes an adjudication's scope key
        ("kms:GenerateDataKey", "any"): {"OperatorRoleArn"},
        # Sealed record bodies: admission makes scope keys; the record readers (and the approval
        # page, which shows a forget's record) open them and nothing else, so none of them
        # holds a permission to open a candidate.
        ("kms:GenerateDataKey", "record-scope"): {role_of("RequestAdmissionFunction")},
        ("kms:Decrypt", "record-scope"): readers,
    }


def test_only_a_named_operator_role_may_open_content_and_only_when_it_is_set() -> None:
    assert template()["Conditions"]["HasOperatorRole"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "OperatorRoleArn"}, ""]}]
    }
    assert template()["Parameters"]["OperatorRoleArn"]["Default"] == ""
    conditional = [
        statement["Fn::If"]
        for statement in as_list(props("EngramDataKey")["KeyPolicy"]["Statement"])
        if "Fn::If" in statement
    ]
    assert [(c[0], c[2]) for c in conditional] == [("HasOperatorRole", {"Ref": "AWS::NoValue"})] * 2
    granted = {(c[1]["Action"], _key_class(c[1])) for c in conditional}
    # open a candidate or a body; seal an import's candidate, make a scope's record key
    assert granted == {("kms:Decrypt", "any"), ("kms:GenerateDataKey", "any")}
    for _, statement, _ in conditional:
        assert statement["Principal"] == {"AWS": {"Ref": "OperatorRoleArn"}}
        tenant = statement["Condition"]["StringEquals"]["kms:EncryptionContext:engram:tenant"]
        assert tenant == {"Ref": "TenantId"}


@pytest.mark.parametrize("function", ["SearchFunction", "GetFunction"])
def test_search_and_get_read_record_keys_but_never_a_candidate_key(function: str) -> None:
    statements = [s for s in role_statements(role_of(function)) if s["Effect"] == "Allow"]
    data_key = [s for s in statements if "EngramDataKey" in resource_targets(s["Resource"])]
    assert data_key, "scope keys are opened with the data key"
    for statement in data_key:
        assert as_list(statement["Action"]) == ["kms:Decrypt"]
        assert _key_class(statement) == "record-scope"
    key_table = [s for s in statements if "EngramKeyTable" in resource_targets(s["Resource"])]
    assert key_table, "the record keys are read from the key table"
    for statement in key_table:
        assert set(as_list(statement["Action"])) <= {"dynamodb:GetItem", "dynamodb:BatchGetItem"}
        leading = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
        assert sorted(leading) == ["record:*", "scopekey:*"]


ROOT_PRINCIPAL: Final = json.dumps(
    {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:root"}, sort_keys=True
)


def test_no_account_principal_can_use_or_grant_the_data_key() -> None:
    # The account root in a key policy hands the key to every IAM policy of the account, and
    # kms:CreateGrant (or kms:Create*) would let a principal grant itself Decrypt.
    for action, principals, _ in key_policy_grants("EngramDataKey"):
        assert ROOT_PRINCIPAL not in principals, action
        assert action not in ("kms:*", "kms:Create*", "kms:CreateGrant"), action


def test_the_key_admin_administers_the_keys_without_using_them_or_changing_their_policy() -> None:
    for key in ("EngramDataKey", "EngramTableKey"):
        admin = [
            action
            for action, principals, _ in key_policy_grants(key)
            if principals == {"KeyAdminRoleArn"}
        ]
        assert "kms:ScheduleKeyDeletion" in admin and "kms:EnableKeyRotation" in admin, key
        # changing the policy would let the admin grant itself Decrypt
        assert "kms:PutKeyPolicy" not in admin, key
        using = [a for a in admin if a.startswith(USAGE_ACTIONS) or a == "kms:CreateGrant"]
        assert not using, key
        assert not [a for a in admin if a.endswith("*") and not a.startswith("kms:List")], key


def test_only_the_deploying_role_changes_a_key_policy_and_it_is_not_the_key_admin() -> None:
    for key in ("EngramDataKey", "EngramTableKey"):
        holders = [p for a, p, _ in key_policy_grants(key) if a in ("kms:PutKeyPolicy", "kms:*")]
        assert holders == [{"DeployRoleArn"}], key
        deployer = [a for a, p, _ in key_policy_grants(key) if p == {"DeployRoleArn"}]
        assert not [a for a in deployer if a.startswith(USAGE_ACTIONS) or a == "kms:CreateGrant"]
    rule = template()["Rules"]["KeyAdminIsNotTheDeployer"]["Assertions"][0]["Assert"]
    assert rule == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "KeyAdminRoleArn"}, {"Ref": "DeployRoleArn"}]}]
    }


def test_grants_on_the_table_key_are_only_for_aws_resources() -> None:
    for action, _, statement in key_policy_grants("EngramTableKey"):
        if action in ("kms:CreateGrant", "kms:Create*", "kms:*"):
            assert action == "kms:CreateGrant"
            assert statement["Condition"]["Bool"]["kms:GrantIsForAWSResource"] == "true"


def test_no_function_environment_references_the_http_api() -> None:
    # The API's generated definition references the functions: a !Ref HttpApi in any function's
    # environment is a dependency cycle CloudFormation refuses (cfn-lint E3004 after the transform).
    for name, function in functions().items():
        variables = function.get("Environment", {}).get("Variables", {})
        refs = {target for kind, target in intrinsic_references(variables) if kind == "ref"}
        assert "HttpApi" not in refs, name


def test_the_created_domain_publishes_slow_error_and_audit_logs_to_retained_log_groups() -> None:
    options = props("OpenSearchDomain")["LogPublishingOptions"]
    assert set(options) == {
        "SEARCH_SLOW_LOGS",
        "INDEX_SLOW_LOGS",
        "ES_APPLICATION_LOGS",
        "AUDIT_LOGS",
    }
    groups = set()
    for option in options.values():
        assert option["Enabled"] is True
        group = ref_target(option["CloudWatchLogsLogGroupArn"])
        assert group is not None
        assert template()["Resources"][group]["Condition"] == "CreateOpenSearch"
        assert props(group)["RetentionInDays"] == {"Ref": "LogRetentionDays"}
        # like every log group of the stack, under the stack's logs key
        assert props(group)["KmsKeyId"] == {"Fn::GetAtt": ["LogsKey", "Arn"]}
        groups.add(group)
    assert len(groups) == len(options)  # the audit log has a group of its own
    assert ref_target(options["AUDIT_LOGS"]["CloudWatchLogsLogGroupArn"]) == (
        "OpenSearchAuditLogGroup"
    )
    policy = props("OpenSearchLogsResourcePolicy")["PolicyDocument"]["Fn::Sub"]
    for group in groups:
        assert "${" + group + ".Arn}" in policy
    assert '"es.amazonaws.com"' in policy and "aws:SourceAccount" in policy
    # created before the domain: the Ref in its tag (the policy may be the account stack's)
    (tag,) = [t for t in props("OpenSearchDomain")["Tags"] if t["Key"] == "engram:logs-policy"]
    assert tag["Value"]["Fn::If"][:2] == [
        "StackLogsPolicy",
        {"Ref": "OpenSearchLogsResourcePolicy"},
    ]


def test_the_table_key_is_usable_only_through_dynamodb_s3_and_secrets_manager() -> None:
    services = set()
    for action, _, statement in key_policy_grants("EngramTableKey"):
        if action.startswith(USAGE_ACTIONS):
            via = statement["Condition"]["StringEquals"]["kms:ViaService"]
            services |= {sub_template(v) for v in as_list(via)}
    assert services == {
        "dynamodb.${AWS::Region}.amazonaws.com",
        "s3.${AWS::Region}.amazonaws.com",
        "secretsmanager.${AWS::Region}.amazonaws.com",  # the stack's three secrets
    }


# Each secret's key, resource policy and rotation: tests/infra/test_secrets.py.


# --------------------------------------------------------------------------------------------
# Least privilege
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("function", sorted(FUNCTION_FOLDERS))
def test_no_function_policy_uses_wildcard_resources_or_actions(function: str) -> None:
    for action, targets, _ in grants(function):
        assert "*" not in action, f"{function}: wildcard action {action}"
        if "*" in targets:
            assert action in STAR_RESOURCE_ACTIONS, f"{function}: {action} on *"
        assert action != "dynamodb:Scan", f"{function}: request paths never scan"


def test_the_capture_role_can_seal_but_never_decrypt_anything_itself() -> None:
    assert allows("CaptureFunction", "kms:GenerateDataKey", "EngramDataKey")
    for action, targets, statement in grants("CaptureFunction"):
        if action == "kms:Decrypt":
            # only the table key, and only inside DynamoDB / S3 (SSE of the table and bucket)
            assert targets == {"EngramTableKey"}
            assert "kms:ViaService" in statement["Condition"]["StringEquals"]
        assert not ("EngramDataKey" in targets and action != "kms:GenerateDataKey")


@pytest.mark.parametrize("function", ["SearchFunction", "GetFunction"])
def test_search_and_get_open_no_candidate_and_write_nothing(function: str) -> None:
    for action, targets, statement in grants(function):
        if "EngramDataKey" in targets:  # only scope keys of sealed record bodies
            assert (action, _key_class(statement)) == ("kms:Decrypt", "record-scope")
        elif "InvocationKey" in targets:  # the adapter's signature of the call, checked
            assert (action, targets) == ("kms:VerifyMac", {"InvocationKey"})
        elif action.startswith("kms:"):
            assert targets == {"EngramTableKey"}
            assert "kms:ViaService" in statement["Condition"]["StringEquals"]
        if "EngramKeyTable" in targets:  # record and scope key items, never a candidate's
            leading = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
            assert sorted(leading) == ["record:*", "scopekey:*"]
        if action.startswith("dynamodb:"):
            assert action in {"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query"}
        if action.startswith("s3:"):
            assert action in {"s3:GetObject", "s3:ListBucket"}


def test_only_request_admission_may_decrypt_candidates_with_the_data_key() -> None:
    openers = {
        f
        for f in FUNCTION_FOLDERS
        for a, t, statement in grants(f)
        if a == "kms:Decrypt" and "EngramDataKey" in t and _key_class(statement) != "record-scope"
    }
    assert openers == {"RequestAdmissionFunction"}


def test_key_table_access_is_limited_to_the_functions_that_seal_open_or_shred() -> None:
    users = {
        f: {a for a, t, _ in grants(f) if "EngramKeyTable" in t} for f in sorted(FUNCTION_FOLDERS)
    }
    assert {f for f, actions in users.items() if actions} == {
        "CaptureFunction",
        "RequestAdmissionFunction",
        "WithdrawFunction",  # whether the execution destroyed the candidate's key yet
        "WorkflowStepFunction",
        "OutboxDrainerFunction",
        "SearchFunction",  # record keys only (the test above)
        "GetFunction",
        "ApprovalFunction",  # record keys only: a forget's page shows the record's text
    }
    assert users["CaptureFunction"] == {"dynamodb:PutItem"}
    assert users["OutboxDrainerFunction"] == {
        "dynamodb:GetItem",
        "dynamodb:BatchGetItem",
        "dynamodb:DeleteItem",  # what an execution could not destroy, from the outbox
    }
    assert users["WithdrawFunction"] == {"dynamodb:GetItem"}  # the state machine shreds
    for function in ("RequestAdmissionFunction", "WorkflowStepFunction"):
        assert "dynamodb:DeleteItem" in users[function]
    assert not users["ForgetFunction"]  # the state machine destroys the record's key


def test_capture_puts_only_candidate_key_items_and_seals_only_candidate_keys() -> None:
    for action, targets, statement in grants("CaptureFunction"):
        if "EngramKeyTable" in targets:
            leading = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
            assert leading == ["key_*"]
        if "EngramDataKey" in targets:
            assert (action, _key_class(statement)) == ("kms:GenerateDataKey", "candidate")


def test_only_withdraw_and_forget_start_executions_each_of_its_own_machine() -> None:
    starters = {
        (f, frozenset(t))
        for f in FUNCTION_FOLDERS
        for a, t, _ in grants(f)
        if a == "states:StartExecution"
    }
    assert starters == {
        ("WithdrawFunction", frozenset({"WithdrawStateMachine"})),
        ("ForgetFunction", frozenset({"ForgetStateMachine"})),
    }
    for machine in resources("AWS::Serverless::StateMachine"):
        for policy in props(machine).get("Policies", []):
            for statement in as_list(policy.get("Statement", [])):
                assert "states:StartExecution" not in as_list(statement["Action"])


def test_only_the_approval_side_may_answer_task_tokens_and_only_on_star() -> None:
    # SendTask* has no resource type: a grant on a state machine ARN is no grant at all (the
    # gate's IAM simulator: must.use.wildcard). A success commits only with its proof (the
    # commit step verifies it, cloud/proofs.py); a failure only ends the run.
    answering = {
        f: {a for a, t, _ in grants(f) if a.startswith("states:SendTask")} for f in FUNCTION_FOLDERS
    }
    both = {"states:SendTaskSuccess", "states:SendTaskFailure"}
    assert {f: a for f, a in answering.items() if a} == {
        "WithdrawFunction": both,  # the form's approval (or decline), with the retry
        "ForgetFunction": both,
        "ApprovalFunction": {"states:SendTaskSuccess", "states:SendTaskFailure"},  # the page
    }
    for function in answering:
        for action, targets, _ in grants(function):
            if action.startswith("states:SendTask"):
                assert targets == {"*"}, function


def test_the_adapter_may_invoke_exactly_the_six_tools_and_read_the_sealing_secret() -> None:
    invoked = set().union(
        *(t for a, t, _ in grants("McpAdapterFunction") if a == "lambda:InvokeFunction")
    )
    assert invoked == set(TOOL_FUNCTIONS.values())  # on their aliases: test_gradual_deployments
    for function in FUNCTION_FOLDERS:
        if function != "McpAdapterFunction":
            assert not [a for a, _, _ in grants(function) if a.startswith("lambda:")], function
    secrets = {
        t for a, ts, _ in grants("McpAdapterFunction") if a.startswith("secrets") for t in ts
    }
    assert secrets == {"RequestStateSecret"}  # it builds no engine: no cursor key


def test_the_adapter_touches_no_table() -> None:
    # a requestState's single use is the commit's (its nonce is the approval id it consumes)
    assert not [a for a, _, _ in grants("McpAdapterFunction") if a.startswith("dynamodb:")]


APPROVAL_ITEMS: Final = ["APPROVAL_TOKEN#*"]
SPENT_APPROVALS: Final = ["APPROVAL#*"]
TABLE_WRITES: Final = {
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:ConditionCheckItem",
}


def _leading_keys(statement: dict[str, Any]) -> list[str]:
    condition = statement.get("Condition", {}).get("ForAllValues:StringLike", {})
    return [sub_template(k) or str(k) for k in as_list(condition.get("dynamodb:LeadingKeys", []))]


@pytest.mark.parametrize("function", ["WithdrawFunction", "ForgetFunction"])
def test_withdraw_and_forget_write_no_canonical_item_nor_blob(function: str) -> None:
    # the state machine's commit step writes the transition; the tool only hands over approvals
    for action, targets, statement in grants(function):
        if "EngramTable" in targets and action in TABLE_WRITES:
            # take the parked token; spend a declined approval's id; never a scoped item
            assert (action, _leading_keys(statement)) in [
                ("dynamodb:UpdateItem", APPROVAL_ITEMS),
                ("dynamodb:PutItem", SPENT_APPROVALS),
            ], action
        if action.startswith("s3:"):
            assert action in {"s3:GetObject", "s3:ListBucket"}, action
        if "EngramKeyTable" in targets:
            assert action == "dynamodb:GetItem", action


def test_the_approval_function_answers_approvals_and_reads_only_what_the_page_shows() -> None:
    table = [s for a, t, s in grants("ApprovalFunction") if "EngramTable" in t]
    by_keys = {tuple(_leading_keys(s)): s for s in table}
    records, candidates_ = ("S#${TenantId}#*#RECORD#*",), ("S#${TenantId}#*#CANDIDATE#*",)
    assert set(by_keys) == {tuple(APPROVAL_ITEMS), records, candidates_}
    assert set(as_list(by_keys[tuple(APPROVAL_ITEMS)]["Action"])) == {
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
    }
    assert as_list(by_keys[records]["Action"]) == ["dynamodb:GetItem"]
    candidates = by_keys[candidates_]
    assert as_list(candidates["Action"]) == ["dynamodb:GetItem"]
    # a withdraw's candidate: its digest and capture time, never the sealed content
    shown = candidates["Condition"]["ForAllValues:StringEquals"]["dynamodb:Attributes"]
    assert set(shown) == {"principal", "record_digest", "created_at_ms"}
    assert candidates["Condition"]["StringEqualsIfExists"] == {
        "dynamodb:Select": "SPECIFIC_ATTRIBUTES"
    }
    s3 = {a for a, _, _ in grants("ApprovalFunction") if a.startswith("s3:")}
    assert s3 == {"s3:GetObject", "s3:ListBucket"}  # a missing blob is 404 only with ListBucket
    for action, targets, statement in grants("ApprovalFunction"):
        if "EngramDataKey" in targets:  # a forget's record body: its scope key, never a candidate
            assert (action, _key_class(statement)) == ("kms:Decrypt", "record-scope")
        elif "ApprovalProofKey" in targets:  # the proof of a person's approval, made here only
            assert (action, targets) == ("kms:GenerateMac", {"ApprovalProofKey"})
        elif action.startswith("kms:"):
            assert targets == {"EngramTableKey"}
            assert "kms:ViaService" in statement["Condition"]["StringEquals"]
        if "EngramKeyTable" in targets:  # record and scope key items, never a candidate's key
            assert action in {"dynamodb:GetItem", "dynamodb:BatchGetItem"}
            leading = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
            assert sorted(leading) == ["record:*", "scopekey:*"]


@pytest.mark.parametrize("function", ["SearchFunction", "GetFunction"])
def test_search_and_get_read_only_this_tenants_items_and_revocations(function: str) -> None:
    # an allow-list of partition keys: no approval item, no outbox, no other tenant (the gate's
    # IAM step probes each class with the simulator)
    reads = [s for a, t, s in grants(function) if "EngramTable" in t and a.startswith("dynamodb:")]
    assert reads
    for statement in reads:
        keys = set(_leading_keys(statement))
        assert keys == {"S#${TenantId}#*", "REVOKED#${TenantId}#*"}


INDEX_USERS: Final = frozenset(
    {
        "SearchFunction",
        "RequestAdmissionFunction",
        "WorkflowStepFunction",
        "OutboxDrainerFunction",
    }
)
SECURITY_MASTER: Final = "OpenSearchSecurityConfigFunction"
READ_METHODS: Final = frozenset({"es:ESHttpGet", "es:ESHttpHead", "es:ESHttpPost"})


def domain_statements() -> list[dict[str, Any]]:
    statements: list[dict[str, Any]] = props("OpenSearchDomain")["AccessPolicies"]["Statement"]
    return statements


def test_the_opensearch_index_is_reachable_only_by_the_functions_that_use_it() -> None:
    users = {f for f in FUNCTION_FOLDERS for a, _, _ in grants(f) if a.startswith("es:")}
    assert users == INDEX_USERS | {SECURITY_MASTER}
    principals = {
        ref_target(p) for s in domain_statements() for p in as_list(s["Principal"]["AWS"])
    }
    assert principals == {role_of(f) for f in users}
    for statement in domain_statements():
        (role,) = {ref_target(p) for p in as_list(statement["Principal"]["AWS"])}
        (function,) = [f for f in users if role_of(f) == role]
        granted = {a for a, _, _ in grants(function) if a.startswith("es:")}
        assert set(as_list(statement["Action"])) <= granted, function


def test_the_created_domain_runs_fine_grained_access_control_mastered_by_the_custom_resource() -> (
    None
):
    security = props("OpenSearchDomain")["AdvancedSecurityOptions"]
    assert security["Enabled"] is True
    assert security["InternalUserDatabaseEnabled"] is False  # IAM principals only
    assert security["AnonymousAuthEnabled"] is False
    assert set(security["MasterUserOptions"]) == {"MasterUserARN"}  # no master password
    master_role = ref_target(security["MasterUserOptions"]["MasterUserARN"])
    assert master_role == role_of(SECURITY_MASTER)
    trust = props(master_role)["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "lambda.amazonaws.com"}]
    # no function but the custom resource's runs as the master
    assert [f for f in FUNCTION_FOLDERS if role_of(f) == master_role] == [SECURITY_MASTER]
    assert template()["Resources"]["OpenSearchAuditLogGroup"]["Condition"] == "CreateOpenSearch"
    # the security configuration runs in either mode: on a shared domain it maps the stack's
    # roles too (tests/infra/test_tenant_stack.py), as the owner's security manager
    for name in (
        SECURITY_MASTER,
        master_role,
        f"{SECURITY_MASTER}Policy",
        "OpenSearchSecurityConfig",
    ):
        assert "Condition" not in template()["Resources"][name], name


def test_the_master_role_may_only_put_on_the_security_api() -> None:
    allowed = {a for a, _, _ in grants(SECURITY_MASTER)}
    assert allowed == {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "es:ESHttpPut",  # the stack's own domain
        "sts:AssumeRole",  # a shared domain: the owner's security manager, nothing else
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
    }
    # this tenant's roles and mappings (named after its index) and the audit config, no other
    api = "_plugins/_security/api/"
    own = [
        f"{api}roles/engram-${{TenantId}}-records_*",
        f"{api}rolesmapping/engram-${{TenantId}}-records_*",
    ]
    own.append(f"{api}audit/config")
    ((_, _, statement),) = [g for g in grants(SECURITY_MASTER) if g[0] == "es:ESHttpPut"]
    assert [sub_template(r) for r in statement["Resource"]] == [
        "${OpenSearchDomain.Arn}/" + tail for tail in own
    ]
    (master,) = [
        s
        for s in domain_statements()
        if ref_target(s["Principal"]["AWS"]) == role_of(SECURITY_MASTER)
    ]
    assert as_list(master["Action"]) == ["es:ESHttpPut"]
    assert [r["Fn::Sub"][0] for r in master["Resource"]] == [
        "arn:${AWS::Partition}:es:${AWS::Region}:${AWS::AccountId}:domain/${Name}/" + tail
        for tail in own
    ]


def test_the_security_configuration_maps_every_index_user_by_what_its_role_may_send() -> None:
    from engram_memory.cloud.opensearch_security import REVISION

    config = props("OpenSearchSecurityConfig")
    assert template()["Resources"]["OpenSearchSecurityConfig"]["Type"] == (
        "Custom::OpenSearchSecurityConfig"
    )
    assert ref_target(config["ServiceToken"]) == SECURITY_MASTER
    created, existing = config["Endpoint"]["Fn::If"][1:]
    assert sub_template(created) == "https://${OpenSearchDomain.DomainEndpoint}"
    assert existing == {"Ref": "ExistingOpenSearchEndpoint"}
    variables = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert config["Index"] == variables["ENGRAM_OPENSEARCH_INDEX"]
    assert config["Revision"] == REVISION
    readers = {ref_target(arn) for arn in config["ReaderRoleArns"]}
    writers = {ref_target(arn) for arn in config["WriterRoleArns"]}

    def sends(function: str) -> set[str]:
        return {a for a, _, _ in grants(function) if a.startswith("es:")}

    assert readers == {role_of(f) for f in INDEX_USERS if sends(f) <= READ_METHODS}
    assert writers == {role_of(f) for f in INDEX_USERS if not sends(f) <= READ_METHODS}
    assert readers == {role_of("SearchFunction")}
    # GetFunction reads the canonical store only: no IAM access to the domain, no mapping
    assert role_of("GetFunction") not in readers | writers


def test_the_created_domain_encrypts_and_enforces_tls_12() -> None:
    domain = template()["Resources"]["OpenSearchDomain"]
    assert domain["Condition"] == "CreateOpenSearch"
    assert template()["Conditions"]["CreateOpenSearch"] == {
        "Fn::Equals": [{"Ref": "OpenSearchMode"}, "create"]
    }
    domain_props = domain["Properties"]
    assert domain_props["EncryptionAtRestOptions"]["Enabled"] is True
    assert domain_props["NodeToNodeEncryptionOptions"]["Enabled"] is True
    assert domain_props["DomainEndpointOptions"]["EnforceHTTPS"] is True
    assert "TLS-1-2" in domain_props["DomainEndpointOptions"]["TLSSecurityPolicy"]
    endpoint = template()["Globals"]["Function"]["Environment"]["Variables"][
        "ENGRAM_OPENSEARCH_ENDPOINT"
    ]["Fn::If"]
    assert endpoint[0] == "CreateOpenSearch"
    assert endpoint[2] == {"Ref": "ExistingOpenSearchEndpoint"}


# --------------------------------------------------------------------------------------------
# State machines
# --------------------------------------------------------------------------------------------

MACHINES: Final = ("WithdrawStateMachine", "ForgetStateMachine")


def tasks(machine: str) -> dict[str, dict[str, Any]]:
    return {
        name: state
        for name, state in state_machine_definition(machine)["States"].items()
        if state["Type"] == "Task"
    }


@pytest.mark.parametrize("machine", MACHINES)
def test_state_machines_are_standard_logged_traced_and_substituted(machine: str) -> None:
    machine_props = props(machine)
    assert machine_props["Type"] == "STANDARD"
    assert machine_props["Tracing"]["Enabled"] is True
    assert machine_props["Logging"]["IncludeExecutionData"] is False  # no payloads in logs
    (destination,) = machine_props["Logging"]["Destinations"]
    group = ref_target(destination["CloudWatchLogsLogGroup"]["LogGroupArn"])
    assert group is not None
    assert template()["Resources"][group]["Type"] == "AWS::Logs::LogGroup"
    raw = (ROOT / machine_props["DefinitionUri"]).read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{([A-Za-z0-9_]+)\}", raw))
    assert used == set(machine_props["DefinitionSubstitutions"])


@pytest.mark.parametrize("machine", MACHINES)
def test_every_task_retries_and_catches_into_a_fail_state(machine: str) -> None:
    states = state_machine_definition(machine)["States"]
    for name, state in tasks(machine).items():
        assert state.get("Retry") or state.get("Catch"), name
        catch_all = [c for c in state.get("Catch", []) if "States.ALL" in c["ErrorEquals"]]
        assert catch_all, f"{name} has no catch-all"
        assert states[catch_all[0]["Next"]]["Type"] == "Fail", name


@pytest.mark.parametrize("machine", MACHINES)
def test_the_workflow_runs_the_three_steps_in_order_on_the_workflow_function(machine: str) -> None:
    definition = state_machine_definition(machine)
    order = []
    name = definition["StartAt"]
    while name in tasks(machine):
        state = definition["States"][name]
        assert state["Parameters"]["FunctionName"] == "${WorkflowStepFunctionArn}"
        order.append(state["Parameters"]["Payload"]["step"])
        name = state["Next"]
    assert tuple(order) == WORKFLOW_STEPS
    assert definition["States"][name]["Type"] == "Succeed"
    substitution = props(machine)["DefinitionSubstitutions"]["WorkflowStepFunctionArn"]
    assert ref_target(substitution) == "WorkflowStepFunction"


@pytest.mark.parametrize("machine", MACHINES)
def test_the_approval_wait_uses_a_task_token_and_lasts_at_most_300_s(machine: str) -> None:
    (wait,) = [
        s for s in tasks(machine).values() if s["Parameters"]["Payload"]["step"] == "await_approval"
    ]
    assert wait["Resource"] == "arn:aws:states:::lambda:invoke.waitForTaskToken"
    assert wait["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert 0 < wait["TimeoutSeconds"] <= 300


@pytest.mark.parametrize("machine", MACHINES)
def test_the_tail_step_retries_either_outage_with_backoff(machine: str) -> None:
    (tail,) = [
        s for s in tasks(machine).values() if s["Parameters"]["Payload"]["step"] == "finish_tail"
    ]
    (backoff,) = [
        r
        for r in tail["Retry"]
        if r["BackoffRate"] > 1 and r["MaxAttempts"] >= 3 and "IndexUnavailable" in r["ErrorEquals"]
    ]
    assert {"IndexUnavailable", "VaultUnavailable", "StoreUnavailable"} <= set(
        backoff["ErrorEquals"]
    )


@pytest.mark.parametrize("machine", MACHINES)
def test_the_commit_step_checks_the_window_and_expiry_ends_not_approved(machine: str) -> None:
    (commit,) = [
        s
        for s in tasks(machine).values()
        if s["Parameters"]["Payload"]["step"] == "commit_transition"
    ]
    assert commit["Parameters"]["Payload"]["approval.$"] == "$.approval"
    (not_approved,) = [c for c in commit["Catch"] if c["Next"] == "NotApproved"]
    assert {"ApprovalWindowExpired", "GateFailed"} <= set(not_approved["ErrorEquals"])


def test_the_state_machines_invoke_only_the_workflow_function() -> None:
    for machine in MACHINES:
        role = props(machine)["Role"]["Fn::GetAtt"][0]
        assert role == f"{machine}Role"  # its own role: SAM generates none (and no managed policy)
        assert "Policies" not in props(machine) and "ManagedPolicyArns" not in props(role)
        (policy,) = props(role)["Policies"]
        statements = policy["PolicyDocument"]["Statement"]
        invoke = [s for s in statements if "lambda:InvokeFunction" in as_list(s["Action"])]
        assert resource_targets([s["Resource"] for s in invoke]) == {"WorkflowStepFunction"}


# --------------------------------------------------------------------------------------------
# Observability
# --------------------------------------------------------------------------------------------


def test_the_dashboard_body_is_included_from_infra_and_parses_with_the_listed_widgets() -> None:
    transforms = template()["Transform"]
    assert transforms.index("AWS::LanguageExtensions") < transforms.index(
        "AWS::Serverless-2016-10-31"
    )
    path = dashboard_path()
    assert path == ROOT / "infra" / "dashboard.json"
    body = json.loads(path.read_text(encoding="utf-8"))
    titles = [w["properties"].get("title") for w in body["widgets"]]
    for title in DASHBOARD_WIDGETS:
        assert title in titles


def test_every_name_the_dashboard_substitutes_exists_in_the_template() -> None:
    body = json.loads(dashboard_path().read_text(encoding="utf-8"))
    known = set(template()["Resources"]) | set(template()["Parameters"]) | PSEUDO_PARAMETERS
    references = list(intrinsic_references(body))
    assert references
    for kind, name in references:
        if kind == "condition":
            assert name in template()["Conditions"], name
        else:
            assert name in known, name


# The dimension sets the code emits (pinned by the EMF tests in tests/integration: ToolCalls and
# GateFailed in test_tool_handlers, ProjectionLagMs in test_workflow_lambdas). A CloudWatch
# SCHEMA() query matches only metrics with exactly its dimension set.
EMITTED_DIMENSIONS = {
    "ToolCalls": {"service", "tenant", "tool", "code"},
    "GateFailed": {"service", "tenant", "tool"},
    "AdmissionOutcome": {"service", "tenant", "status"},
    "ProjectionLagMs": {"service", "tenant", "workflow"},
    "OutboxOldestAgeSeconds": {"service", "tenant"},
    "OutboxPending": {"service", "tenant"},
    "StoreFaults": {"service", "tenant", "code"},
    "AwsAccessDenied": {"service", "tenant", "aws_service"},  # the per-service series
}
SCHEMA_QUERY = re.compile(r'SELECT \w+\((\w+)\) FROM SCHEMA\("EngramMemory", ([\w, ]+)\)')


def test_every_dashboard_query_matches_the_dimensions_the_code_emits() -> None:
    body = dashboard_path().read_text(encoding="utf-8")
    queries = SCHEMA_QUERY.findall(body.replace('\\"', '"'))
    assert {metric for metric, _ in queries} == set(EMITTED_DIMENSIONS)
    for metric, dimensions in queries:
        assert {d.strip() for d in dimensions.split(",")} == EMITTED_DIMENSIONS[metric], metric
    # ...and each selects only this stack's tenant: another stack's series never shows here.
    assert body.count("FROM SCHEMA(") == body.count("AND tenant = '${TenantId}'") > 0


def alarm_topic(actions: list[Any]) -> str:
    """The one topic an alarm's actions name: the operator's AlarmTopicArn, else the stack's."""
    assert actions == [
        {"Fn::If": ["CreateAlarmTopic", {"Ref": "AlarmTopic"}, {"Ref": "AlarmTopicArn"}]}
    ]
    return "AlarmTopic"


def test_every_function_has_an_errors_alarm_on_the_alarm_topic() -> None:
    alarmed = {
        ref_target(a["Properties"]["Dimensions"][0]["Value"])
        for a in resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == "Errors"
    }
    assert alarmed == set(FUNCTION_FOLDERS) - DEPLOY_TIME_FUNCTIONS


def metric_alarm_targets(metric_name: str) -> set[str]:
    found: set[str | None] = set()
    for alarm in resources("AWS::CloudWatch::Alarm").values():
        assert alarm_topic(alarm["Properties"]["AlarmActions"]) == "AlarmTopic"
        for query in alarm["Properties"].get("Metrics", []):
            metric = query.get("MetricStat", {}).get("Metric", {})
            if metric.get("MetricName") == metric_name:
                found.update(ref_target(d["Value"]) for d in metric["Dimensions"])
    return {f for f in found if f}


def test_throttles_of_both_tables_and_failures_of_both_machines_raise_alarms() -> None:
    assert metric_alarm_targets("ReadThrottleEvents") == {"EngramTable", "EngramKeyTable"}
    assert metric_alarm_targets("WriteThrottleEvents") == {"EngramTable", "EngramKeyTable"}
    assert metric_alarm_targets("ExecutionsFailed") == set(MACHINES)


def test_throttles_of_every_function_raise_alarms() -> None:
    assert metric_alarm_targets("Throttles") == set(FUNCTION_FOLDERS) - DEPLOY_TIME_FUNCTIONS


def alarm_on(metric_name: str) -> dict[str, Any]:
    (alarm,) = [
        a["Properties"] | {"Condition": a.get("Condition")}
        for a in resources("AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("MetricName") == metric_name
    ]
    assert alarm_topic(alarm["AlarmActions"]) == alarm_topic(alarm["OKActions"])
    found: dict[str, Any] = alarm
    return found


def test_http_api_5xx_raises_an_alarm() -> None:
    alarm = alarm_on("5xx")
    assert alarm["Namespace"] == "AWS/ApiGateway"
    dimensions = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
    assert ref_target(dimensions["ApiId"]) == "HttpApi" and dimensions["Stage"] == "$default"


@pytest.mark.parametrize(
    ("metric", "operator", "threshold"),
    [
        ("ClusterStatus.red", "GreaterThanOrEqualToThreshold", 1),
        ("ClusterIndexWritesBlocked", "GreaterThanOrEqualToThreshold", 1),
        ("ClusterStatus.yellow", "GreaterThanOrEqualToThreshold", 1),
        (
            "JVMMemoryPressure",
            "GreaterThanOrEqualToThreshold",
            {"Ref": "OpenSearchJvmPressureAlarmPercent"},
        ),
        (
            "FreeStorageSpace",
            "LessThanOrEqualToThreshold",
            {"Ref": "OpenSearchFreeStorageAlarmMiB"},
        ),
    ],
)
def test_the_created_opensearch_domain_has_health_alarms(
    metric: str, operator: str, threshold: Any
) -> None:
    alarm = alarm_on(metric)
    assert alarm["Namespace"] == "AWS/ES" and alarm["Condition"] == "CreateOpenSearch"
    dimensions = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
    assert ref_target(dimensions["DomainName"]) == "OpenSearchDomain"
    assert dimensions["ClientId"] == {"Ref": "AWS::AccountId"}
    assert (alarm["ComparisonOperator"], alarm["Threshold"]) == (operator, threshold)


def test_the_outbox_age_alarm_reads_the_metric_the_drainer_emits() -> None:
    alarm = alarm_on("OutboxOldestAgeSeconds")
    environment = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert alarm["Namespace"] == environment["POWERTOOLS_METRICS_NAMESPACE"]
    assert alarm["Dimensions"] == [
        {"Name": "service", "Value": environment["POWERTOOLS_SERVICE_NAME"]},
        {"Name": "tenant", "Value": {"Ref": "TenantId"}},
    ]
    assert alarm["Threshold"] == {"Ref": "OutboxAgeAlarmSeconds"}
    assert alarm["TreatMissingData"] == "breaching"  # a drainer that stopped reporting alarms


# The failure alarms of issue 34: (metric, its code dimension, period, evaluation periods,
# datapoints to alarm). A refusal and a corrupt journal page at once; STORE_UNAVAILABLE is
# retriable, so it pages when at least 3 of the last 5 minutes had one, whatever the traffic.
FAILURE_ALARMS: Final = {
    "AwsAccessDeniedAlarm": ("AwsAccessDenied", None, 300, 1, 1),
    "StoreUnavailableAlarm": ("StoreFaults", "STORE_UNAVAILABLE", 60, 5, 3),
    "JournalCorruptAlarm": ("StoreFaults", "JOURNAL_CORRUPT", 300, 1, 1),
}


@pytest.mark.parametrize("name", sorted(FAILURE_ALARMS))
def test_the_failure_alarms_read_the_tenants_series_and_say_what_to_check_first(
    name: str,
) -> None:
    metric, code, period, evaluations, datapoints = FAILURE_ALARMS[name]
    alarm = props(name)
    environment = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert (alarm["Namespace"], alarm["MetricName"]) == (
        environment["POWERTOOLS_METRICS_NAMESPACE"],
        metric,
    )
    dimensions = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
    assert dimensions == {
        "service": environment["POWERTOOLS_SERVICE_NAME"],
        "tenant": {"Ref": "TenantId"},
        **({"code": code} if code else {}),
    }
    assert (alarm["Statistic"], alarm["Period"], alarm["EvaluationPeriods"]) == (
        "Sum",
        period,
        evaluations,
    )
    assert alarm.get("DatapointsToAlarm", evaluations) == datapoints
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (
        1,
        "GreaterThanOrEqualToThreshold",
    )
    assert alarm["TreatMissingData"] == "notBreaching"  # no call, no fault: nothing to page
    assert alarm_topic(alarm["AlarmActions"]) == alarm_topic(alarm["OKActions"])
    description = sub_template(alarm["AlarmDescription"]) or alarm["AlarmDescription"]
    assert "Check first:" in description and len(description) <= 1024


def test_the_key_state_rule_watches_the_stacks_two_keys_and_publishes_to_the_alarm_topic() -> None:
    rule = props("KmsKeyStateRule")
    assert rule["State"] == "ENABLED"
    pattern = rule["EventPattern"]
    api_calls, deletion = pattern["$or"]
    assert pattern["source"] == ["aws.kms"]
    assert api_calls["detail-type"] == ["AWS API Call via CloudTrail"]
    assert api_calls["detail"]["eventName"] == ["DisableKey", "ScheduleKeyDeletion"]
    assert api_calls["detail"]["errorCode"] == [{"exists": False}]
    keys = api_calls["detail"]["requestParameters"]["keyId"]
    assert {json.dumps(k, sort_keys=True) for k in keys} == {
        json.dumps(value, sort_keys=True)
        for key in ("EngramTableKey", "EngramDataKey")
        for value in ({"Ref": key}, {"Fn::GetAtt": [key, "Arn"]})
    }
    assert deletion["detail-type"] == ["KMS CMK Deletion"]
    assert {ref_target(k) for k in deletion["resources"]} == {"EngramTableKey", "EngramDataKey"}
    (target,) = rule["Targets"]
    assert alarm_topic([target["Arn"]]) == "AlarmTopic"


def test_the_stacks_topic_admits_only_its_alarms_and_its_key_state_rule() -> None:
    policy = resources("AWS::SNS::TopicPolicy")["AlarmTopicPolicy"]
    assert policy["Condition"] == "CreateAlarmTopic"  # never rewrites an operator's topic
    assert [ref_target(t) for t in policy["Properties"]["Topics"]] == ["AlarmTopic"]
    alarms, rule = policy["Properties"]["PolicyDocument"]["Statement"]
    for statement in (alarms, rule):
        assert statement["Effect"] == "Allow" and statement["Action"] == "sns:Publish"
        assert ref_target(statement["Resource"]) == "AlarmTopic"
    assert alarms["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    source = sub_template(alarms["Condition"]["ArnLike"]["aws:SourceArn"])
    assert source is not None and source.endswith(":alarm:engram-${TenantId}-*")
    assert alarms["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    # every alarm of the stack is one the statement admits (else its notifications are dropped)
    prefix = source.rsplit(":", 1)[1].rstrip("*")
    for name, alarm in resources("AWS::CloudWatch::Alarm").items():
        assert str(sub_template(alarm["Properties"]["AlarmName"])).startswith(prefix), name
    assert rule["Principal"] == {"Service": "events.amazonaws.com"}
    assert rule["Condition"] == {
        "ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["KmsKeyStateRule", "Arn"]}}
    }


def test_the_drainer_runs_every_minute_and_has_its_event_samples() -> None:
    events = function_props("OutboxDrainerFunction")["Events"]
    assert [e["Properties"]["Schedule"] for e in events.values() if e["Type"] == "Schedule"] == [
        "rate(1 minute)"
    ]
    for sample in ("outbox_drainer.json", "outbox_drainer_reindex.json"):
        assert (ROOT / "events" / sample).is_file()


@pytest.mark.parametrize(
    ("parameter", "functions"),
    [
        ("ToolReservedConcurrency", sorted(TOOL_FUNCTIONS.values())),
        ("AdapterReservedConcurrency", ["McpAdapterFunction"]),
    ],
)
def test_reserved_concurrency_is_reserved_by_default_and_zero_or_empty_means_unreserved(
    parameter: str, functions: list[str]
) -> None:
    """Reserved by default: one tenant cannot take the account's pool (its budget and how many
    tenants fit: scripts/tenant_quotas.py, docs "Many tenants in one account")."""
    declared = template()["Parameters"][parameter]
    assert int(declared["Default"]) > 0 and declared["AllowedPattern"] == "^[0-9]*$"
    conditions = {
        name
        for name, body in template()["Conditions"].items()
        if body
        == {
            "Fn::Not": [
                {
                    "Fn::Or": [
                        {"Fn::Equals": [{"Ref": parameter}, ""]},
                        {"Fn::Equals": [{"Ref": parameter}, "0"]},
                    ]
                }
            ]
        }
    }
    (condition,) = conditions
    for function in functions:
        assert function_props(function)["ReservedConcurrentExecutions"] == {
            "Fn::If": [condition, {"Ref": parameter}, {"Ref": "AWS::NoValue"}]
        }


def test_the_alarm_email_subscription_is_optional() -> None:
    subscription = resources("AWS::SNS::Subscription")["AlarmEmailSubscription"]
    assert template()["Conditions"][subscription["Condition"]] == {
        "Fn::And": [
            {"Condition": "CreateAlarmTopic"},
            {"Fn::Not": [{"Fn::Equals": [{"Ref": "AlarmEmail"}, ""]}]},
        ]
    }
    assert ref_target(subscription["Properties"]["TopicArn"]) == "AlarmTopic"


def test_the_outputs_publish_the_urls_and_names_operators_need() -> None:
    outputs = template()["Outputs"]
    assert str(sub_template(outputs["McpUrl"]["Value"])).endswith("/mcp")
    metadata = str(sub_template(outputs["ProtectedResourceMetadataUrl"]["Value"]))
    assert metadata.endswith("/.well-known/oauth-protected-resource/mcp")
    assert ref_target(outputs["EngramTableName"]["Value"]) == "EngramTable"
    assert ref_target(outputs["EngramKeyTableName"]["Value"]) == "EngramKeyTable"
    assert ref_target(outputs["EngramBlobBucketName"]["Value"]) == "EngramBlobBucket"
    assert ref_target(outputs["DashboardName"]["Value"]) == "Dashboard"


def test_the_secrets_are_generated_64_characters_long() -> None:
    for secret in ("RequestStateSecret", "CursorSecret"):
        assert props(secret)["GenerateSecretString"]["PasswordLength"] == 64


# --------------------------------------------------------------------------------------------
# samconfig.toml
# --------------------------------------------------------------------------------------------


def overrides(env: str) -> dict[str, str]:
    config = tomllib.loads(SAMCONFIG_PATH.read_text(encoding="utf-8"))
    raw = config[env]["deploy"]["parameters"]["parameter_overrides"]
    pairs = raw if isinstance(raw, list) else raw.split()
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.mark.parametrize("env", ["default", "acme"])
def test_every_samconfig_override_is_a_valid_template_parameter(env: str) -> None:
    parameters = template()["Parameters"]
    values = overrides(env)
    required = {name for name, p in parameters.items() if "Default" not in p}
    assert required <= set(values)
    for name, value in values.items():
        parameter = parameters[name]
        if "AllowedPattern" in parameter:
            assert re.fullmatch(parameter["AllowedPattern"], value), (name, value)
        if "AllowedValues" in parameter:
            assert value in [str(v) for v in parameter["AllowedValues"]], (name, value)


def test_the_acme_tenant_creates_its_own_opensearch_domain() -> None:
    assert overrides("acme")["TenantId"] == "acme"
    assert overrides("acme")["OpenSearchMode"] == "create"


@pytest.mark.parametrize("env", ["default", "acme"])
def test_deploys_acknowledge_the_transforms_the_template_uses(env: str) -> None:
    config = tomllib.loads(SAMCONFIG_PATH.read_text(encoding="utf-8"))
    capabilities = config[env]["deploy"]["parameters"]["capabilities"].split()
    assert "CAPABILITY_IAM" in capabilities
    assert "CAPABILITY_AUTO_EXPAND" in capabilities  # AWS::LanguageExtensions + AWS::Include


@pytest.mark.parametrize("env", ["default", "acme"])
def test_deploys_hand_cloudformation_the_deploy_role_and_name_a_client_id(env: str) -> None:
    config = tomllib.loads(SAMCONFIG_PATH.read_text(encoding="utf-8"))
    values = overrides(env)
    # KMS refuses a key policy that locks out its creator: the creator is DeployRoleArn
    assert config[env]["deploy"]["parameters"]["role_arn"] == values["DeployRoleArn"]
    assert values["DeployRoleArn"] != values["KeyAdminRoleArn"]
    # the approval page's client id at the issuer (an ID token's aud), not a URL
    assert not values["ApprovalAudience"].startswith(("https://", "http://"))
    assert values["ApprovalAudience"] != values["Audience"]


# --------------------------------------------------------------------------------------------
# Proofs (cloud/proofs.py): who may make them, who checks them
# --------------------------------------------------------------------------------------------

PROOF_KEYS = {
    # key: (the one role that may GenerateMac, the roles that may VerifyMac)
    "ApprovalProofKey": ({"ApprovalFunction"}, {"WorkflowStepFunction"}),
    "InvocationKey": (
        {"McpAdapterFunction"},
        {
            "SearchFunction",
            "GetFunction",
            "CaptureFunction",
            "RequestAdmissionFunction",
            "WithdrawFunction",
            "ForgetFunction",
            "WorkflowStepFunction",
        },
    ),
}


@pytest.mark.parametrize("key", sorted(PROOF_KEYS))
def test_each_proof_key_is_made_by_one_role_and_checked_by_those_that_act_on_it(key: str) -> None:
    makers, checkers = PROOF_KEYS[key]
    assert props(key)["KeySpec"] == "HMAC_256"
    assert props(key)["KeyUsage"] == "GENERATE_VERIFY_MAC"
    functions = sorted(resources("AWS::Serverless::Function"))
    made_by = {f for f in functions if allows(f, "kms:GenerateMac", key)}
    checked_by = {f for f in functions if allows(f, "kms:VerifyMac", key)}
    assert (made_by, checked_by) == (makers, checkers)
    # the key policy names the same roles, for the same actions, and nothing else may use it
    used = {
        (action, principal)
        for action, principals, _ in key_policy_grants(key)
        for principal in principals
        if action in ("kms:GenerateMac", "kms:VerifyMac")
    }
    assert used == {("kms:GenerateMac", role_of(f)) for f in makers} | {
        ("kms:VerifyMac", role_of(f)) for f in checkers
    }
    for action, _, statement in key_policy_grants(key):
        if action.startswith("kms:") and "Mac" in action:
            assert statement["Condition"]["StringEquals"]["kms:MacAlgorithm"] == "HMAC_SHA_256"
    # no role policy anywhere grants a MAC action on "*"
    for function in functions:
        for action, targets, _ in grants(function):
            assert not ("Mac" in action and "*" in targets), (function, action)


def test_every_function_is_told_its_proof_keys_and_whether_the_page_is_required() -> None:
    variables = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["ENGRAM_INVOCATION_KEY_ARN"] == {"Fn::GetAtt": ["InvocationKey", "Arn"]}
    assert variables["ENGRAM_APPROVAL_PROOF_KEY_ARN"] == {"Fn::GetAtt": ["ApprovalProofKey", "Arn"]}
    assert variables["ENGRAM_APPROVAL_PAGE_REQUIRED"] == {"Ref": "RequireApprovalPage"}
    assert template()["Parameters"]["RequireApprovalPage"]["Default"] == "false"


def test_approval_requests_are_announced_by_the_functions_that_start_them() -> None:
    functions = sorted(resources("AWS::Serverless::Function"))
    publishers = {f for f in functions if allows(f, "sns:Publish", "ApprovalRequestTopic")}
    assert publishers == {"WithdrawFunction", "ForgetFunction"}
    topic = props("ApprovalRequestTopic")
    assert topic["KmsMasterKeyId"] == "alias/aws/sns"
    subscription = resources("AWS::SNS::Subscription")["ApprovalRequestEmailSubscription"]
    assert subscription["Condition"] == "HasApprovalEmail"
    assert ref_target(subscription["Properties"]["TopicArn"]) == "ApprovalRequestTopic"


def test_a_failed_first_deploy_leaves_nothing_behind_and_updates_keep_the_data() -> None:
    """Retained resources are retained on delete and replacement, never after a failed create:
    a retry for the tenant would otherwise fail on what the first attempt left (the operator
    audit log group's fixed name)."""
    retained = {
        name: r
        for name, r in template()["Resources"].items()
        if str(r.get("DeletionPolicy", "Delete")).startswith("Retain")
    }
    assert "OperatorAuditLogGroup" in retained and "EngramTable" in retained
    for name, resource in retained.items():
        assert resource["DeletionPolicy"] == "RetainExceptOnCreate", name
        assert resource["UpdateReplacePolicy"] == "Retain", name


def test_the_search_domain_upgrades_in_place_and_its_storage_is_a_parameter() -> None:
    domain = template()["Resources"]["OpenSearchDomain"]
    assert domain["UpdatePolicy"] == {"EnableVersionUpgrade": True}
    assert domain["Properties"]["EBSOptions"]["VolumeSize"] == {"Ref": "OpenSearchVolumeGiB"}
    volume = template()["Parameters"]["OpenSearchVolumeGiB"]
    assert (volume["Default"], volume["MinValue"]) == (10, 10)


# --------------------------------------------------------------------------------------------
# Alarms an on-call person can use (issue 36, item 6)
# --------------------------------------------------------------------------------------------

# One event is the incident for these; every other alarm needs a repeat before it pages.
ONE_EVENT_PAGES = {
    "AwsAccessDeniedAlarm",  # a permission changed
    "JournalCorruptAlarm",  # a stored item no longer matches its digest
    "WithdrawExecutionsFailedAlarm",  # failed after the machine's own retries
    "ForgetExecutionsFailedAlarm",
    "OpenSearchClusterRedAlarm",
    "OpenSearchWritesBlockedAlarm",
    "OpenSearchFreeStorageAlarm",  # a level, not an event
    "OutboxAgeAlarm",  # an age past its threshold, not an event
    "SecretRotationErrorsAlarm",  # runs every SecretRotationDays
    "SecretRotationThrottlesAlarm",
}


def test_every_alarm_names_its_runbook_and_the_runbook_exists() -> None:
    guide = (ROOT / "docs" / "deploying-aws.md").read_text(encoding="utf-8")
    alarms = resources("AWS::CloudWatch::Alarm")
    assert len(alarms) >= 30
    for name, alarm in alarms.items():
        description = alarm["Properties"]["AlarmDescription"]
        text = description["Fn::Sub"] if isinstance(description, dict) else description
        text = text[0] if isinstance(text, list) else text
        found = re.search(r"Runbook: \$\{RunbookUrl\}#(alarm-[a-z0-9-]+)$", text.strip())
        assert found, name
        assert f'<a id="{found.group(1)}"></a>' in guide, (name, found.group(1))


def test_no_alarm_pages_on_one_event_unless_one_event_is_the_incident() -> None:
    for name, alarm in resources("AWS::CloudWatch::Alarm").items():
        spec = alarm["Properties"]
        needed = int(spec.get("DatapointsToAlarm", spec["EvaluationPeriods"]))
        if name in ONE_EVENT_PAGES:
            continue
        assert needed >= 2 or int(spec["EvaluationPeriods"]) >= 3, name


def test_the_production_profile_refuses_an_alarm_topic_nobody_reads() -> None:
    rule = template()["Rules"]["ProductionAlarmsReachSomeone"]
    assert rule["RuleCondition"] == {"Fn::Equals": [{"Ref": "OpenSearchProfile"}, "production"]}
    (assertion,) = rule["Assertions"]
    assert assertion["Assert"] == {
        "Fn::Not": [
            {
                "Fn::And": [
                    {"Fn::Equals": [{"Ref": "AlarmEmail"}, ""]},
                    {"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]},
                ]
            }
        ]
    }

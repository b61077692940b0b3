"""The optional Cognito user pool and the optional WAF distribution, on the SAM-translated
template (issue 25, items 4 and 6), with the conditions decided as CloudFormation would
(``scripts.cloud_template.deployed``):

- ``CreateCognitoUserPool=true``: the pool, its trigger, the agents' group, the two app clients
  and the domain exist, and only then; the trigger's invoke permission names this pool only; the
  functions and the JWT authorizer trust the pool's issuer and the agent client's id;
- ``WebAclArn``: a CloudFront distribution carrying the ACL fronts the HTTP API, and only then.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Final

from scripts.cloud_template import deployed, translate

ROOT: Final = Path(__file__).resolve().parents[2]
POOL: Final = {"CreateCognitoUserPool": "true"}
WEB_ACL: Final = (
    "arn:aws:wafv2:us-east-1:123456789012:global/webacl/engram/0a1b2c3d-1111-4222-8333-444455556666"
)
EDGE_CERT: Final = "arn:aws:acm:us-east-1:123456789012:certificate/0a1b2c3d-1111-4222-8333-4444"
POOL_RESOURCES: Final = {
    "CognitoUserPool",
    "CognitoAgentsGroup",
    "CognitoAgentClient",
    "CognitoApprovalClient",
    "CognitoUserPoolDomain",
    "CognitoClaimsInvokedByCognito",
    "CognitoClaimsFunction",
    "CognitoClaimsFunctionRole",
    "CognitoClaimsFunctionPolicy",
    "CognitoClaimsFunctionLogGroup",
    "CognitoClaimsErrorsAlarm",
    "CognitoClaimsThrottlesAlarm",
}
POOL_ISSUER: Final = {
    "Fn::Sub": "https://cognito-idp.${AWS::Region}.${AWS::URLSuffix}/${CognitoUserPool}"
}


@cache
def translated() -> dict[str, Any]:
    return translate(ROOT / "template.yaml")


def stack(**given: str) -> dict[str, dict[str, Any]]:
    return deployed(translated(), **given)


def jwt_configuration(resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    body = resources["HttpApi"]["Properties"]["Body"]
    schemes = body["components"]["securitySchemes"]
    found: dict[str, Any] = schemes["EngramJwtAuthorizer"]["x-amazon-apigateway-authorizer"][
        "jwtConfiguration"
    ]
    return found


def tool_environment(resources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = resources["SearchFunction"]["Properties"]["Environment"]["Variables"]
    return found


def test_the_pool_and_its_trigger_exist_only_when_asked_for() -> None:
    assert not POOL_RESOURCES & set(stack())
    assert set(stack(**POOL)) >= POOL_RESOURCES
    trigger = stack(**POOL)["CognitoUserPool"]["Properties"]["LambdaConfig"]
    assert trigger == {
        "PreTokenGenerationConfig": {
            "LambdaArn": {"Fn::GetAtt": ["CognitoClaimsFunction", "Arn"]},
            "LambdaVersion": "V2_0",  # engram_tools is a list: V1_0 adds strings only
        }
    }


def test_the_triggers_invoke_permission_is_scoped_to_the_pool() -> None:
    resources = stack(**POOL)
    permissions = {
        name: body["Properties"]
        for name, body in resources.items()
        if body["Type"] == "AWS::Lambda::Permission"
        and body["Properties"]["FunctionName"] == {"Fn::GetAtt": ["CognitoClaimsFunction", "Arn"]}
    }
    assert permissions == {
        "CognitoClaimsInvokedByCognito": {
            "FunctionName": {"Fn::GetAtt": ["CognitoClaimsFunction", "Arn"]},
            "Action": "lambda:InvokeFunction",
            "Principal": "cognito-idp.amazonaws.com",
            "SourceAccount": {"Ref": "AWS::AccountId"},
            "SourceArn": {"Fn::GetAtt": ["CognitoUserPool", "Arn"]},
        }
    }


def test_the_trigger_may_write_its_own_logs_and_traces_only() -> None:
    policy = stack(**POOL)["CognitoClaimsFunctionPolicy"]["Properties"]["PolicyDocument"]
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert actions == {
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "xray:PutTraceSegments",
        "xray:PutTelemetryRecords",
    }


def test_the_functions_and_the_authorizer_trust_the_created_pool() -> None:
    jwt = jwt_configuration(stack(**POOL))
    assert jwt["issuer"] == POOL_ISSUER
    assert jwt["audience"] == [{"Ref": "Audience"}, {"Ref": "CognitoAgentClient"}]
    env = tool_environment(stack(**POOL))
    assert env["ENGRAM_ISSUER"] == POOL_ISSUER
    assert env["ENGRAM_AUDIENCE_ALIASES"]["Fn::Join"][1][0] == {"Ref": "CognitoAgentClient"}
    assert env["ENGRAM_APPROVAL_AUDIENCE"] == {"Ref": "CognitoApprovalClient"}
    page = stack(**POOL)["ApprovalFunction"]["Properties"]["Environment"]["Variables"]
    assert page["ENGRAM_APPROVER_GROUPS_CLAIM"] == "cognito:groups"
    assert page["ENGRAM_AGENTS_GROUP"] == "engram-agents"  # the pool's group of agents
    assert stack(**POOL)["CognitoAgentsGroup"]["Properties"]["GroupName"] == "engram-agents"
    # without the pool: the operator's issuer and clients, the pool named nowhere
    assert jwt_configuration(stack())["issuer"] == {"Ref": "IssuerUrl"}
    assert tool_environment(stack())["ENGRAM_ISSUER"] == {"Ref": "IssuerUrl"}
    assert "Cognito" not in str(tool_environment(stack()))


def test_the_approval_client_is_a_public_pkce_client_of_the_callback_only() -> None:
    client = stack(**POOL)["CognitoApprovalClient"]["Properties"]
    assert client["GenerateSecret"] is False
    assert client["AllowedOAuthFlows"] == ["code"] and client["AllowedOAuthScopes"] == ["openid"]
    (callback,) = client["CallbackURLs"]
    assert callback["Fn::Sub"][0] == "https://${Host}/approvals/callback"


def test_no_app_client_may_write_an_agents_binding_and_nobody_signs_up() -> None:
    resources = stack(**POOL)
    for name in ("CognitoAgentClient", "CognitoApprovalClient"):
        written = resources[name]["Properties"].get("WriteAttributes", [])
        assert not [a for a in written if a.startswith("custom:")], name
    pool = resources["CognitoUserPool"]["Properties"]
    assert pool["AdminCreateUserConfig"]["AllowAdminCreateUserOnly"] is True
    assert {a["Name"] for a in pool["Schema"]} == {
        "engram_workspace",
        "engram_purpose",
        "engram_tools",
        "engram_approver",  # who approves for the agent: no agent names its own approver
    }


def test_the_trigger_cannot_depend_on_the_pool_it_serves() -> None:
    env = stack(**POOL)["CognitoClaimsFunction"]["Properties"]["Environment"]["Variables"]
    assert "CognitoUserPool" not in str(env) and "CognitoAgentClient" not in str(env)
    assert env["ENGRAM_TENANT_ID"] == {"Ref": "TenantId"}


def test_the_web_acl_fronts_the_api_through_cloudfront_only_when_named() -> None:
    assert "EdgeDistribution" not in stack()
    config = stack(WebAclArn=WEB_ACL)["EdgeDistribution"]["Properties"]["DistributionConfig"]
    assert config["WebACLId"] == {"Ref": "WebAclArn"}
    (origin,) = config["Origins"]
    assert origin["DomainName"] == {
        "Fn::Sub": "${HttpApi}.execute-api.${AWS::Region}.${AWS::URLSuffix}"
    }
    assert origin["CustomOriginConfig"]["OriginProtocolPolicy"] == "https-only"
    behaviour = config["DefaultCacheBehavior"]
    assert behaviour["ViewerProtocolPolicy"] == "https-only"
    assert {"POST", "GET", "DELETE", "OPTIONS"} <= set(behaviour["AllowedMethods"])
    # nothing cached; every viewer header but Host (Authorization too) reaches the API
    assert behaviour["CachePolicyId"] == "4135ea2d-6df8-44a3-9df3-4b5a84be39ad"
    assert behaviour["OriginRequestPolicyId"] == "b689b0a8-53d0-40ab-baf2-68738e2966ac"
    assert "Aliases" not in config
    assert config["ViewerCertificate"] == {"CloudFrontDefaultCertificate": True}


def test_the_custom_domain_moves_to_the_distribution_with_its_us_east_1_certificate() -> None:
    config = stack(
        WebAclArn=WEB_ACL, CustomDomainName="memory.acme.example", EdgeCertificateArn=EDGE_CERT
    )["EdgeDistribution"]["Properties"]["DistributionConfig"]
    assert config["Aliases"] == [{"Ref": "CustomDomainName"}]
    assert config["ViewerCertificate"] == {
        "AcmCertificateArn": {"Ref": "EdgeCertificateArn"},
        "SslSupportMethod": "sni-only",
        "MinimumProtocolVersion": "TLSv1.2_2021",
    }

"""A tenant stack among many, on the SAM-translated template (issue 25, items 1, 3 and 7).

Each check evaluates the translated template's conditions for given parameter values (the
defaults otherwise), as CloudFormation would, then reads the resources that remain:

- telemetry: every custom metric an alarm or the dashboard reads is selected by the stack's
  ``tenant`` dimension; the dashboard has the HTTP API widgets; every alarm goes to one topic,
  the operator's when named;
- the two OpenSearch profiles (``dev`` one node, replicas 0; ``production`` three AZs with zone
  awareness, replicas 1, optional dedicated masters), both encrypted, with fine-grained access
  and an access policy naming only the stack's roles; a per-tenant index name;
- the optional custom domain and the core layer's versions not retained.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest

from scripts.cloud_template import (
    _packaged,
    deployed,
    load_template,
    refusals,
    role_statements,
    translate,
)

ROOT: Final = Path(__file__).resolve().parents[2]
TEMPLATE: Final = ROOT / "template.yaml"
OPERATOR_TOPIC: Final = "arn:aws:sns:eu-west-1:123456789012:engram-operators"


@cache
def translated() -> dict[str, Any]:
    return translate(TEMPLATE)


def stack(**given: str) -> dict[str, dict[str, Any]]:
    """The resources CloudFormation creates for these parameter values, intrinsics decided."""
    return deployed(translated(), **given)


def of_type(resources: dict[str, dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {name: body for name, body in resources.items() if body["Type"] == kind}


def environment(resources: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        f["Properties"]["Environment"]["Variables"]
        for f in of_type(resources, "AWS::Lambda::Function").values()
        if "ENGRAM_OPENSEARCH_INDEX" in f["Properties"].get("Environment", {}).get("Variables", {})
    ]


# --------------------------------------------------------------------------------------------
# 1. Telemetry that does not mix tenants
# --------------------------------------------------------------------------------------------


def _metric_queries(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    properties = alarm["Properties"]
    if "MetricName" in properties:
        return [properties]
    return [q["MetricStat"]["Metric"] for q in properties["Metrics"] if "MetricStat" in q]


def test_every_alarm_on_a_custom_metric_selects_the_stacks_tenant() -> None:
    custom = [
        metric
        for alarm in of_type(stack(), "AWS::CloudWatch::Alarm").values()
        for metric in _metric_queries(alarm)
        if not metric["Namespace"].startswith("AWS/")
    ]
    assert custom
    for metric in custom:
        assert {"Name": "tenant", "Value": {"Ref": "TenantId"}} in metric["Dimensions"], metric


def _dashboard() -> dict[str, Any]:
    packaged = _packaged(load_template(TEMPLATE), ROOT)["Resources"]
    body: dict[str, Any] = packaged["Dashboard"]["Properties"]["DashboardBody"]["Fn::ToJsonString"]
    return body


def test_every_dashboard_query_of_a_custom_metric_selects_the_stacks_tenant() -> None:
    text = json.dumps(_dashboard())
    queries = re.findall(r'SELECT [^"]*?FROM SCHEMA\(\\"EngramMemory\\"[^"]*', text)
    assert len(queries) >= 6
    for query in queries:
        assert "tenant = '${TenantId}'" in query, query


def test_the_dashboard_shows_the_http_apis_requests_errors_and_p99_latency() -> None:
    shown = set()
    for widget in _dashboard()["widgets"]:
        for row in widget["properties"].get("metrics", []):
            if row and row[0] == "AWS/ApiGateway":
                assert row[2:6] == ["ApiId", {"Ref": "HttpApi"}, "Stage", "$default"], row
                shown.add((row[1], row[-1].get("stat", widget["properties"]["stat"])))
    assert {("Count", "Sum"), ("4xx", "Sum"), ("5xx", "Sum"), ("Latency", "p99")} <= shown


# The stack's own alarm topic, or the operator's (AlarmTopicArn): what every alarm names.
TOPICS: Final = [
    ({}, {"Ref": "AlarmTopic"}),
    ({"AlarmTopicArn": OPERATOR_TOPIC}, {"Ref": "AlarmTopicArn"}),
]


@pytest.mark.parametrize(("given", "topic"), TOPICS)
def test_every_alarm_goes_to_one_topic_the_operators_when_named(
    given: dict[str, str], topic: Any
) -> None:
    resources = stack(**given)
    assert ("AlarmTopic" in resources) == (not given)
    alarms = of_type(resources, "AWS::CloudWatch::Alarm").values()
    assert len(alarms) > 20
    for alarm in alarms:
        assert alarm["Properties"]["AlarmActions"] == [topic] == alarm["Properties"]["OKActions"]


@pytest.mark.parametrize(("given", "topic"), TOPICS)
def test_the_key_state_rule_publishes_to_the_same_topic_whose_policy_only_the_stack_writes(
    given: dict[str, str], topic: Any
) -> None:
    resources = stack(**given)
    rule = resources["KmsKeyStateRule"]
    assert [t["Arn"] for t in rule["Properties"]["Targets"]] == [topic]
    # the stack's own topic gets its policy; an operator's topic keeps the operator's
    policies = of_type(resources, "AWS::SNS::TopicPolicy")
    assert list(policies) == ([] if given else ["AlarmTopicPolicy"])


# --------------------------------------------------------------------------------------------
# 3. Two OpenSearch profiles, a per-tenant index
# --------------------------------------------------------------------------------------------


def _domain(**given: str) -> dict[str, Any]:
    (domain,) = of_type(stack(**given), "AWS::OpenSearchService::Domain").values()
    properties: dict[str, Any] = domain["Properties"]
    return properties


def test_the_dev_profile_is_one_node_with_no_replica() -> None:
    cluster = _domain()["ClusterConfig"]
    assert cluster["InstanceCount"] == 1
    assert cluster["ZoneAwarenessEnabled"] is False and "ZoneAwarenessConfig" not in cluster
    assert cluster["DedicatedMasterEnabled"] is False
    assert {env["ENGRAM_OPENSEARCH_REPLICAS"] for env in environment(stack())} == {"0"}


@pytest.mark.parametrize("masters", ["false", "true"])
def test_the_production_profile_spans_three_zones_with_one_replica(masters: str) -> None:
    given = {"OpenSearchProfile": "production", "OpenSearchDedicatedMasters": masters}
    cluster = _domain(**given)["ClusterConfig"]
    assert cluster["InstanceCount"] == 3
    assert cluster["ZoneAwarenessEnabled"] is True
    assert cluster["ZoneAwarenessConfig"] == {"AvailabilityZoneCount": 3}
    assert cluster["DedicatedMasterEnabled"] is (masters == "true")
    if masters == "true":
        assert cluster["DedicatedMasterCount"] == 3
        assert cluster["DedicatedMasterType"] == {"Ref": "OpenSearchMasterInstanceType"}
    assert {env["ENGRAM_OPENSEARCH_REPLICAS"] for env in environment(stack(**given))} == {"1"}
    alarms = {
        a["Properties"]["MetricName"]
        for a in of_type(stack(**given), "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("Namespace") == "AWS/ES"
    }
    assert ("MasterJVMMemoryPressure" in alarms) is (masters == "true")


@pytest.mark.parametrize("profile", ["dev", "production"])
def test_each_profile_is_encrypted_fine_grained_and_reachable_only_by_the_stacks_roles(
    profile: str,
) -> None:
    domain = _domain(OpenSearchProfile=profile)
    assert domain["EncryptionAtRestOptions"] == {"Enabled": True}
    assert domain["NodeToNodeEncryptionOptions"] == {"Enabled": True}
    assert domain["DomainEndpointOptions"]["EnforceHTTPS"] is True
    security = domain["AdvancedSecurityOptions"]
    assert security["Enabled"] is True and security["AnonymousAuthEnabled"] is False
    assert security["InternalUserDatabaseEnabled"] is False
    # No unrestricted endpoint: every statement names one of the stack's roles, never "*".
    roles = set(of_type(stack(), "AWS::IAM::Role"))
    for statement in domain["AccessPolicies"]["Statement"]:
        principal = statement["Principal"]["AWS"]
        assert principal != "*" and principal["Fn::GetAtt"][0] in roles, statement
    alarms = {
        a["Properties"]["MetricName"]
        for a in of_type(stack(OpenSearchProfile=profile), "AWS::CloudWatch::Alarm").values()
        if a["Properties"].get("Namespace") == "AWS/ES"
    }
    assert {"ClusterStatus.red", "ClusterStatus.yellow", "JVMMemoryPressure"} <= alarms


@pytest.mark.parametrize("mode", ["create", "existing"])
def test_the_index_is_named_per_tenant_so_tenants_share_an_existing_domain(mode: str) -> None:
    given = {"OpenSearchMode": mode}
    if mode == "existing":
        given |= {
            "ExistingOpenSearchEndpoint": "https://search-shared.example",
            "ExistingOpenSearchDomainName": "shared",
        }
        given["ExistingOpenSearchSecurityRoleName"] = "platform/opensearch-security-manager"
    resources = stack(**given)
    indexes = {json.dumps(env["ENGRAM_OPENSEARCH_INDEX"]) for env in environment(resources)}
    assert indexes == {json.dumps({"Fn::Sub": "engram-${TenantId}-records"})}
    security = resources["OpenSearchSecurityConfig"]["Properties"]
    assert security["Index"] == {"Fn::Sub": "engram-${TenantId}-records"}
    assert security["SharedDomain"] == ("true" if mode == "existing" else "false")


SHARED: Final = {
    "OpenSearchMode": "existing",
    "ExistingOpenSearchEndpoint": "https://search-shared.example",
    "ExistingOpenSearchDomainName": "shared",
}


def test_a_shared_domain_without_fine_grained_access_is_refused() -> None:
    # (the defaults lack what every deployment names: the issuer, the audiences, the roles)
    baseline = set(refusals(translated()))
    (refusal,) = set(refusals(translated(), **SHARED)) - baseline
    assert refusal.startswith("ExistingOpenSearchIsNamed: ")
    assert "ExistingOpenSearchSecurityRoleName" in refusal
    named = SHARED | {"ExistingOpenSearchSecurityRoleName": "opensearch-security-manager"}
    assert set(refusals(translated(), **named)) == baseline


def test_on_a_shared_domain_the_stack_maps_its_roles_signing_as_the_owners_role() -> None:
    """The security configuration runs on a shared domain too: it assumes the role the
    domain's owner mapped to security_manager (and may do nothing else there), maps exactly
    the roles the access policy would name, and its Delete removes them."""
    named = SHARED | {"ExistingOpenSearchSecurityRoleName": "platform/opensearch-security-manager"}
    resources = stack(**named)
    assert "OpenSearchDomain" not in resources
    security = resources["OpenSearchSecurityConfig"]["Properties"]
    role_arn = "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/"
    role_arn += "${ExistingOpenSearchSecurityRoleName}"
    assert security["SecurityRoleArn"] == {"Fn::Sub": role_arn}
    assert security["Endpoint"] == {"Ref": "ExistingOpenSearchEndpoint"}
    readers = {r["Fn::GetAtt"][0] for r in security["ReaderRoleArns"]}
    writers = {r["Fn::GetAtt"][0] for r in security["WriterRoleArns"]}
    assert readers == {"SearchFunctionRole"}
    assert "SearchFunctionRole" not in writers and "McpAdapterFunctionRole" not in writers
    policy = resources["OpenSearchSecurityConfigFunctionPolicy"]["Properties"]["PolicyDocument"]
    granted = {(str(s["Action"]), json.dumps(s["Resource"])) for s in policy["Statement"]}
    assert ("sts:AssumeRole", json.dumps({"Fn::Sub": role_arn})) in granted
    assert not [a for a, _ in granted if a.startswith("es:")]


# --------------------------------------------------------------------------------------------
# 7. Operable at many tenants
# --------------------------------------------------------------------------------------------


def test_a_custom_domain_maps_the_api_with_the_operators_certificate() -> None:
    assert not of_type(stack(), "AWS::ApiGatewayV2::DomainName")
    certificate = "arn:aws:acm:eu-west-1:123456789012:certificate/0b1c2d3e"
    resources = stack(CustomDomainName="memory.example.com", CertificateArn=certificate)
    (domain,) = of_type(resources, "AWS::ApiGatewayV2::DomainName").values()
    assert domain["Properties"]["DomainName"] == {"Ref": "CustomDomainName"}
    (config,) = domain["Properties"]["DomainNameConfigurations"]
    assert config == {
        "CertificateArn": {"Ref": "CertificateArn"},
        "EndpointType": "REGIONAL",
        "SecurityPolicy": "TLS_1_2",
    }
    (mapping,) = of_type(resources, "AWS::ApiGatewayV2::ApiMapping").values()
    assert mapping["Properties"]["ApiId"] == {"Ref": "HttpApi"}
    assert mapping["DependsOn"] in resources  # the stage SAM generates exists
    rule = translated()["Rules"]["CustomDomainHasCertificate"]
    assert rule["Assertions"][0]["Assert"] == {
        "Fn::Not": [{"Fn::Equals": [{"Ref": "CertificateArn"}, ""]}]
    }


def test_the_core_layer_keeps_no_replaced_version() -> None:
    layers = of_type(stack(), "AWS::Lambda::LayerVersion")
    assert layers
    for layer in layers.values():
        assert layer["DeletionPolicy"] == "Delete"


# --------------------------------------------------------------------------------------------
# 3. OpenSearch in a VPC (VpcId, VpcSubnetIds, VpcRouteTableIds, VpcEndpoints)
# --------------------------------------------------------------------------------------------

VPC: Final = {
    "VpcId": "vpc-0123456789abcdef0",
    "VpcSubnetIds": "subnet-0aaa1111,subnet-0bbb2222,subnet-0ccc3333",
    "VpcRouteTableIds": "rtb-0aaa1111",
}
ENI_POLICY: Final = {
    "Fn::Sub": "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaENIManagementAccess"
}
# what a function in the VPC reaches without an endpoint: the domain (in the VPC) and its own log
# group (Lambda ships a function's logs and EMF metrics, not the function)
REACHED_WITHOUT_ENDPOINT: Final = {"es", "logs"}


def _opensearch_functions(resources: dict[str, dict[str, Any]]) -> set[str]:
    """The functions whose roles the domain's access policy admits."""
    domain = next(iter(of_type(stack(), "AWS::OpenSearchService::Domain").values()))
    roles = {
        s["Principal"]["AWS"]["Fn::GetAtt"][0]
        for s in domain["Properties"]["AccessPolicies"]["Statement"]
    }
    return {
        name
        for name, f in of_type(resources, "AWS::Lambda::Function").items()
        if f["Properties"]["Role"]["Fn::GetAtt"][0] in roles
    }


def test_without_a_vpc_the_stack_has_no_network_resources() -> None:
    resources = stack()
    assert not [n for n, r in resources.items() if r["Type"].startswith("AWS::EC2::")]
    assert "VPCOptions" not in _domain()
    for name, function in of_type(resources, "AWS::Lambda::Function").items():
        assert "VpcConfig" not in function["Properties"], name
    for name, role in of_type(resources, "AWS::IAM::Role").items():
        assert ENI_POLICY not in role["Properties"].get("ManagedPolicyArns", []), name


@pytest.mark.parametrize("profile", ["dev", "production"])
def test_in_a_vpc_the_domain_is_private_and_only_its_functions_reach_it(profile: str) -> None:
    resources = stack(OpenSearchProfile=profile, **VPC)
    subnets = {"Ref": "VpcSubnetIds"}
    options = _domain(OpenSearchProfile=profile, **VPC)["VPCOptions"]
    domain_group = {"Fn::GetAtt": ["OpenSearchDomainSecurityGroup", "GroupId"]}
    client_group = {"Fn::GetAtt": ["OpenSearchClientSecurityGroup", "GroupId"]}
    assert options == {
        "SubnetIds": subnets if profile == "production" else [{"Fn::Select": [0, subnets]}],
        "SecurityGroupIds": [domain_group],
    }
    (ingress,) = resources["OpenSearchDomainSecurityGroup"]["Properties"]["SecurityGroupIngress"]
    assert ingress["SourceSecurityGroupId"] == client_group
    assert (ingress["IpProtocol"], ingress["FromPort"], ingress["ToPort"]) == ("tcp", 443, 443)
    in_vpc = {
        name
        for name, f in of_type(resources, "AWS::Lambda::Function").items()
        if "VpcConfig" in f["Properties"]
    }
    expected = _opensearch_functions(resources) | {"OpenSearchSecurityConfigFunction"}
    assert in_vpc == expected and len(in_vpc) == 5, in_vpc
    for name in in_vpc:
        properties = resources[name]["Properties"]
        assert properties["VpcConfig"] == {"SecurityGroupIds": [client_group], "SubnetIds": subnets}
        role = resources[properties["Role"]["Fn::GetAtt"][0]]["Properties"]
        assert role["ManagedPolicyArns"] == [ENI_POLICY], name


@pytest.mark.parametrize("mode", ["create", "existing"])
def test_the_endpoints_cover_every_service_the_functions_in_the_vpc_call(mode: str) -> None:
    given = {"OpenSearchProfile": "production", **VPC}
    if mode == "existing":
        given |= SHARED | {"ExistingOpenSearchSecurityRoleName": "opensearch-security-manager"}
    resources = stack(**given)
    endpoints = {
        body["Properties"]["ServiceName"]["Fn::Sub"].rsplit(".", 1)[1]: body["Properties"]
        for body in of_type(resources, "AWS::EC2::VPCEndpoint").values()
    }
    gateways = {s for s, p in endpoints.items() if p["VpcEndpointType"] == "Gateway"}
    assert gateways == {"dynamodb", "s3"}
    for service, properties in endpoints.items():
        if service in gateways:
            assert properties["RouteTableIds"] == {"Ref": "VpcRouteTableIds"}
        else:
            assert properties["SubnetIds"] == {"Ref": "VpcSubnetIds"}
            assert properties["PrivateDnsEnabled"] is True
    called: set[str] = set()
    for function in of_type(resources, "AWS::Lambda::Function").values():
        if "VpcConfig" in function["Properties"]:
            role = function["Properties"]["Role"]["Fn::GetAtt"][0]
            for statement in role_statements({"Resources": resources}, role):
                actions = statement["Action"]
                for action in [actions] if isinstance(actions, str) else actions:
                    called.add(action.split(":")[0])
    assert called - REACHED_WITHOUT_ENDPOINT == set(endpoints), called
    # none: the VPC reaches the APIs itself (NAT, or another stack's endpoints)
    none = stack(OpenSearchProfile="production", VpcEndpoints="none", **VPC)
    assert not of_type(none, "AWS::EC2::VPCEndpoint") and "VpcEndpointSecurityGroup" not in none
    assert "VpcConfig" in none["SearchFunction"]["Properties"]


def test_a_vpc_with_an_existing_domain_puts_the_functions_in_it_and_creates_no_domain_group() -> (
    None
):
    existing = {
        "OpenSearchMode": "existing",
        "ExistingOpenSearchEndpoint": "https://vpc-shared.example",
        "ExistingOpenSearchDomainName": "shared",
    }
    resources = stack(**existing, **VPC)
    assert "OpenSearchDomainSecurityGroup" not in resources
    assert "VpcConfig" in resources["OutboxDrainerFunction"]["Properties"]


def test_the_vpc_parameters_are_refused_incomplete() -> None:
    rules = translated()["Rules"]
    subnets = rules["VpcHasSubnets"]["Assertions"][0]["Assert"]
    assert subnets == {"Fn::Not": [{"Fn::EachMemberEquals": [{"Ref": "VpcSubnetIds"}, ""]}]}
    tables = rules["VpcEndpointsHaveRouteTables"]["Assertions"][0]["Assert"]
    assert tables == {"Fn::Not": [{"Fn::EachMemberEquals": [{"Ref": "VpcRouteTableIds"}, ""]}]}
    # a VpcId without subnets is refused by the rule; the condition needs both
    assert not of_type(stack(VpcId=VPC["VpcId"]), "AWS::EC2::SecurityGroup")

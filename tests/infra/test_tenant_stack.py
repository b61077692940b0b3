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

from scripts.cloud_template import _packaged, deployed, load_template, translate

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


@pytest.mark.parametrize(
    ("given", "topic"),
    [({}, {"Ref": "AlarmTopic"}), ({"AlarmTopicArn": OPERATOR_TOPIC}, {"Ref": "AlarmTopicArn"})],
)
def test_every_alarm_goes_to_one_topic_the_operators_when_named(
    given: dict[str, str], topic: Any
) -> None:
    resources = stack(**given)
    assert ("AlarmTopic" in resources) == (not given)
    alarms = of_type(resources, "AWS::CloudWatch::Alarm").values()
    assert len(alarms) > 20
    for alarm in alarms:
        assert alarm["Properties"]["AlarmActions"] == [topic] == alarm["Properties"]["OKActions"]


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
    resources = stack(**given)
    indexes = {json.dumps(env["ENGRAM_OPENSEARCH_INDEX"]) for env in environment(resources)}
    assert indexes == {json.dumps({"Fn::Sub": "engram-${TenantId}-records"})}
    if mode == "create":
        security = resources["OpenSearchSecurityConfig"]["Properties"]
        assert security["Index"] == {"Fn::Sub": "engram-${TenantId}-records"}


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

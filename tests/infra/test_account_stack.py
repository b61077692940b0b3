"""The account stack (``infra/account.yaml``): what every tenant stack of an account-region
shares, created once instead of once per tenant (issue 36, item 5).

- CloudWatch Logs allows 10 resource policies per account and region: one account policy admits
  OpenSearch's log delivery for every tenant, and a tenant stack deployed with
  ``OpenSearchLogsPolicy=account`` creates none;
- the web ACL a tenant's WAF distribution carries throttles each client address on the approval
  routes (and on /mcp), which the HTTP API's route throttle, shared by every caller, cannot.

The scanners (checkov, cfn-guard) run on this template in the cloud gate beside the tenant's.
"""

from __future__ import annotations

import fnmatch
import json
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
from cfnlint.api import ManualArgs, lint_file

from scripts.cloud_template import ACCOUNT_TEMPLATE, deployed, load_template, translate

ROOT: Final = Path(__file__).resolve().parents[2]
ACCOUNT_ID: Final = "123456789012"
# Resource types CloudFormation counts per account and region with a small quota.
ACCOUNT_LEVEL_TYPES: Final = frozenset(
    {"AWS::Logs::ResourcePolicy", "AWS::ApiGateway::Account", "AWS::WAFv2::WebACL"}
)


@cache
def account() -> dict[str, Any]:
    return load_template(ACCOUNT_TEMPLATE)


@cache
def tenant() -> dict[str, Any]:
    return translate(ROOT / "template.yaml")


def resolved(text: str, **names: str) -> str:
    for name, value in {
        "AWS::Partition": "aws",
        "AWS::Region": "us-east-1",
        "AWS::AccountId": ACCOUNT_ID,
        **names,
    }.items():
        text = text.replace("${" + name + "}", value)
    return text


def test_the_account_stack_passes_cfn_lint() -> None:
    findings = lint_file(ACCOUNT_TEMPLATE, config=ManualArgs(regions=["us-east-1", "eu-west-1"]))
    assert [f"{m.rule.id} {m.message}" for m in findings] == []


@pytest.mark.parametrize("tenant_id", ["dev", "acme-prod", "t0"])
def test_its_log_policy_admits_opensearch_to_every_tenants_log_groups_and_only_those(
    tenant_id: str,
) -> None:
    policy = json.loads(
        resolved(
            account()["Resources"]["OpenSearchLogDeliveryPolicy"]["Properties"]["PolicyDocument"][
                "Fn::Sub"
            ]
        )
    )
    (statement,) = policy["Statement"]
    assert statement["Principal"] == {"Service": "es.amazonaws.com"}
    assert sorted(statement["Action"]) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": ACCOUNT_ID}}
    pattern = statement["Resource"]
    groups = [
        body["Properties"]["LogGroupName"]["Fn::Sub"]
        for body in tenant()["Resources"].values()
        if body["Type"] == "AWS::Logs::LogGroup"
    ]
    published = [g for g in groups if g.startswith("/aws/opensearch/")]
    assert len(published) == 4
    prefix = f"arn:aws:logs:us-east-1:{ACCOUNT_ID}:log-group:"
    for group in groups:
        arn = prefix + resolved(group, TenantId=tenant_id)
        assert fnmatch.fnmatchcase(arn, pattern) == (group in published), group


def test_a_tenant_on_the_account_policy_creates_no_account_level_resource() -> None:
    def account_level(**given: str) -> list[str]:
        return sorted(
            name
            for name, body in deployed(tenant(), **given).items()
            if body["Type"] in ACCOUNT_LEVEL_TYPES
        )

    assert account_level() == ["OpenSearchLogsResourcePolicy"]  # one tenant: no account stack
    assert account_level(OpenSearchLogsPolicy="account") == []
    # the domain still waits for a policy: the account stack's, by the name its tag carries
    domain = deployed(tenant(), OpenSearchLogsPolicy="account")["OpenSearchDomain"]
    (tag,) = [t for t in domain["Properties"]["Tags"] if t["Key"] == "engram:logs-policy"]
    name = account()["Resources"]["OpenSearchLogDeliveryPolicy"]["Properties"]["PolicyName"]
    assert tag["Value"] == name


def _rules() -> dict[str, dict[str, Any]]:
    acl = account()["Resources"]["EdgeWebAcl"]
    assert acl["Condition"] == "HoldsTheEdge"  # scope CLOUDFRONT exists in us-east-1 only
    assert acl["Properties"]["Scope"] == "CLOUDFRONT"
    return {rule["Name"]: rule for rule in acl["Properties"]["Rules"]}


def test_each_client_address_is_throttled_on_every_approval_route() -> None:
    rule = _rules()["approval-routes-per-client"]
    assert rule["Priority"] == 0  # before anything that could allow it
    assert rule["Action"]["Block"]["CustomResponse"]["ResponseCode"] == 429
    rate = rule["Statement"]["RateBasedStatement"]
    assert rate["AggregateKeyType"] == "IP"
    assert rate["Limit"] == {"Ref": "ApprovalRequestsPerClient"}
    limit = account()["Parameters"]["ApprovalRequestsPerClient"]
    assert 10 <= limit["MinValue"] <= limit["Default"] <= 1000
    match = rate["ScopeDownStatement"]["ByteMatchStatement"]
    assert match["FieldToMatch"] == {"UriPath": {}}
    assert match["PositionalConstraint"] == "STARTS_WITH"
    routes = tenant()["Resources"]["HttpApi"]["Properties"]["Body"]["paths"]
    approval_paths = [p for p in routes if "approval" in p]
    assert approval_paths and all(p.startswith(match["SearchString"]) for p in approval_paths)


def test_the_tenant_template_takes_the_account_stacks_web_acl() -> None:
    import re

    pattern = tenant()["Parameters"]["WebAclArn"]["AllowedPattern"]
    arn = f"arn:aws:wafv2:us-east-1:{ACCOUNT_ID}:global/webacl/engram-edge/0a1b2c3d-0000-4000"
    assert re.match(pattern, arn + "-8000-000000000000")
    assert account()["Outputs"]["EdgeWebAclArn"]["Value"] == {"Fn::GetAtt": ["EdgeWebAcl", "Arn"]}
    logging = account()["Resources"]["EdgeWebAclLogging"]["Properties"]
    redacted = {f["SingleHeader"]["Name"] for f in logging["RedactedFields"]}
    assert redacted == {"authorization", "cookie"}  # bearer tokens, approvers' sessions


def test_the_deployment_guide_shows_the_quota_scripts_table_and_budget() -> None:
    """The quota table in docs/deploying-aws.md is the script's, from this template: a function
    or role added, or a reserved concurrency changed, changes it."""
    from scripts.tenant_quotas import QUOTAS, markdown, reserved_concurrency

    quotas = json.loads(QUOTAS.read_text("utf-8"))
    guide = (ROOT / "docs" / "deploying-aws.md").read_text("utf-8")
    assert markdown(tenant(), quotas) in guide
    budget = reserved_concurrency(tenant(), deployed(tenant()))
    assert f": {budget} per tenant at the" in guide
    assert all(
        q["source"].startswith("https://docs.aws.amazon.com/") for q in quotas["quotas"].values()
    )

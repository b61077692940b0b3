"""The stack's own rules on the translated template (``scripts/cloud_template.py``, run by the
cloud gate's ``scan`` step): separation of duties on the KMS keys, item-level scope of every
write, throttled public routes, the secrets' key, rotation and resource policies. Each rule passes on the
template and fails on the breach it names; the item-scope rule is also evaluated request by
request (``role_allows``: moto does not evaluate IAM condition keys)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest

from scripts.cloud_template import (
    item_write_violations,
    key_policy_violations,
    public_route_violations,
    role_allows,
    secret_violations,
    stack_rules,
    translate,
)

ROOT: Final = Path(__file__).resolve().parents[2]
PARAMETERS: Final = {"TenantId": "dev"}
SCOPE: Final = "S#dev#ws-1"


@cache
def _translated() -> str:
    return json.dumps(translate(ROOT / "template.yaml"))


def translated() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(_translated())
    return loaded


def statement(template: dict[str, Any], resource: str, sid: str) -> dict[str, Any]:
    props = template["Resources"][resource]["Properties"]
    document = props.get("KeyPolicy") or props["PolicyDocument"]
    found: dict[str, Any] = next(s for s in document["Statement"] if s.get("Sid") == sid)
    return found


def test_the_template_keeps_every_rule() -> None:
    assert {rule: v for rule, v in stack_rules(translated()).items() if v} == {}


def test_a_key_admin_that_may_change_the_key_policy_is_a_violation() -> None:
    template = translated()
    statement(template, "EngramDataKey", "KeyAdministration")["Action"].append("kms:PutKeyPolicy")
    assert key_policy_violations(template) == [
        'EngramDataKey.KeyAdministration: kms:PutKeyPolicy for [\'{"Ref": "KeyAdminRoleArn"}\']'
    ]


def test_a_runtime_role_that_may_create_grants_is_a_violation() -> None:
    template = translated()
    policy = template["Resources"]["CaptureFunctionPolicy"]["Properties"]["PolicyDocument"]
    policy["Statement"].append(
        {"Sid": "Grants", "Effect": "Allow", "Action": "kms:Create*", "Resource": "*"}
    )
    assert key_policy_violations(template) == [
        "CaptureFunctionRole.Grants: ['kms:CreateGrant'] in its IAM policy"
    ]


def test_a_key_policy_naming_a_function_role_for_put_key_policy_is_a_violation() -> None:
    template = translated()
    deployer = statement(template, "EngramTableKey", "PolicyOnlyThroughDeployment")
    deployer["Principal"]["AWS"] = {"Fn::GetAtt": ["ApprovalFunctionRole", "Arn"]}
    found = key_policy_violations(template)
    assert (
        "EngramTableKey.PolicyOnlyThroughDeployment: ['kms:PutKeyPolicy'] for a runtime role"
        in (found)
    )


def test_an_unbounded_item_write_is_a_violation() -> None:
    template = translated()
    del statement(template, "RequestAdmissionFunctionPolicy", "ShredKeys")["Condition"]
    assert item_write_violations(template) == [
        "RequestAdmissionFunctionRole.ShredKeys: ['dynamodb:DeleteItem'] on any item"
    ]


def test_an_unthrottled_public_route_and_an_uncapped_approval_function_are_violations() -> None:
    template = translated()
    stage = template["Resources"]["HttpApiApiGatewayDefaultStage"]["Properties"]
    del stage["RouteSettings"]["POST /approvals/{approvalId}"]
    del template["Resources"]["ApprovalFunction"]["Properties"]["ReservedConcurrentExecutions"]
    assert public_route_violations(template) == [
        "HttpApi POST /approvals/{approvalId}: public and not throttled",
        "ApprovalFunction: only public routes reach it, no reserved concurrency",
    ]


def test_a_session_secret_under_the_aws_key_or_never_rotated_is_a_violation() -> None:
    template = translated()
    del template["Resources"]["ApprovalSessionSecret"]["Properties"]["KmsKeyId"]
    del template["Resources"]["ApprovalSessionSecretRotation"]
    found = secret_violations(template)
    assert [f.split(":")[0] for f in found] == ["ApprovalSessionSecret"] * 2


def test_a_secret_without_a_resource_policy_or_one_that_admits_another_role_is_a_violation() -> (
    None
):
    template = translated()
    del template["Resources"]["RequestStateSecretPolicy"]
    deny = template["Resources"]["CursorSecretPolicy"]["Properties"]["ResourcePolicy"]["Statement"][
        0
    ]
    deny["Condition"]["StringNotEquals"]["aws:PrincipalArn"].append(
        {"Fn::GetAtt": ["ApprovalFunctionRole", "Arn"]}
    )
    found = secret_violations(template)
    assert [f.split(":")[0] for f in found] == ["CursorSecret", "RequestStateSecret"]
    assert "'ApprovalFunctionRole'" in found[0] and "no resource policy" in found[1]


# -- the denied writes, request by request ---------------------------------------------------


def writes(role: str, action: str, table: str, key: str) -> bool:
    return role_allows(
        translated(),
        role,
        action,
        table,
        {"dynamodb:LeadingKeys": [key]},
        PARAMETERS,
    )


@pytest.mark.parametrize(
    ("role", "action", "key"),
    [
        ("CaptureFunctionRole", "dynamodb:PutItem", f"{SCOPE}#CANDIDATE#c1"),
        ("CaptureFunctionRole", "dynamodb:PutItem", SCOPE),
        ("RequestAdmissionFunctionRole", "dynamodb:PutItem", f"{SCOPE}#RECORD#r1"),
        ("RequestAdmissionFunctionRole", "dynamodb:PutItem", "APPROVAL#a1"),
        ("WorkflowStepFunctionRole", "dynamodb:DeleteItem", f"{SCOPE}#LEDGER#p#k"),
        ("WorkflowStepFunctionRole", "dynamodb:PutItem", "APPROVAL_TOKEN#a1"),
        ("WorkflowStepFunctionRole", "dynamodb:PutItem", "OUTBOX"),
        ("WorkflowStepFunctionRole", "dynamodb:PutItem", "BLOB_GC"),
        ("WorkflowStepFunctionRole", "dynamodb:PutItem", "APPROVAL_EXEC#forget-x"),
        ("RequestAdmissionFunctionRole", "dynamodb:PutItem", "OUTBOX"),
        ("OutboxDrainerFunctionRole", "dynamodb:DeleteItem", f"{SCOPE}#OUTBOX#drop#r1"),
        ("OutboxDrainerFunctionRole", "dynamodb:DeleteItem", "OUTBOX"),
    ],
)
def test_each_function_may_write_the_items_its_tool_writes(
    role: str, action: str, key: str
) -> None:
    assert writes(role, action, "EngramTable", key)


@pytest.mark.parametrize(
    ("role", "action", "key"),
    [
        # a revocation, another tenant's scope, a nonce: never a tool function's write
        ("CaptureFunctionRole", "dynamodb:PutItem", "REVOKED#dev#principal#alice"),
        ("CaptureFunctionRole", "dynamodb:UpdateItem", SCOPE),  # capture only puts
        ("CaptureFunctionRole", "dynamodb:PutItem", "S#other#ws-1"),
        ("CaptureFunctionRole", "dynamodb:DeleteItem", f"{SCOPE}#CANDIDATE#c1"),
        ("RequestAdmissionFunctionRole", "dynamodb:DeleteItem", "REVOKED#dev#token#t1"),
        ("RequestAdmissionFunctionRole", "dynamodb:PutItem", "APPROVAL_TOKEN#a1"),
        ("WorkflowStepFunctionRole", "dynamodb:PutItem", "NONCE#n1"),
        ("WorkflowStepFunctionRole", "dynamodb:UpdateItem", "S#other#ws-1"),
        ("OutboxDrainerFunctionRole", "dynamodb:DeleteItem", "APPROVAL#a1"),
        ("OutboxDrainerFunctionRole", "dynamodb:PutItem", f"{SCOPE}#OUTBOX#drop#r1"),
    ],
)
def test_writes_outside_a_functions_items_are_denied(role: str, action: str, key: str) -> None:
    assert not writes(role, action, "EngramTable", key)


def test_admission_may_shred_candidate_and_record_keys_but_no_scope_key() -> None:
    role = "RequestAdmissionFunctionRole"
    assert writes(role, "dynamodb:DeleteItem", "EngramKeyTable", "key_" + "0" * 32)
    # a record key made for an admission whose commit then lost
    assert writes(role, "dynamodb:DeleteItem", "EngramKeyTable", "record:abc")
    assert not writes(role, "dynamodb:DeleteItem", "EngramKeyTable", "scopekey:abc")
    for shredder in ("WorkflowStepFunctionRole", "OutboxDrainerFunctionRole"):
        assert writes(shredder, "dynamodb:DeleteItem", "EngramKeyTable", "record:abc")
        assert not writes(shredder, "dynamodb:DeleteItem", "EngramKeyTable", "scopekey:abc")


# -- the evaluator against the documented LeadingKeys example --------------------------------


def test_the_evaluator_reads_the_documented_fine_grained_access_example() -> None:
    # The IAM user guide's DynamoDB example: an item write only where the partition key is the
    # caller's id (ForAllValues:StringEquals on dynamodb:LeadingKeys); a BatchWriteItem with one
    # foreign key among its keys is denied as a whole.
    template: dict[str, Any] = {
        "Resources": {
            "Table": {"Type": "AWS::DynamoDB::Table", "Properties": {}},
            "Role": {"Type": "AWS::IAM::Role", "Properties": {"Policies": []}},
        }
    }
    document = {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["dynamodb:PutItem", "dynamodb:BatchWriteItem"],
                "Resource": {"Fn::GetAtt": ["Table", "Arn"]},
                "Condition": {
                    "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": [{"Ref": "UserId"}]}
                },
            }
        ]
    }
    template["Resources"]["Role"]["Properties"]["Policies"] = [{"PolicyDocument": document}]
    user = {"UserId": "u-1"}

    def allowed(action: str, keys: list[str]) -> bool:
        return role_allows(
            copy.deepcopy(template), "Role", action, "Table", {"dynamodb:LeadingKeys": keys}, user
        )

    assert allowed("dynamodb:PutItem", ["u-1"])
    assert not allowed("dynamodb:PutItem", ["u-2"])
    assert allowed("dynamodb:BatchWriteItem", ["u-1", "u-1"])
    assert not allowed("dynamodb:BatchWriteItem", ["u-1", "u-2"])
    assert not allowed("dynamodb:DeleteItem", ["u-1"])

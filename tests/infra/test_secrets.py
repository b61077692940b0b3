"""The stack's secrets as CloudFormation receives them (the SAM-translated template): each under
the stack's own key, each behind a resource policy that names exactly the roles that read it,
each rotating through the one rotation function (issue 36, item 2).

The readers are not listed here: they are found from the identity policies that grant
``secretsmanager:GetSecretValue`` on the secret, so a function that starts reading a secret
without being named by its resource policy (or a policy naming a role that no longer reads it)
fails. ``make cloud-check`` then judges the same policies with the IAM simulator, including
probes that a principal of the account with ``secretsmanager:*`` and ``kms:*`` is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest

from scripts.cloud_template import translate

ROOT: Final = Path(__file__).resolve().parents[2]
SECRETS: Final = ("RequestStateSecret", "ApprovalSessionSecret", "CursorSecret")
ROTATION_ROLE: Final = {"Fn::GetAtt": ["SecretRotationFunctionRole", "Arn"]}
STACK_KEY: Final = {"Fn::GetAtt": ["EngramTableKey", "Arn"]}
# The stack's managed policies for people: attached outside the stack to the role its parameter
# names (the operator's only when OperatorRoleArn is set).
PEOPLE: Final = {
    "OperatorPolicy": {
        "Fn::If": ["HasOperatorRole", {"Ref": "OperatorRoleArn"}, {"Ref": "AWS::NoValue"}]
    },
    "KeyAdminPolicy": {"Ref": "KeyAdminRoleArn"},
}
# What changes the value: the rotation (and a deployment, which could rewrite the policy anyway).
VALUE_ACTIONS: Final = {"secretsmanager:PutSecretValue", "secretsmanager:UpdateSecretVersionStage"}
# What would undo the policy or move the secret: a deployment only.
ADMIN_ACTIONS: Final = {
    "secretsmanager:PutResourcePolicy",
    "secretsmanager:DeleteResourcePolicy",
    "secretsmanager:UpdateSecret",
    "secretsmanager:DeleteSecret",
    "secretsmanager:RestoreSecret",
    "secretsmanager:CancelRotateSecret",
    "secretsmanager:ReplicateSecretToRegions",
    "secretsmanager:RemoveRegionsFromReplication",
    "secretsmanager:StopReplicationToReplica",
}


@cache
def translated() -> dict[str, Any]:
    return translate(ROOT / "template.yaml")


def resources(kind: str) -> dict[str, dict[str, Any]]:
    return {n: r for n, r in translated()["Resources"].items() if r["Type"] == kind}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statements(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A policy document's statements, both branches of an ``Fn::If`` included."""
    pending: list[Any] = list(as_list(document.get("Statement", [])))
    while pending:
        node = pending.pop(0)
        if isinstance(node, dict) and "Fn::If" in node:
            pending.extend(b for b in node["Fn::If"][1:] if b != {"Ref": "AWS::NoValue"})
        else:
            yield node


def identity_policies() -> Iterator[tuple[Any, dict[str, Any]]]:
    """(the role ARN as the template names it, a statement) for every identity policy."""
    for _, policy in resources("AWS::IAM::RolePolicy").items():
        role = {"Fn::GetAtt": [policy["Properties"]["RoleName"]["Ref"], "Arn"]}
        for statement in statements(policy["Properties"]["PolicyDocument"]):
            yield role, statement
    for name, policy in resources("AWS::IAM::ManagedPolicy").items():
        for statement in statements(policy["Properties"]["PolicyDocument"]):
            yield PEOPLE[name], statement
    for name, resource in resources("AWS::IAM::Role").items():
        for inline in resource["Properties"].get("Policies", []):
            for statement in statements(inline["PolicyDocument"]):
                yield {"Fn::GetAtt": [name, "Arn"]}, statement


def names(resource: Any, secret: str) -> bool:
    return {"Ref": secret} in as_list(resource)


def readers(secret: str) -> list[Any]:
    found: list[Any] = []
    for role, statement in identity_policies():
        actions = as_list(statement.get("Action", []))
        granted = statement["Effect"] == "Allow" and "secretsmanager:GetSecretValue" in actions
        if granted and names(statement["Resource"], secret) and role not in found:
            found.append(role)
    return found


def resource_policy(secret: str) -> dict[str, Any]:
    (policy,) = [
        p["Properties"]
        for p in resources("AWS::SecretsManager::ResourcePolicy").values()
        if p["Properties"]["SecretId"] == {"Ref": secret}
    ]
    found: dict[str, Any] = policy
    return found


def excepted(secret: str, action: str) -> list[Any]:
    """The principals the policy's Deny of ``action`` excepts (by aws:PrincipalArn)."""
    (deny,) = [
        s
        for s in statements(resource_policy(secret)["ResourcePolicy"])
        if action in as_list(s["Action"])
    ]
    assert deny["Effect"] == "Deny" and deny["Principal"] == "*" and deny["Resource"] == "*"
    assert set(deny["Condition"]) == {"StringNotEquals"}
    return as_list(deny["Condition"]["StringNotEquals"]["aws:PrincipalArn"])


def key(value: Any) -> str:
    return repr(value)


def test_the_stack_has_these_three_secrets() -> None:
    assert set(resources("AWS::SecretsManager::Secret")) == set(SECRETS)


@pytest.mark.parametrize("secret", SECRETS)
def test_each_secret_is_under_the_stack_key(secret: str) -> None:
    assert resources("AWS::SecretsManager::Secret")[secret]["Properties"]["KmsKeyId"] == STACK_KEY


@pytest.mark.parametrize("secret", SECRETS)
def test_each_secret_is_read_only_by_the_roles_that_read_it(secret: str) -> None:
    policy = resource_policy(secret)
    assert policy["BlockPublicPolicy"] is True
    assert not [s for s in statements(policy["ResourcePolicy"]) if s["Effect"] != "Deny"]
    # nothing denies secretsmanager:* (CloudFormation must still update and delete the secret)
    for statement in statements(policy["ResourcePolicy"]):
        assert not [a for a in as_list(statement["Action"]) if "*" in a]
    allowed = sorted(map(key, excepted(secret, "secretsmanager:GetSecretValue")))
    assert allowed == sorted(map(key, readers(secret)))  # the rotation reads the current value
    assert ROTATION_ROLE in readers(secret) and len(readers(secret)) >= 2


def test_the_readers_are_the_ones_the_functions_need() -> None:
    def roles(secret: str) -> set[str]:
        return {
            r["Fn::GetAtt"][0] if "Fn::GetAtt" in r else key(r)
            for r in readers(secret)
            if r != ROTATION_ROLE
        }

    assert roles("RequestStateSecret") == {"McpAdapterFunctionRole"}
    assert roles("ApprovalSessionSecret") == {"ApprovalFunctionRole"}
    assert {
        "SearchFunctionRole",
        "GetFunctionRole",
        "CaptureFunctionRole",
        "RequestAdmissionFunctionRole",
        "WithdrawFunctionRole",
        "ForgetFunctionRole",
        "WorkflowStepFunctionRole",
        "OutboxDrainerFunctionRole",
        key(PEOPLE["OperatorPolicy"]),
        key(PEOPLE["KeyAdminPolicy"]),
    } == roles("CursorSecret")


@pytest.mark.parametrize("secret", SECRETS)
def test_only_the_rotation_or_a_deployment_changes_a_secret(secret: str) -> None:
    deploy = {"Ref": "DeployRoleArn"}
    for action in VALUE_ACTIONS:
        assert sorted(map(key, excepted(secret, action))) == sorted(
            map(key, [ROTATION_ROLE, deploy])
        )
    for action in ADMIN_ACTIONS:
        assert excepted(secret, action) == [deploy]


@pytest.mark.parametrize("secret", SECRETS)
def test_each_reader_decrypts_only_through_secrets_manager_in_its_secret_s_context(
    secret: str,
) -> None:
    for role in readers(secret):
        grants = [
            s
            for r, s in identity_policies()
            if r == role
            and s["Effect"] == "Allow"
            and "kms:Decrypt" in as_list(s["Action"])
            and s["Resource"] == STACK_KEY
        ]
        contexts = [
            g["Condition"]["StringEquals"]
            for g in grants
            if names(g["Condition"]["StringEquals"].get("kms:EncryptionContext:SecretARN"), secret)
        ]
        assert contexts, f"{role} reads {secret} but cannot decrypt it"
        for context in contexts:
            assert context["kms:ViaService"] == {
                "Fn::Sub": "secretsmanager.${AWS::Region}.amazonaws.com"
            }


@pytest.mark.parametrize("secret", SECRETS)
def test_each_secret_rotates_through_the_rotation_function(secret: str) -> None:
    (schedule,) = [
        s["Properties"]
        for s in resources("AWS::SecretsManager::RotationSchedule").values()
        if s["Properties"]["SecretId"] == {"Ref": secret}
    ]
    assert schedule["RotationLambdaARN"] == {"Fn::GetAtt": ["SecretRotationFunction", "Arn"]}
    assert schedule["RotationRules"]["ScheduleExpression"] == {
        "Fn::Sub": "rate(${SecretRotationDays} days)"
    }
    (permission,) = [
        p["Properties"]
        for p in resources("AWS::Lambda::Permission").values()
        if p["Properties"].get("SourceArn") == {"Ref": secret}
    ]
    assert permission["Principal"] == "secretsmanager.amazonaws.com"
    assert permission["FunctionName"] == {"Fn::GetAtt": ["SecretRotationFunction", "Arn"]}


def test_the_rotation_role_reaches_these_three_secrets_only() -> None:
    rotation = [s for r, s in identity_policies() if r == ROTATION_ROLE]
    secrets = [
        s["Resource"]
        for s in rotation
        if any(str(a).startswith("secretsmanager:") for a in as_list(s["Action"]))
        and s["Resource"] != "*"
    ]
    assert secrets == [[{"Ref": secret} for secret in SECRETS]]
    (star,) = [s for s in rotation if s["Resource"] == "*" and "secretsmanager" in str(s["Action"])]
    assert star["Action"] == "secretsmanager:GetRandomPassword"  # AWS grants it only on "*"

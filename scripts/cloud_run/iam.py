"""The stack as AWS would judge it: every recorded call, as the authorization requests AWS makes
of it, against the translated template's policies.

moto enforces no IAM, no key policy and no condition key, so passing on moto says nothing about
passing on AWS. This module turns each ``recorder.Call`` into what AWS evaluates:

- **who**: the principal's role session (``arn:aws:sts::<account>:assumed-role/<role>/<name>``)
  and the role's identity policies: its inline ``Policies``, the ``AWS::IAM::RolePolicy`` and
  ``AWS::IAM::ManagedPolicy`` resources attached to it, and the AWS managed policies it names
  (their documents are in ``MANAGED_POLICIES``; an unknown one fails the gate);
- **what**: one request per authorization AWS makes — DynamoDB authorizes every item of a
  ``TransactWriteItems`` as its own ``PutItem``/``UpdateItem``/``DeleteItem``/
  ``ConditionCheckItem``; S3's ``DeleteObjects`` is an ``s3:DeleteObject`` per key;
- **the condition context**: ``dynamodb:LeadingKeys`` (every partition key the request names),
  ``dynamodb:Attributes`` / ``dynamodb:Select`` (a projection, else all attributes),
  ``dynamodb:ReturnValues``, ``dynamodb:EnclosingOperation``; ``kms:EncryptionContext:*``,
  ``kms:EncryptionContextKeys``, ``kms:CallerAccount``, ``kms:ViaService``; ``s3:prefix``;
  ``aws:SecureTransport`` (the SDKs speak HTTPS to AWS), ``aws:PrincipalArn``,
  ``aws:PrincipalAccount``, ``aws:RequestedRegion``;
- **what a service does with the caller's permissions** (``via``): S3 asks KMS for the bucket
  key's data key on a ``PutObject`` and to decrypt on a ``GetObject`` (SSE-KMS), Secrets Manager
  asks KMS to decrypt a secret under a customer key, and Lambda writes each invocation's logs
  and trace segments with the function's role;
- **the resource's policy**: a KMS key's key policy (KMS requires it to allow, itself or by
  delegating to the account's IAM), the bucket policy, the OpenSearch domain's access policy.

``iam_simulate`` runs the maintained simulator (scripts/iam_simulator, @cloud-copilot/iam-simulate)
over them. ``probes`` builds the negative half from the same recording.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .recorder import Call
from .settings import (
    ACCOUNT,
    KEY_ADMIN,
    KEY_ADMIN_ROLE_ARN,
    OPERATOR,
    OPERATOR_ROLE_ARN,
    PERSON_POLICIES,
    REGION,
    ROOT,
    TENANT,
)
from .stack import PUBLISHED_VERSION, Stack, Unresolvable

SIMULATOR: Final = ROOT / "scripts" / "iam_simulator"
NO_VALUE: Final = "__AWS::NoValue__"
Context = dict[str, str | list[str]]

# AWS managed policies a template role may name, as AWS publishes them (version of the day).
MANAGED_POLICIES: Final[dict[str, dict[str, Any]]] = {
    "AWSXrayWriteOnlyAccess": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": [
                    "xray:PutTraceSegments",
                    "xray:PutTelemetryRecords",
                    "xray:GetSamplingRules",
                    "xray:GetSamplingTargets",
                    "xray:GetSamplingStatisticSummaries",
                ],
                "Resource": ["*"],
            }
        ],
    },
    "AWSLambdaENIManagementAccess": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": [
                    "ec2:CreateNetworkInterface",
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeSubnets",
                    "ec2:DeleteNetworkInterface",
                    "ec2:AssignPrivateIpAddresses",
                    "ec2:UnassignPrivateIpAddresses",
                ],
                "Resource": "*",
            }
        ],
    },
}


@dataclass(frozen=True)
class Authorization:
    """One request AWS authorizes: ``principal`` (a logical id, or OPERATOR) does ``action`` on
    ``resource`` with ``context``; ``via`` names the service that asked on its behalf."""

    principal: str
    action: str
    resource: str
    context: tuple[tuple[str, str | tuple[str, ...]], ...]
    via: str = ""

    @staticmethod
    def of(
        principal: str, action: str, resource: str, context: Context, via: str = ""
    ) -> Authorization:
        frozen = tuple(
            sorted(
                (key, tuple(value) if isinstance(value, list) else value)
                for key, value in context.items()
            )
        )
        return Authorization(principal, action, resource, frozen, via)

    def context_dict(self) -> Context:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.context}

    def value(self, key: str) -> str | tuple[str, ...] | None:
        return next((v for k, v in self.context if k == key), None)

    def described(self) -> str:
        keys = ", ".join(
            f"{k}={list(v) if isinstance(v, tuple) else v}"
            for k, v in self.context
            if not k.startswith("aws:")
        )
        via = f" (via {self.via})" if self.via else ""
        return f"{self.principal} {self.action} {self.resource}{via}" + (
            f" [{keys}]" if keys else ""
        )


# -- the stack's resources, as the recorded calls name them ------------------------------------------


@dataclass
class Table:
    logical: str
    arn: str
    hash_key: str
    sse_key: str = ""  # the customer managed key of its encryption at rest ('' for AWS's)


@dataclass
class World:
    """The stack's resources by the names the calls use, and its policies, resolved."""

    stack: Stack  # the translated template, resolved against the harness's resources
    tables: dict[str, Table] = field(default_factory=dict)  # table name -> table
    buckets: dict[str, str] = field(default_factory=dict)  # bucket -> its SSE-KMS key ARN ('')
    keys: dict[str, str] = field(default_factory=dict)  # key id, ARN or alias -> key ARN
    secrets: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (ARN, key ARN)
    functions: dict[str, str] = field(default_factory=dict)  # function name -> logical id
    roles: dict[str, str] = field(default_factory=dict)  # principal -> role logical id
    role_arns: dict[str, str] = field(default_factory=dict)  # principal -> role ARN
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> document
    identity: dict[str, list[str]] = field(default_factory=dict)  # principal -> policy names
    resource_policies: list[tuple[str, str]] = field(default_factory=list)  # (ARN prefix, name)
    domain: str = ""
    problems: list[str] = field(default_factory=list)

    # -- building ------------------------------------------------------------------------------

    @staticmethod
    def of(translated: dict[str, Any], refs: dict[str, Any]) -> World:
        """The translated template resolved against ``refs`` (the harness stack's: its parameters,
        and what it provisioned on moto)."""
        parameters = {
            name: ",".join(value) if isinstance(value, list) else value
            for name, value in refs.items()
            if name in translated.get("Parameters", {})
        }
        resolver = Stack(translated, parameters, NoClients())
        resolver.refs.update(refs)
        resolver.refs["AWS::NoValue"] = NO_VALUE
        world = World(resolver)
        world._resources()
        world._principals()
        world._resource_policies()
        return world

    def resolved(self, node: Any) -> Any:
        return _without_no_value(self.stack.resolve(node))

    def _of_type(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for name, resource in self.stack.template["Resources"].items():
            if resource.get("Type") == kind and self._deployed(resource):
                yield name, resource.get("Properties", {})

    def _deployed(self, resource: dict[str, Any]) -> bool:
        condition = resource.get("Condition")
        return condition is None or self.stack.conditions.get(condition, False)

    def _resources(self) -> None:
        refs = self.stack.refs
        for name, props in self._of_type("AWS::DynamoDB::Table"):
            table = str(refs[name])
            hash_key = next(
                k["AttributeName"] for k in props["KeySchema"] if k["KeyType"] == "HASH"
            )
            arn = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}"
            refs[f"{name}.Arn"] = arn
            self.tables[table] = Table(name, arn, hash_key)
        for name, _ in self._of_type("AWS::KMS::Key"):
            arn = str(refs[f"{name}.Arn"])
            self.keys[arn] = self.keys[str(refs[name])] = arn
        for name, props in self._of_type("AWS::DynamoDB::Table"):
            sse = props.get("SSESpecification") or {}
            if sse.get("SSEType") == "KMS" and sse.get("KMSMasterKeyId"):
                key = str(self.resolved(sse["KMSMasterKeyId"]))
                self.tables[str(refs[name])].sse_key = self.keys.get(key, key)
        for _, props in self._of_type("AWS::KMS::Alias"):
            self.keys[str(self.resolved(props["AliasName"]))] = self.keys[
                str(self.resolved(props["TargetKeyId"]))
            ]
        for name, props in self._of_type("AWS::S3::Bucket"):
            rules = props.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
            default = rules[0].get("ServerSideEncryptionByDefault", {}) if rules else {}
            sse_key = (
                default.get("KMSMasterKeyID") if default.get("SSEAlgorithm") == "aws:kms" else None
            )
            self.buckets[str(refs[name])] = (
                self.keys.get(str(self.resolved(sse_key)), "") if sse_key is not None else ""
            )
        for name, props in self._of_type("AWS::SecretsManager::Secret"):
            arn = str(refs[name])
            key = str(self.resolved(props["KmsKeyId"])) if "KmsKeyId" in props else ""
            self.secrets[arn] = (arn, self.keys.get(key, key))
            self.secrets[f"engram-{TENANT}-{name}"] = self.secrets[arn]
        for name, props in self._of_type("AWS::Logs::LogGroup"):
            group = str(self.resolved(props.get("LogGroupName", name)))
            refs[name] = group
            refs[f"{name}.Arn"] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:*"
        for name, props in self._of_type("AWS::OpenSearchService::Domain"):
            self.domain = str(self.resolved(props["DomainName"]))
            refs[f"{name}.Arn"] = f"arn:aws:es:{REGION}:{ACCOUNT}:domain/{self.domain}"
        for name, _ in self._of_type("AWS::IAM::Role"):  # SAM's generated roles too
            refs.setdefault(name, f"engram-{TENANT}-{name}")
            refs.setdefault(f"{name}.Arn", f"arn:aws:iam::{ACCOUNT}:role/{refs[name]}")
        for name, _ in self._of_type("AWS::SNS::Topic"):
            refs.setdefault(name, f"arn:aws:sns:{REGION}:{ACCOUNT}:engram-{TENANT}-{name}")
        for name, _ in self._of_type("AWS::StepFunctions::StateMachine"):
            refs.setdefault(f"{name}.Arn", refs.get(name))
        self._versions_and_aliases()

    def _versions_and_aliases(self) -> None:
        """What SAM generates for an ``AutoPublishAlias``: a version (the harness's first, as
        ``Stack.aliases`` has it) and the alias, whose Ref is its ARN (``function:NAME:ALIAS``)."""
        refs = self.stack.refs
        for name, props in self._of_type("AWS::Lambda::Version"):
            function = f"{REGION}:{ACCOUNT}:function:{self.resolved(props['FunctionName'])}"
            refs[name] = f"arn:aws:lambda:{function}:{PUBLISHED_VERSION}"
            refs[f"{name}.Version"] = PUBLISHED_VERSION
        for name, props in self._of_type("AWS::Lambda::Alias"):
            function = f"{REGION}:{ACCOUNT}:function:{self.resolved(props['FunctionName'])}"
            refs[name] = f"arn:aws:lambda:{function}:{props['Name']}"

    def _principals(self) -> None:
        """Each function and state machine, its role and its identity policies; the operator."""
        for name, props in self._of_type("AWS::Lambda::Function"):
            self.functions[str(self.stack.refs[name])] = name
            self.roles[name] = _role_of(props["Role"])
        for name, props in self._of_type("AWS::StepFunctions::StateMachine"):
            self.roles[name] = _role_of(props["RoleArn"])
        attached: dict[str, list[str]] = {}
        for name, props in self._of_type("AWS::IAM::RolePolicy"):
            role = props["RoleName"]["Ref"]
            self._policy(name, props["PolicyDocument"])
            attached.setdefault(role, []).append(name)
        for name, props in self._of_type("AWS::IAM::ManagedPolicy"):
            self._policy(name, props["PolicyDocument"])
            for role in self.resolved(props.get("Roles", [])):
                attached.setdefault(str(role), []).append(name)
        for principal, role in self.roles.items():
            props = self.stack.template["Resources"][role]["Properties"]
            names = list(attached.get(role, []))
            for index, inline in enumerate(props.get("Policies", [])):
                names.append(
                    self._policy(
                        f"{role}.{inline.get('PolicyName', index)}", inline["PolicyDocument"]
                    )
                )
            managed_arns = self.resolved(props.get("ManagedPolicyArns", []))
            for managed in managed_arns if isinstance(managed_arns, list) else []:
                names.append(self._managed(str(managed)))
            self.identity[principal] = names
            self.role_arns[principal] = str(self.stack.refs[f"{role}.Arn"])
        # the people's roles are not the stack's: their policies are the stack's managed
        # policies for them (OperatorPolicy, KeyAdminPolicy)
        for person, role_arn in ((OPERATOR, OPERATOR_ROLE_ARN), (KEY_ADMIN, KEY_ADMIN_ROLE_ARN)):
            policy = PERSON_POLICIES[person]
            self.identity[person] = [policy] if policy in self.policies else []
            self.role_arns[person] = role_arn

    def _policy(self, name: str, document: Any) -> str:
        try:
            self.policies[name] = self.resolved(document)
        except Unresolvable as exc:
            self.problems.append(f"policy {name}: {exc}")
            self.policies[name] = {"Version": "2012-10-17", "Statement": []}
        return name

    def _managed(self, arn: str) -> str:
        name = arn.rsplit("/", 1)[-1]
        if name not in MANAGED_POLICIES:
            self.problems.append(
                f"AWS managed policy {arn}: its document is not in iam.MANAGED_POLICIES"
            )
            return self._policy(f"aws:{name}", {"Version": "2012-10-17", "Statement": []})
        return self._policy(f"aws:{name}", MANAGED_POLICIES[name])

    def _resource_policies(self) -> None:
        for name, props in self._of_type("AWS::KMS::Key"):
            self._policy(name, props["KeyPolicy"])
            self.resource_policies.append((str(self.stack.refs[f"{name}.Arn"]), name))
        for name, props in self._of_type("AWS::S3::BucketPolicy"):
            bucket = str(self.resolved(props["Bucket"]))
            self._policy(name, props["PolicyDocument"])
            self.resource_policies.append((f"arn:aws:s3:::{bucket}", name))
        for name, props in self._of_type("AWS::SecretsManager::ResourcePolicy"):
            secret = str(self.resolved(props["SecretId"]))
            self._policy(name, props["ResourcePolicy"])
            self.resource_policies.append((self.secrets.get(secret, (secret, ""))[0], name))
        for name, props in self._of_type("AWS::OpenSearchService::Domain"):
            if "AccessPolicies" in props:
                self._policy(name, props["AccessPolicies"])
                self.resource_policies.append(
                    (f"arn:aws:es:{REGION}:{ACCOUNT}:domain/{self.domain}/", name)
                )

    def add_outsider(self, principal: str, role_arn: str, policy: dict[str, Any]) -> None:
        """A principal of the account that is not the stack's (the negative probes' stand-in
        for whoever else holds a role there), with ``policy`` as its one identity policy."""
        name = f"{principal}Policy"
        self._policy(name, policy)
        self.identity[principal] = [name]
        self.role_arns[principal] = role_arn

    # -- asking ---------------------------------------------------------------------------------

    def resource_policy(self, resource: str) -> str | None:
        for prefix, name in self.resource_policies:
            if resource == prefix or resource.startswith(
                prefix + ("" if prefix.endswith("/") else "/")
            ):
                return name
            if resource == prefix.rstrip("/"):
                return name
        return None

    def session_arn(self, principal: str) -> str:
        role_arn = self.role_arns[principal]
        return f"arn:aws:sts::{ACCOUNT}:assumed-role/{role_arn.rsplit('/', 1)[-1]}/{principal}"


class NoClients:
    """The resolver provisions nothing: the harness already did."""

    def client(self, name: str) -> Any:
        raise RuntimeError(f"the IAM judgement calls no AWS API ({name})")


def _role_of(reference: Any) -> str:
    """The role logical id of a function's ``Role`` / a state machine's ``RoleArn``."""
    target = reference.get("Fn::GetAtt") if isinstance(reference, dict) else None
    if not target:
        raise Unresolvable(f"a role that is not the template's: {reference!r}")
    return str(target[0] if isinstance(target, list) else target.split(".")[0])


def _without_no_value(node: Any) -> Any:
    if isinstance(node, list):
        return [_without_no_value(item) for item in node if item != NO_VALUE]
    if isinstance(node, dict):
        return {k: _without_no_value(v) for k, v in node.items() if v != NO_VALUE}
    return node


# -- calls -> authorizations -----------------------------------------------------------------------


def authorizations(call: Call, world: World) -> list[Authorization]:
    """The authorizations AWS makes for ``call`` (direct and on the caller's behalf)."""
    translate = TRANSLATORS.get(call.service)
    if translate is None:
        raise Unmodelled(f"{call.service}:{call.operation} (no translation of this service)")
    found = list(translate(call, world))
    return [
        Authorization.of(
            call.principal, action, resource, {**_global(call.principal, world), **ctx}, via
        )
        for action, resource, ctx, via in found
    ]


class Unmodelled(Exception):
    """A recorded call this module cannot translate: the gate fails rather than guess."""


Found = tuple[str, str, Context, str]


def _global(principal: str, world: World) -> Context:
    return {
        "aws:PrincipalArn": world.role_arns[principal],
        "aws:PrincipalAccount": ACCOUNT,
        "aws:SecureTransport": "true",
        "aws:RequestedRegion": REGION,
    }


# DynamoDB -----------------------------------------------------------------------------------------

_WRITES: Final = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
}
_NAME_RE: Final = re.compile(r"#[A-Za-z0-9_]+|[A-Za-z_][A-Za-z0-9_]*")
_UPDATE_KEYWORDS: Final = frozenset(
    {"SET", "REMOVE", "ADD", "DELETE", "if_not_exists", "list_append"}
)


def _table(world: World, name: str) -> Table:
    table = world.tables.get(name.rsplit("/", 1)[-1])
    if table is None:
        raise Unmodelled(f"a DynamoDB table that is not the stack's: {name}")
    return table


def _hash_value(table: Table, key: dict[str, Any]) -> str:
    value = key[table.hash_key]
    return str(next(iter(value.values())))


def _names(expression: str, names: dict[str, str], *, update: bool = False) -> list[str]:
    found = []
    for token in _NAME_RE.findall(re.sub(r":[A-Za-z0-9_]+", " ", expression)):
        if update and token in _UPDATE_KEYWORDS:
            continue
        found.append(names.get(token, token))
    return sorted(set(found))


def _read_context(params: dict[str, Any]) -> Context:
    projection = params.get("ProjectionExpression")
    if projection:
        attributes = _names(projection, params.get("ExpressionAttributeNames") or {})
        return {"dynamodb:Attributes": attributes, "dynamodb:Select": "SPECIFIC_ATTRIBUTES"}
    return {"dynamodb:Select": str(params.get("Select") or "ALL_ATTRIBUTES")}


def _item_context(kind: str, item: dict[str, Any]) -> Context:
    context: Context = {}
    if kind == "Put":
        context["dynamodb:Attributes"] = sorted(item.get("Item", {}))
    elif kind == "Update" and item.get("UpdateExpression"):
        context["dynamodb:Attributes"] = _names(
            item["UpdateExpression"], item.get("ExpressionAttributeNames") or {}, update=True
        )
    if item.get("ReturnValues"):
        context["dynamodb:ReturnValues"] = str(item["ReturnValues"])
    return context


def _query_leading_key(params: dict[str, Any], table: Table) -> list[str]:
    expression = str(params.get("KeyConditionExpression", ""))
    names = params.get("ExpressionAttributeNames") or {}
    values = params.get("ExpressionAttributeValues") or {}
    for left, right in re.findall(r"([#A-Za-z0-9_]+)\s*=\s*(:[A-Za-z0-9_]+)", expression):
        if names.get(left, left) == table.hash_key:
            return [str(next(iter(values[right].values())))]
    return []


def dynamodb(call: Call, world: World) -> Iterator[Found]:
    """The item requests of ``call``, each followed by what DynamoDB asks KMS with the caller's
    permissions for a table under a customer managed key (its published key policy for
    DynamoDB: kms:ViaService dynamodb, the caller's account)."""
    keys: dict[str, Table] = {}
    for found in _dynamodb(call, world):
        yield found
        table = next((t for t in world.tables.values() if found[1].startswith(t.arn)), None)
        if table is not None and table.sse_key:
            keys[table.sse_key] = table
    for key, table in keys.items():
        via: Context = {
            "kms:CallerAccount": ACCOUNT,
            "kms:ViaService": f"dynamodb.{REGION}.amazonaws.com",
        }
        via.update(
            encryption_context(
                {
                    "aws:dynamodb:tableName": table.arn.rsplit("/", 1)[1],
                    "aws:dynamodb:subscriberId": ACCOUNT,
                }
            )
        )
        yield "kms:Decrypt", key, dict(via), "dynamodb"
        yield (
            "kms:DescribeKey",
            key,
            {"kms:CallerAccount": ACCOUNT, "kms:ViaService": via["kms:ViaService"]},
            "dynamodb",
        )


def _dynamodb(call: Call, world: World) -> Iterator[Found]:
    for handles, translate in _DYNAMODB:
        if call.operation in handles:
            yield from translate(call.operation, call.params, world)
            return
    raise Unmodelled(f"dynamodb:{call.operation}")


def _one_item(op: str, p: dict[str, Any], world: World) -> Iterator[Found]:
    table = _table(world, p["TableName"])
    key = p["Item"] if op == "PutItem" else p["Key"]
    context: Context = {"dynamodb:LeadingKeys": [_hash_value(table, key)]}
    context.update(
        _read_context(p) if op == "GetItem" else _item_context(op.removesuffix("Item"), p)
    )
    yield f"dynamodb:{op}", table.arn, context, ""


def _transaction(op: str, p: dict[str, Any], world: World) -> Iterator[Found]:
    """Each item of a transaction is authorized as its own item request."""
    for entry in p["TransactItems"]:
        ((kind, item),) = entry.items()
        table = _table(world, item["TableName"])
        action = "GetItem" if kind == "Get" else _WRITES[kind]
        key = item["Key"] if "Key" in item else item["Item"]
        context: Context = {"dynamodb:LeadingKeys": [_hash_value(table, key)]}
        context.update(_read_context(item) if kind == "Get" else _item_context(kind, item))
        context["dynamodb:EnclosingOperation"] = op
        yield f"dynamodb:{action}", table.arn, context, ""


def _batch(op: str, p: dict[str, Any], world: World) -> Iterator[Found]:
    """A batch is one request per table, naming every partition key of its items."""
    for name, request in p["RequestItems"].items():
        table = _table(world, name)
        if op == "BatchGetItem":
            keys = {_hash_value(table, key) for key in request["Keys"]}
            context: Context = {"dynamodb:LeadingKeys": sorted(keys), **_read_context(request)}
        else:
            items = [
                r["PutRequest"]["Item"] if "PutRequest" in r else r["DeleteRequest"]["Key"]
                for r in request
            ]
            context = {"dynamodb:LeadingKeys": sorted({_hash_value(table, i) for i in items})}
        yield f"dynamodb:{op}", table.arn, context, ""


def _table_request(op: str, p: dict[str, Any], world: World) -> Iterator[Found]:
    if op == "Query":
        table = _table(world, p["TableName"])
        arn = f"{table.arn}/index/{p['IndexName']}" if p.get("IndexName") else table.arn
        leading = _query_leading_key(p, table)
        yield "dynamodb:Query", arn, {"dynamodb:LeadingKeys": leading, **_read_context(p)}, ""
    elif op == "Scan":
        yield "dynamodb:Scan", _table(world, p["TableName"]).arn, _read_context(p), ""
    elif op == "DescribeExport":
        # moto names an export table/<table ARN>/import/<id>; AWS, table/<table>/export/<id>
        table_part, _, export_id = str(p["ExportArn"]).rpartition("/")
        table = _table(world, table_part.rsplit("/", 1)[0])
        yield "dynamodb:DescribeExport", f"{table.arn}/export/{export_id}", {}, ""
    else:
        yield f"dynamodb:{op}", _table(world, p.get("TableName") or p["TableArn"]).arn, {}, ""


_DYNAMODB: Final = (
    (("GetItem", "PutItem", "UpdateItem", "DeleteItem"), _one_item),
    (("TransactWriteItems", "TransactGetItems"), _transaction),
    (("BatchGetItem", "BatchWriteItem"), _batch),
    (
        (
            "Query",
            "Scan",
            "DescribeTable",
            "DescribeContinuousBackups",
            "DescribeTimeToLive",
            "ExportTableToPointInTime",
            "DescribeExport",
        ),
        _table_request,
    ),
)


# KMS ----------------------------------------------------------------------------------------------


def _key_arn(world: World, key_id: str) -> str:
    arn = world.keys.get(key_id)
    if arn is None:
        raise Unmodelled(f"a KMS key that is not the stack's: {key_id}")
    return arn


def encryption_context(pairs: dict[str, str]) -> Context:
    context: Context = {f"kms:EncryptionContext:{k}": str(v) for k, v in pairs.items()}
    if pairs:
        context["kms:EncryptionContextKeys"] = sorted(pairs)
    return context


def kms(call: Call, world: World) -> Iterator[Found]:
    p = call.params
    key_id = str(p.get("KeyId") or call.answer.get("KeyId") or "")
    context: Context = {
        "kms:CallerAccount": ACCOUNT,
        **encryption_context(p.get("EncryptionContext") or {}),
    }
    if key_id.startswith("alias/"):
        context["kms:RequestAlias"] = key_id
    if p.get("MacAlgorithm"):
        context["kms:MacAlgorithm"] = str(p["MacAlgorithm"])
    if call.operation in (
        "GetKeyRotationStatus",
        "RotateKeyOnDemand",
        "DescribeKey",
        "ListKeyRotations",
    ):
        context = {"kms:CallerAccount": ACCOUNT}
    yield f"kms:{call.operation}", _key_arn(world, key_id), context, ""


# S3 -----------------------------------------------------------------------------------------------


def s3(call: Call, world: World) -> Iterator[Found]:
    p, op = call.params, call.operation
    bucket = str(p["Bucket"])
    if bucket not in world.buckets:
        raise Unmodelled(f"an S3 bucket that is not the stack's: {bucket}")
    sse_key = world.buckets[bucket]
    bucket_arn = f"arn:aws:s3:::{bucket}"
    kms_via: Context = {
        "kms:CallerAccount": ACCOUNT,
        "kms:ViaService": f"s3.{REGION}.amazonaws.com",
    }
    kms_via.update(encryption_context({"aws:s3:arn": bucket_arn}))
    if op in ("GetObject", "HeadObject"):
        yield "s3:GetObject", f"{bucket_arn}/{p['Key']}", {}, ""
        # S3 answers a missing object 404 (NoSuchKey, which the store reads as a missing blob)
        # only to a caller that may list the bucket, 403 to any other: the check has no prefix
        yield "s3:ListBucket", bucket_arn, {}, "s3"
        if sse_key and op == "GetObject":
            yield "kms:Decrypt", sse_key, dict(kms_via), "s3"
    elif op in ("PutObject", "CopyObject"):
        yield "s3:PutObject", f"{bucket_arn}/{p['Key']}", {}, ""
        if op == "CopyObject":
            yield "s3:GetObject", f"arn:aws:s3:::{str(p['CopySource']).lstrip('/')}", {}, ""
        if sse_key:
            yield "kms:GenerateDataKey", sse_key, dict(kms_via), "s3"
    elif op == "DeleteObject":
        yield "s3:DeleteObject", f"{bucket_arn}/{p['Key']}", {}, ""
    elif op == "DeleteObjects":
        for key in p["Keys"]:
            yield "s3:DeleteObject", f"{bucket_arn}/{key}", {}, ""
    elif op in ("ListObjectsV2", "ListObjects", "HeadBucket"):
        prefix = p.get("query", {}).get("prefix")
        yield "s3:ListBucket", bucket_arn, {"s3:prefix": prefix} if prefix is not None else {}, ""
    else:
        raise Unmodelled(f"s3:{op}")


# Secrets Manager ----------------------------------------------------------------------------------


def secretsmanager(call: Call, world: World) -> Iterator[Found]:
    p, op = call.params, call.operation
    if op == "GetRandomPassword":
        yield "secretsmanager:GetRandomPassword", "*", {}, ""
        return
    secret_id = str(p.get("SecretId", ""))
    arn, key = world.secrets.get(secret_id, ("", ""))
    if not arn:
        raise Unmodelled(f"a secret that is not the stack's: {secret_id}")
    yield f"secretsmanager:{op}", arn, {}, ""
    if key and op in ("GetSecretValue", "PutSecretValue"):
        via: Context = {
            "kms:CallerAccount": ACCOUNT,
            "kms:ViaService": f"secretsmanager.{REGION}.amazonaws.com",
        }
        via.update(encryption_context({"SecretARN": arn}))
        yield (
            ("kms:Decrypt" if op == "GetSecretValue" else "kms:GenerateDataKey"),
            key,
            via,
            "secretsmanager",
        )


# Step Functions, Lambda, Logs, CloudFormation, OpenSearch ----------------------------------------


def states(call: Call, world: World) -> Iterator[Found]:
    p, op = call.params, call.operation
    if op in ("SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"):
        yield f"states:{op}", "*", {}, ""  # no resource type: AWS grants these only on "*"
    elif op in ("StartExecution", "ListExecutions", "DescribeStateMachine"):
        yield f"states:{op}", str(p["stateMachineArn"]), {}, ""
    elif op in ("DescribeExecution", "StopExecution", "GetExecutionHistory"):
        yield f"states:{op}", str(p["executionArn"]), {}, ""
    else:
        raise Unmodelled(f"states:{op}")


def lambda_(call: Call, world: World) -> Iterator[Found]:
    """Lambda authorizes an Invoke on the ARN it names: qualified (an alias, a version) when the
    name carries a qualifier, else the unqualified function's; a grant on one is none on the
    other."""
    if call.operation == "Run":
        return  # Lambda ran the function: its own requests are lambda_runtime's
    name, _, qualifier = str(call.params["FunctionName"]).rsplit(":function:", 1)[-1].partition(":")
    if name not in world.functions:
        raise Unmodelled(f"a function that is not the stack's: {name}")
    arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"
    yield "lambda:InvokeFunction", f"{arn}:{qualifier}" if qualifier else arn, {}, ""


def logs(call: Call, world: World) -> Iterator[Found]:
    p, op = call.params, call.operation
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{p.get('logGroupName', '')}"
    if op in ("CreateLogStream", "PutLogEvents"):
        yield f"logs:{op}", f"{group}:log-stream:{p.get('logStreamName', '')}", {}, ""
    elif op in ("FilterLogEvents", "GetLogEvents", "DescribeLogStreams"):
        yield f"logs:{op}", group, {}, ""
    else:
        raise Unmodelled(f"logs:{op}")


def cloudformation(call: Call, world: World) -> Iterator[Found]:
    if call.operation not in ("DescribeStacks", "ListStackResources", "DescribeStackResources"):
        raise Unmodelled(f"cloudformation:{call.operation}")
    name = str(call.params.get("StackName", ""))
    stack_arn = str(world.stack.refs["AWS::StackId"])
    arn = (
        name
        if name.startswith("arn:")
        else stack_arn.replace(f"/{stack_arn.split('/')[1]}/", f"/{name}/")
    )
    yield f"cloudformation:{call.operation}", arn, {}, ""


def sts(call: Call, world: World) -> Iterator[Found]:
    if call.operation != "GetCallerIdentity":
        raise Unmodelled(f"sts:{call.operation}")
    return iter(())  # needs no permission: AWS answers it for any signed request


def es(call: Call, world: World) -> Iterator[Found]:
    path = str(call.params["path"]).split("?", 1)[0].lstrip("/")
    yield (
        f"es:{call.operation}",
        f"arn:aws:es:{REGION}:{ACCOUNT}:domain/{world.domain}/{path}",
        {},
        "",
    )


def sns(call: Call, world: World) -> Iterator[Found]:
    if call.operation != "Publish":
        raise Unmodelled(f"sns:{call.operation}")
    yield "sns:Publish", str(call.params["TopicArn"]), {}, ""


TRANSLATORS: Final = {
    "sns": sns,
    "dynamodb": dynamodb,
    "kms": kms,
    "s3": s3,
    "secretsmanager": secretsmanager,
    "states": states,
    "lambda": lambda_,
    "logs": logs,
    "cloudformation": cloudformation,
    "sts": sts,
    "es": es,
}


def lambda_runtime(call: Call, world: World) -> list[Authorization]:
    """What Lambda does with the function's role for each invocation: its log lines in its log
    group, its trace segments (``Tracing: Active``)."""
    if call.service != "lambda" or call.operation != "Run":
        return []
    name = str(call.params["FunctionName"]).rsplit(":function:", 1)[-1].split(":", 1)[0]
    function = world.functions.get(name)
    if function is None:
        return []
    props = world.stack.template["Resources"][function]["Properties"]
    group = str(
        world.resolved((props.get("LoggingConfig") or {}).get("LogGroup", f"/aws/lambda/{name}"))
    )
    # a stream as Lambda names one: <date>/[$LATEST]<execution environment>
    day = time.strftime("%Y/%m/%d", time.gmtime())
    stream = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:{day}/[$LATEST]0"
    found = [
        ("logs:CreateLogStream", stream),
        ("logs:PutLogEvents", stream),
    ]
    if (props.get("TracingConfig") or {}).get("Mode") == "Active":
        found += [("xray:PutTraceSegments", "*"), ("xray:PutTelemetryRecords", "*")]
    return [
        Authorization.of(function, action, resource, _global(function, world), "lambda")
        for action, resource in found
    ]


# What Step Functions does with a state machine's role: the X-Ray actions of a traced machine
# (the developer guide's "IAM policies for using AWS X-Ray in Step Functions") and the log
# delivery actions of a machine that logs to CloudWatch Logs ("IAM policies for logging to
# CloudWatch Logs"; log delivery has no resource-level permissions).
STATES_TRACING: Final = (
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
    "xray:GetSamplingRules",
    "xray:GetSamplingTargets",
)
STATES_LOGGING: Final = (
    "logs:CreateLogDelivery",
    "logs:GetLogDelivery",
    "logs:UpdateLogDelivery",
    "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries",
    "logs:PutResourcePolicy",
    "logs:DescribeResourcePolicies",
    "logs:DescribeLogGroups",
)


def states_runtime(call: Call, world: World) -> list[Authorization]:
    """What Step Functions does with a machine's role when it runs (a recorded task of it)."""
    resource = world.stack.template["Resources"].get(call.principal, {})
    if resource.get("Type") != "AWS::StepFunctions::StateMachine":
        return []
    props = resource["Properties"]
    found: list[str] = []
    if (props.get("TracingConfiguration") or {}).get("Enabled"):
        found += STATES_TRACING
    if props.get("LoggingConfiguration"):
        found += STATES_LOGGING
    return [
        Authorization.of(call.principal, action, "*", _global(call.principal, world), "states")
        for action in found
    ]


def all_authorizations(
    calls: Iterable[Call], world: World
) -> tuple[list[Authorization], list[str]]:
    """Every authorization of the recording (distinct, in first-seen order) and the calls that
    could not be translated (each fails the gate)."""
    seen: dict[Authorization, None] = {}
    unmodelled: list[str] = []
    for call in calls:
        try:
            found = [
                *authorizations(call, world),
                *lambda_runtime(call, world),
                *states_runtime(call, world),
            ]
        except (Unmodelled, KeyError, Unresolvable) as exc:
            unmodelled.append(
                f"{call.principal} {call.service}:{call.operation}: {type(exc).__name__} {exc}"
            )
            continue
        for authorization in found:
            seen.setdefault(authorization, None)
    return list(seen), unmodelled


# -- the simulator ----------------------------------------------------------------------------------


class SimulatorUnavailable(RuntimeError):
    """The simulator cannot be installed or run here; the message says what to do."""


def simulator_ready() -> Path:
    """scripts/iam_simulator with its pinned packages installed (``npm ci`` on first use)."""
    script = SIMULATOR / "simulate.mjs"
    installed = SIMULATOR / "node_modules" / ".package-lock.json"
    lock = SIMULATOR / "package-lock.json"
    if installed.exists() and installed.stat().st_mtime >= lock.stat().st_mtime:
        return script
    npm = shutil.which("npm")
    if npm is None:
        raise SimulatorUnavailable("npm is not on PATH: install Node.js with npm and rerun")
    run = subprocess.run(
        [npm, "ci", "--prefix", str(SIMULATOR), "--no-audit", "--no-fund", "--loglevel=error"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if run.returncode != 0:
        raise SimulatorUnavailable(
            f"npm ci in {SIMULATOR} exited {run.returncode}: {run.stderr[-400:]}"
        )
    return script


@dataclass(frozen=True)
class Verdict:
    authorization: Authorization
    result: str  # Allowed | ImplicitlyDenied | ExplicitlyDenied | Error
    detail: str

    @property
    def allowed(self) -> bool:
        return self.result == "Allowed"

    @property
    def denied(self) -> bool:
        return self.result in ("ImplicitlyDenied", "ExplicitlyDenied")


def simulate(authorizations_: list[Authorization], world: World) -> list[Verdict]:
    """The simulator's verdict on each authorization, in order."""
    script = simulator_ready()
    node = shutil.which("node")
    if node is None:
        raise SimulatorUnavailable("node is not on PATH: install Node.js (>= 20) and rerun")
    requests = []
    for index, authorization in enumerate(authorizations_):
        requests.append(
            {
                "id": index,
                "principal": world.session_arn(authorization.principal),
                "identity": world.identity.get(authorization.principal, []),
                "resource_policy": world.resource_policy(authorization.resource),
                "action": authorization.action,
                "resource": authorization.resource,
                "account": ACCOUNT,
                "context": authorization.context_dict(),
            }
        )
    payload = json.dumps({"policies": world.policies, "requests": requests})
    run = subprocess.run(
        [node, str(script)], input=payload, capture_output=True, text=True, timeout=900, check=False
    )
    if run.returncode != 0:
        raise SimulatorUnavailable(f"the simulator exited {run.returncode}: {run.stderr[-600:]}")
    answers = {a["id"]: a for a in map(json.loads, run.stdout.splitlines())}
    return [
        Verdict(authorization, answers[i]["result"], answers[i].get("detail", ""))
        for i, authorization in enumerate(authorizations_)
    ]

"""The negative half of the IAM judgement, from the same recording: what each principal must be
denied.

- **another tenant's items**: every allowed DynamoDB request naming this tenant's scoped items
  (``S#<tenant>#…``), with the other tenant's prefix instead; every KMS request in this tenant's
  encryption context, in the other's; every OpenSearch request on this tenant's index, on the
  other's index;
- **key classes it does not use**: for every table and every item action the principal's
  policies could grant, each class of partition key (``KEY_CLASSES``) the principal never used
  with that action in the run;
- **what others did and it never did**: every request another principal made, signed by this one,
  when it never made that action on that kind of resource (so a function that must not open
  candidates is asked to decrypt a candidate's key, the tool functions to answer an approval
  wait, and so on);
- **past the alias**: every function invoked through an alias, invoked unqualified and as
  ``$LATEST`` (code no traffic shift has reached);
- **grants nobody used**: every action a statement of its own policies grants (wildcards
  expanded) that it never made, on the statement's resources, with a context that meets the
  statement's conditions: a grant the run never needed must not be there;
- **a secret's outsiders**: a principal of the account that is not the stack's, whose identity
  policy allows ``secretsmanager:*`` and ``kms:*`` on everything (an administrator's or a
  developer's role), asks for each secret's value, writes one, or removes its resource policy:
  only the secret's resource policy stands in the way, so these probes fail unless it does.

A probe is an ``Authorization`` the simulator must deny; an allowed probe fails the gate.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from .iam import Authorization, Context, World
from .settings import ACCOUNT, PERSON_POLICIES, TENANT

OTHER_TENANT: Final = "other"
PROBE: Final = "probe"
# Any principal of the account with Secrets Manager and KMS rights on everything.
OUTSIDER: Final = "AccountPrincipal"
OUTSIDER_ROLE_ARN: Final = f"arn:aws:iam::{ACCOUNT}:role/engram-probe-account-admin"
OUTSIDER_POLICY: Final = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["secretsmanager:*", "kms:*"], "Resource": "*"}],
}
# What the outsider asks of each secret: its value, a value of its own, the policy's removal.
SECRET_ACTIONS: Final = (
    "secretsmanager:GetSecretValue",
    "secretsmanager:PutSecretValue",
    "secretsmanager:UpdateSecretVersionStage",
    "secretsmanager:UpdateSecret",
    "secretsmanager:PutResourcePolicy",
    "secretsmanager:DeleteResourcePolicy",
)

# The partition key classes of each table: the prefix a key starts with, and a sample key.
KEY_CLASSES: Final[dict[str, dict[str, str]]] = {
    "EngramTable": {
        f"S#{TENANT}#": f"S#{TENANT}#ws-{PROBE}#RECORD#{PROBE}",
        "APPROVAL#": f"APPROVAL#apr_{PROBE}",
        "APPROVAL_TOKEN#": f"APPROVAL_TOKEN#apr_{PROBE}",
        "APPROVAL_EXEC#": f"APPROVAL_EXEC#forget-{PROBE}",
        "NONCE#": f"NONCE#{PROBE}",
        "REVOKED#": f"REVOKED#{TENANT}#token#{PROBE}",
        "OUTBOX": "OUTBOX",
        "BLOB_GC": "BLOB_GC",
    },
    "EngramKeyTable": {
        "key_": f"key_{PROBE}",
        "record:": f"record:{PROBE}",
        "scopekey:": f"scopekey:{PROBE}",
    },
}
# Reading an item is one capability however it is asked for (one, a batch, a query, a
# transaction's condition check); each write is its own.
READS: Final = frozenset(
    {"dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query", "dynamodb:ConditionCheckItem"}
)
ITEM_ACTIONS: Final = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:BatchWriteItem",
    "dynamodb:Scan",
)


@dataclass(frozen=True)
class Probe:
    authorization: Authorization
    why: str


def key_class(table: str, key: str) -> str:
    """The class of partition key ``key`` in table ``table`` (a logical id)."""
    classes = KEY_CLASSES.get(table, {})
    matches = [prefix for prefix in classes if key.startswith(prefix)]
    return max(matches, key=len) if matches else f"?{key[:12]}"


def signature(world: World, authorization: Authorization) -> tuple[str, str]:
    """The action and the kind of resource of a request: what "the same request" means when
    another principal is asked to make it."""
    action, resource = authorization.action, authorization.resource
    if action in READS:
        action = "dynamodb:<read>"
    if action.startswith("dynamodb:"):
        table = next((t.logical for t in world.tables.values() if resource.startswith(t.arn)), "?")
        leading = authorization.value("dynamodb:LeadingKeys") or ()
        classes = sorted({key_class(table, str(k)) for k in leading})
        return action, f"{table}|{','.join(classes)}"
    if action.startswith("kms:"):
        key_class_ = authorization.value("kms:EncryptionContext:engram:key-class")
        via = authorization.value("kms:ViaService")
        kind = f"via {via}" if via else (f"key-class {key_class_}" if key_class_ else "candidate")
        return action, f"{resource}|{kind}"
    if action.startswith("states:"):
        return action, re.sub(r"(:execution:[^:]+):.*$", r"\1", resource)
    if action.startswith("logs:"):
        return action, resource.split(":log-stream:", 1)[0]
    if action.startswith("s3:"):
        return action, "/".join(resource.split("/")[:2])
    if action.startswith("es:"):
        return action, "/".join(resource.split("/")[:3])
    return action, resource


def _replaced(authorization: Authorization, principal: str, **changes: Any) -> Authorization:
    context = authorization.context_dict()
    context.update(changes.pop("context", {}))
    return Authorization.of(
        principal,
        changes.get("action", authorization.action),
        changes.get("resource", authorization.resource),
        context,
        authorization.via,
    )


def _global(world: World, principal: str) -> Context:
    return {"aws:PrincipalArn": world.role_arns[principal]}


# -- the five kinds ---------------------------------------------------------------------------------


def other_tenant(allowed: Iterable[Authorization]) -> Iterator[Probe]:
    mine, theirs = f"S#{TENANT}#", f"S#{OTHER_TENANT}#"
    for authorization in allowed:
        leading = authorization.value("dynamodb:LeadingKeys")
        if leading and any(str(k).startswith(mine) for k in leading):
            keys = [str(k).replace(mine, theirs, 1) for k in leading]
            yield Probe(
                _replaced(
                    authorization, authorization.principal, context={"dynamodb:LeadingKeys": keys}
                ),
                "another tenant's items",
            )
        if authorization.value("kms:EncryptionContext:engram:tenant") == TENANT:
            yield Probe(
                _replaced(
                    authorization,
                    authorization.principal,
                    context={"kms:EncryptionContext:engram:tenant": OTHER_TENANT},
                ),
                "another tenant's encryption context",
            )
        index = f"/engram-{TENANT}-records"
        if authorization.action.startswith("es:") and index in authorization.resource:
            yield Probe(
                _replaced(
                    authorization,
                    authorization.principal,
                    resource=authorization.resource.replace(
                        index, f"/engram-{OTHER_TENANT}-records"
                    ),
                ),
                "another tenant's index",
            )


def past_the_alias(allowed: Iterable[Authorization]) -> Iterator[Probe]:
    """Every function the run invoked through an alias, invoked past it: the unqualified function
    and ``$LATEST`` (a deploy's new code before CodeDeploy shifts any traffic to it)."""
    for authorization in allowed:
        if authorization.action != "lambda:InvokeFunction":
            continue
        function, _, qualifier = authorization.resource.partition(":function:")[2].partition(":")
        if not qualifier or qualifier == "$LATEST":
            continue
        arn = authorization.resource.removesuffix(f":{qualifier}")
        for resource, what in ((arn, "the unqualified function"), (f"{arn}:$LATEST", "$LATEST")):
            yield Probe(
                _replaced(authorization, authorization.principal, resource=resource),
                f"a function past its alias ({function}: {what})",
            )


def unused_key_classes(world: World, allowed: Iterable[Authorization]) -> Iterator[Probe]:
    used: set[tuple[str, str, str]] = set()
    for authorization in allowed:
        action, kind = signature(world, authorization)
        if action.startswith("dynamodb:") and "|" in kind:
            table, classes = kind.split("|", 1)
            for class_ in classes.split(","):
                used.add((authorization.principal, action, f"{table}|{class_}"))
    for principal in world.role_arns:
        for found in world.tables.values():
            for action in ITEM_ACTIONS:
                group = "dynamodb:<read>" if action in READS else action
                if action == "dynamodb:Scan" and (principal, action, f"{found.logical}|") in used:
                    continue  # it scanned the table: every class at once
                for class_, sample in KEY_CLASSES.get(found.logical, {}).items():
                    if (principal, group, f"{found.logical}|{class_}") in used:
                        continue
                    context: Context = {
                        **_global(world, principal),
                        "dynamodb:LeadingKeys": [sample],
                    }
                    if action in ("dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query"):
                        context["dynamodb:Select"] = "ALL_ATTRIBUTES"
                    if action == "dynamodb:Scan":
                        context = {**_global(world, principal), "dynamodb:Select": "ALL_ATTRIBUTES"}
                    yield Probe(
                        Authorization.of(principal, action, found.arn, context),
                        f"a key class it never used ({found.logical} {class_}…)",
                    )


def what_others_did(world: World, allowed: list[Authorization]) -> Iterator[Probe]:
    made: dict[str, set[tuple[str, str]]] = {}
    for authorization in allowed:
        made.setdefault(authorization.principal, set()).add(signature(world, authorization))
    seen: set[tuple[str, tuple[str, str]]] = set()
    for authorization in allowed:
        mark = signature(world, authorization)
        for principal in world.role_arns:
            if mark in made.get(principal, set()) or (principal, mark) in seen:
                continue
            seen.add((principal, mark))
            yield Probe(
                _replaced(authorization, principal, context=_global(world, principal)),
                f"what {authorization.principal} did and it never did",
            )


def unused_grants(
    world: World, allowed: list[Authorization], actions: dict[str, dict[str, bool]]
) -> Iterator[Probe]:
    """Every action a principal's own statements grant and it never made (``actions``: every
    action of each service, to expand wildcards), on the statement's resources, with a context
    meeting the statement's conditions."""
    made = {(a.principal, a.action) for a in allowed}
    for principal, names in world.identity.items():
        for name in names:
            for statement in _allow_statements(world.policies.get(name, {})):
                for action in _expanded(statement.get("Action", []), actions):
                    if (principal, action) in made:
                        continue
                    service, _, name_ = action.partition(":")
                    wildcard_only = actions.get(service, {}).get(name_, False)
                    resources = (
                        ["*"] if wildcard_only else _concrete(statement.get("Resource", "*"))
                    )
                    for resource in resources:
                        context = {
                            **_global(world, principal),
                            **_meeting(statement.get("Condition", {})),
                        }
                        yield Probe(
                            Authorization.of(principal, action, resource, context),
                            f"granted by {name} {statement.get('Sid', '')} and never used".rstrip(),
                        )


def _allow_statements(policy: dict[str, Any]) -> Iterator[dict[str, Any]]:
    statements = policy.get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        if statement.get("Effect") == "Allow":
            yield statement


def _expanded(patterns: Any, actions: dict[str, dict[str, bool]]) -> Iterator[str]:
    for pattern in patterns if isinstance(patterns, list) else [patterns]:
        service, _, name = str(pattern).partition(":")
        if "*" not in name:
            yield f"{service}:{name}"
            continue
        for candidate in actions.get(service, []):
            if fnmatch.fnmatchcase(candidate.lower(), name.lower()):
                yield f"{service}:{candidate}"


def _concrete(resources: Any) -> Iterator[str]:
    """A resource each pattern names (a log group's ``…:*`` is its streams)."""
    for resource in resources if isinstance(resources, list) else [resources]:
        text = str(resource)
        if ":log-group:" in text and text.endswith(":*"):
            text = text.removesuffix("*") + "log-stream:*"
        yield text.replace("*", PROBE) if text != "*" else "*"


def _meeting(condition: dict[str, Any]) -> Context:
    """A context that meets a statement's conditions (string and null operators)."""
    context: Context = {}
    for operator, block in condition.items():
        for key, value in block.items():
            values = value if isinstance(value, list) else [value]
            if operator == "Null":
                if str(values[0]).lower() == "false":
                    context[key] = PROBE
                continue
            concrete = [str(v).replace("*", PROBE) for v in values]
            multi = operator.startswith("ForAllValues") or operator.startswith("ForAnyValue")
            context[key] = concrete[:1] if multi else concrete[0]
    return context


def secret_outsiders(world: World) -> Iterator[Probe]:
    """The outsider (registered in ``world`` here) asks each of the stack's secrets for its
    value, to write one and to drop its resource policy (a secret without one: allowed)."""
    world.add_outsider(OUTSIDER, OUTSIDER_ROLE_ARN, OUTSIDER_POLICY)
    for arn in sorted({arn for arn, _ in world.secrets.values()}):
        for action in SECRET_ACTIONS:
            yield Probe(
                Authorization.of(OUTSIDER, action, arn, _global(world, OUTSIDER)),
                "a secret's outsider (an account principal with secretsmanager:* and kms:*)",
            )


def all_probes(
    world: World, allowed: list[Authorization], actions: dict[str, dict[str, bool]]
) -> list[Probe]:
    """Every probe, each request once (the first reason kept). A person's duties that a key
    policy gives their role by name (the key admin's administration, the operator's content
    commands) are what the docs give that person, not a grant the code must use: another
    principal's request of the same action is not probed for them (another tenant's still is)."""
    duties = people_duties(world)
    probes: dict[Authorization, Probe] = {}
    for probe in (
        *other_tenant(allowed),
        *past_the_alias(allowed),
        *unused_key_classes(world, allowed),
        *what_others_did(world, allowed),
        *unused_grants(world, allowed, actions),
        # last: it adds the outsider to ``world``, whom the kinds above must not probe
        *secret_outsiders(world),
    ):
        a = probe.authorization
        if probe.why.startswith("what ") and any(
            p == a.principal and fnmatch.fnmatchcase(a.action, pattern) for p, pattern in duties
        ):
            continue
        probes.setdefault(a, probe)
    return list(probes.values())


def people_duties(world: World) -> set[tuple[str, str]]:
    """(person, action pattern) for every Allow statement of a resource policy that names the
    person's role by its ARN."""
    found: set[tuple[str, str]] = set()
    for _, name in world.resource_policies:
        for statement in _allow_statements(world.policies.get(name, {})):
            principal = statement.get("Principal", {})
            named = principal.get("AWS", []) if isinstance(principal, dict) else []
            for person in PERSON_POLICIES:
                if world.role_arns.get(person) in (named if isinstance(named, list) else [named]):
                    actions = statement.get("Action", [])
                    for action in actions if isinstance(actions, list) else [actions]:
                        found.add((person, str(action)))
    return found

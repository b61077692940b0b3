"""docs/deploying-aws.md's "who can do what" tables, generated from the gate's recording.

The section between ``BEGIN`` and ``END`` is what the stack's principals did in the gate's run
and the simulator allowed, grouped by principal and resource: the actions, the resource by the
template's name, and what the requests carried that the policies decide on (the partition key
classes, the KMS encryption context, the S3 prefix, the OpenSearch index). Nothing in it is
written by hand; the gate fails when it differs from the recording.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from .iam import Verdict, World
from .probes import key_class
from .settings import KEY_ADMIN, OPERATOR, ROOT, TENANT

DOCS: Final = ROOT / "docs" / "deploying-aws.md"
BEGIN: Final = "<!-- permissions: generated from the gate's recording (scripts/cloud_run/permissions.py); do not edit -->"
END: Final = "<!-- end of the generated permissions -->"


def section_of(text: str) -> str:
    """The generated section of ``text``, markers included ('' when there is none)."""
    start, end = text.find(BEGIN), text.find(END)
    return text[start : end + len(END)] if 0 <= start < end else ""


def _resource_name(world: World, resource: str) -> str:
    refs = world.stack.refs
    for table in world.tables.values():
        if resource.startswith(table.arn):
            return table.logical
    for name, value in refs.items():
        if not isinstance(value, str) or not value:
            continue
        if name.endswith(".Arn") and resource == value:
            return name.removesuffix(".Arn")
        if value.startswith("arn:aws:secretsmanager") and resource == value:
            return name
    if resource.startswith("arn:aws:s3:::"):
        bucket, _, key = resource.removeprefix("arn:aws:s3:::").partition("/")
        logical = next((n for n, v in refs.items() if v == bucket), bucket)
        return f"{logical}/{key.split('/', 1)[0]}/…" if key else logical
    if ":log-group:" in resource:
        group = resource.split(":log-group:", 1)[1].split(":log-stream:", 1)[0]
        return f"log group {group}"
    if resource.startswith("arn:aws:es:"):
        path = resource.split(f"domain/{world.domain}/", 1)[-1]
        head = path.split("/", 1)[0]
        return (
            "the domain's security API"
            if path.startswith("_plugins/_security")
            else f"index {head}"
        )
    if ":execution:" in resource:
        return "executions of " + resource.split(":execution:", 1)[1].split(":", 1)[0]
    if ":stateMachine:" in resource:
        return "state machine " + resource.split(":stateMachine:", 1)[1]
    if ":function:" in resource:
        name, _, qualifier = resource.split(":function:", 1)[1].partition(":")
        function = world.functions.get(name, name)
        return f"{function}, alias {qualifier}" if qualifier else function
    if ":stack/" in resource:
        return "the stack (CloudFormation)"
    return resource


def _limits(world: World, verdict: Verdict) -> set[str]:
    authorization = verdict.authorization
    found: set[str] = set()
    leading = authorization.value("dynamodb:LeadingKeys")
    if leading:
        table = next(
            t.logical for t in world.tables.values() if authorization.resource.startswith(t.arn)
        )
        for key in leading:
            prefix = key_class(table, str(key))
            shown = prefix.replace(f"#{TENANT}#", "#<tenant>#")
            found.add(f"`{shown}…`" if shown.endswith(("#", "_", ":")) else f"`{shown}`")
    attributes = authorization.value("dynamodb:Attributes")
    if attributes and authorization.action.endswith(("GetItem", "Query")):
        found.add("attributes " + ", ".join(attributes))
    if authorization.action.startswith("kms:"):
        via = authorization.value("kms:ViaService")
        key_class_ = authorization.value("kms:EncryptionContext:engram:key-class")
        if via:
            found.add(f"through {str(via).split('.', 1)[0]}")
        elif key_class_:
            found.add(f"key-class {key_class_}")
        elif authorization.value("kms:EncryptionContext:engram:tenant"):
            found.add("a candidate's key (no key-class)")
    s3_prefix = authorization.value("s3:prefix")
    if s3_prefix:
        found.add(f"prefix {re.sub(r'/.*', '/', str(s3_prefix))}")
    return found


def _who(principal: str) -> str:
    if principal == OPERATOR:
        return "the operator (`OperatorRoleArn`, `OperatorPolicyArn`)"
    if principal == KEY_ADMIN:
        return "the key admin (`KeyAdminRoleArn`, `KeyAdminPolicyArn`)"
    return principal


def _shown(text: str) -> str:
    """A resource or a limit as the docs show it: the tenant as ``<tenant>``."""
    return text.replace(f"engram-{TENANT}-", "engram-<tenant>-")


def _resource_label(world: World, verdict: Verdict) -> str:
    authorization = verdict.authorization
    resource = _shown(_resource_name(world, authorization.resource))
    if authorization.action == "s3:ListBucket" and authorization.via == "s3":
        return resource + " (S3's check before a missing object's 404)"
    if authorization.via == "lambda":
        return resource + " (Lambda, with the function's role)"
    if authorization.via == "states":
        return resource + " (Step Functions, with the machine's role)"
    if authorization.via:
        return resource + f" (through {authorization.via})"
    return resource


def _rows(verdicts: Iterable[Verdict], world: World) -> dict[tuple[str, str, str], set[str]]:
    """(principal, service:action, resource) -> the limits the run's requests carried."""
    rows: dict[tuple[str, str, str], set[str]] = {}
    for verdict in verdicts:
        if not verdict.allowed:
            continue
        authorization = verdict.authorization
        limits = {_shown(limit) for limit in _limits(world, verdict)}
        if authorization.via:
            limits = {limit for limit in limits if not limit.startswith("through ")}
        key = (authorization.principal, authorization.action, _resource_label(world, verdict))
        rows.setdefault(key, set()).update(limits)
    return rows


def render_section(verdicts: Iterable[Verdict], world: World) -> str:
    """Two tables: who may use each KMS key and how, then everything each principal did."""
    rows = _rows(list(verdicts), world)
    grouped: dict[tuple[str, str, str, str], set[str]] = {}
    for (principal, action, resource), limits in rows.items():
        service, name = action.split(":", 1)
        key = (principal, service, resource, "; ".join(sorted(limits)) or "—")
        grouped.setdefault(key, set()).add(name)
    keys: dict[tuple[str, str, str], set[str]] = {}
    for (principal, action, resource), limits in rows.items():
        if action.startswith("kms:"):
            for limit in sorted(limits) or ["—"]:
                keys.setdefault((resource, action, limit), set()).add(_who(principal))
    lines = [
        BEGIN,
        "",
        "**The keys.** Every KMS request the run made, by key: who made it and what it carried.",
        "",
        "| key | operation | limited to | who |",
        "|---|---|---|---|",
    ]
    for (kms_key, operation, limit), users in sorted(keys.items()):
        lines.append(f"| {kms_key} | `{operation}` | {limit} | {', '.join(sorted(users))} |")
    lines += [
        "",
        "**Every principal.** Every request the run made and the simulator allowed, by principal",
        "(a state machine and Lambda act with the principal's role where the table says so).",
        "",
        "| who | may | on | what the run's requests carried |",
        "|---|---|---|---|",
    ]
    last = ""
    for (principal, service, resource, carried), names in sorted(grouped.items()):
        who = _who(principal) if principal != last else ""
        last = principal
        actions = ", ".join(f"`{service}:{name}`" for name in sorted(names))
        lines.append(f"| {who} | {actions} | {resource} | {carried} |")
    lines += ["", END]
    return "\n".join(lines)

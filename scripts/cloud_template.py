"""template.yaml as CloudFormation receives it, and the two static gates on that artifact.

``translate`` does what ``sam package`` and the SAM transform do before CloudFormation sees the
stack: local ``CodeUri``/``ContentUri`` become S3 locations, each state machine's
``DefinitionUri`` file is inlined as its ``Definition`` (what the packaged S3 object holds), the
``AWS::Include`` of the dashboard body is inlined (what CloudFormation's include transform does),
then samtranslator expands every ``AWS::Serverless::*`` resource. ``AWS::LanguageExtensions``
stays in the output's ``Transform``: CloudFormation (and cfn-lint) process it.

``lint`` runs cfn-lint on the translated template: no error may remain, and E3004 (a circular
dependency, which CloudFormation refuses at create time) is reported on its own line. ``scan``
runs checkov on it, then the stack's own rules; ``guard`` runs cfn-guard with the AWS Control
Tower proactive controls' rules (from a pinned npm package, installed on first use). Every
finding of either scanner must be listed, with its reason, in ``infra/accepted-findings.yaml``.

Run with the tool venv (``scripts/cloud_check.sh``): cfn-lint, samtranslator and checkov live
there, not in the project venv. Output: ``  ok   ...`` / ``  FAIL ...`` lines, exit 1 on a FAIL.

Usage: python scripts/cloud_template.py {translate,lint,scan,guard} [--template T] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fnmatch
import json
import logging
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
ACCEPTED_FINDINGS: Final = ROOT / "infra" / "accepted-findings.yaml"
# Deployed once per account and region beside the tenant stacks: scanned with them, its logical
# ids distinct from theirs so that one list of acceptances serves both.
ACCOUNT_TEMPLATE: Final = ROOT / "infra" / "account.yaml"
PACKAGE_BUCKET: Final = "engram-cloud-check-packages"  # stands in for sam package's bucket
REGION: Final = "us-east-1"
CYCLE_RULE: Final = "E3004"
# The tool registry as published (``python -m engram_memory.mcp_surface.catalog`` writes it from
# the contract's input models): the gate reads the tools from here, since it runs without the
# package, so a new tool reaches the gate's lists, samples and acceptances with no edit of its own.
TOOL_SNAPSHOT: Final = ROOT / "layers" / "core" / "engram_memory" / "mcp_surface" / "tools.json"
# Groups infra/accepted-findings.yaml may name instead of each tool's resources.
TOOL_GROUPS: Final = {"ToolFunctions": "Function", "ToolFunctionLogGroups": "FunctionLogGroup"}


def tools() -> tuple[str, ...]:
    """The grant names of the registry's tools (the published snapshot's keys)."""
    return tuple(json.loads(TOOL_SNAPSHOT.read_text("utf-8")))


def tool_resource(tool: str, suffix: str = "Function") -> str:
    """The template's logical id of ``tool``'s function (``request_admission`` ->
    ``RequestAdmissionFunction``), or of another of its resources by ``suffix``."""
    return "".join(part.capitalize() for part in tool.split("_")) + suffix


class Report:
    """The ``ok``/``FAIL`` lines the shell gate counts."""

    def __init__(self) -> None:
        self.failed = 0

    def check(self, ok: bool, text: str) -> bool:
        print(f"  {'ok  ' if ok else 'FAIL'} {text}", flush=True)
        self.failed += 0 if ok else 1
        return ok


def load_template(path: Path) -> dict[str, Any]:
    from cfnlint.decode.cfn_yaml import load

    loaded: dict[str, Any] = load(str(path))
    return loaded


def _packaged(template: dict[str, Any], base: Path) -> dict[str, Any]:
    """What ``sam package`` uploads, replaced by the location CloudFormation would get."""
    packaged = copy.deepcopy(template)
    for name, resource in packaged.get("Resources", {}).items():
        props = resource.get("Properties") or {}
        kind = resource.get("Type")
        if kind == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            props["CodeUri"] = f"s3://{PACKAGE_BUCKET}/{name}.zip"
        elif kind == "AWS::Serverless::LayerVersion" and isinstance(props.get("ContentUri"), str):
            props["ContentUri"] = f"s3://{PACKAGE_BUCKET}/{name}.zip"
        elif kind == "AWS::Serverless::StateMachine" and isinstance(
            props.get("DefinitionUri"), str
        ):
            definition = json.loads((base / props.pop("DefinitionUri")).read_text("utf-8"))
            props["Definition"] = definition
    inlined: dict[str, Any] = _inline_includes(packaged, base)
    return inlined


def _inline_includes(node: Any, base: Path) -> Any:
    """``Fn::Transform: AWS::Include`` of a local file, replaced by the file's content."""
    if isinstance(node, list):
        return [_inline_includes(item, base) for item in node]
    if not isinstance(node, dict):
        return node
    transform = node.get("Fn::Transform")
    if len(node) == 1 and isinstance(transform, dict) and transform.get("Name") == "AWS::Include":
        location = str(transform["Parameters"]["Location"])
        if "://" not in location:
            return json.loads((base / location).read_text("utf-8"))
    return {key: _inline_includes(value, base) for key, value in node.items()}


def translate(path: Path, parameters: dict[str, str] | None = None) -> dict[str, Any]:
    """The template after ``sam package`` and the SAM transform (see the module docstring), for
    the parameter values CloudFormation hands the transform (``parameters``, else the defaults:
    SAM resolves some properties at translation, e.g. a DeploymentPreference's Type)."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    # Offline there is no feature-toggle config, and samtranslator warns once per
    # DeploymentPreference that "deployment_preference_condition_fix" is not in it; that toggle
    # only decides whether a function's Condition passes to its deployment group, and no
    # function with a DeploymentPreference has a Condition here.
    logging.getLogger("samtranslator.feature_toggle.feature_toggle").setLevel(logging.ERROR)
    sam_template = _packaged(load_template(path), path.parent)
    session = boto3.session.Session(
        region_name=REGION, aws_access_key_id="offline", aws_secret_access_key="offline"
    )
    translator = Translator(managed_policy_map=None, sam_parser=Parser(), boto_session=session)
    transforms = sam_template.get("Transform", [])
    translated: dict[str, Any] = translator.translate(
        sam_template=sam_template,
        parameter_values=dict(parameters or {}),
        get_managed_policy_map=lambda: {},
    )
    # The transforms other than SAM's stay for CloudFormation to run (AWS::LanguageExtensions).
    others = [
        t
        for t in (transforms if isinstance(transforms, list) else [transforms])
        if t != "AWS::Serverless-2016-10-31"
    ]
    if others:
        translated["Transform"] = others
    return translated


_NO_VALUE: Final = object()


def _parameter(template: dict[str, Any], name: str, given: dict[str, str]) -> Any:
    if name in given:
        return given[name]
    if name.startswith("AWS::"):
        return {"Ref": name}  # a pseudo parameter stays symbolic
    return template["Parameters"][name].get("Default", "")


def condition_value(template: dict[str, Any], body: Any, given: dict[str, str]) -> Any:
    """A condition's value for the parameter values ``given`` (defaults otherwise)."""
    ((key, value),) = body.items()
    if key == "Condition":
        return condition_value(template, template["Conditions"][value], given)
    if key == "Ref":
        return _parameter(template, value, given)
    if key == "Fn::Equals":
        left, right = (
            condition_value(template, v, given) if isinstance(v, dict) else v for v in value
        )
        return left == right
    if key == "Fn::Join":
        return value[0].join(str(v) for v in condition_value(template, value[1], given))
    if key == "Fn::EachMemberEquals":  # a rule's: every member of a list parameter
        members = condition_value(template, value[0], given)
        members = members.split(",") if isinstance(members, str) else members
        return all(str(member).strip() == value[1] for member in members)
    parts = [condition_value(template, v, given) for v in value]
    if key == "Fn::Not":
        return not parts[0]
    return all(parts) if key == "Fn::And" else any(parts)


def _decided(template: dict[str, Any], value: Any, given: dict[str, str]) -> Any:
    if isinstance(value, list):
        items = [_decided(template, v, given) for v in value]
        return [v for v in items if v is not _NO_VALUE]
    if not isinstance(value, dict):
        return value
    if value == {"Ref": "AWS::NoValue"}:
        return _NO_VALUE
    if set(value) == {"Fn::If"}:
        name, then, otherwise = value["Fn::If"]
        chosen = then if condition_value(template, {"Condition": name}, given) else otherwise
        return _decided(template, chosen, given)
    decided = {k: _decided(template, v, given) for k, v in value.items()}
    return {k: v for k, v in decided.items() if v is not _NO_VALUE}


def deployed(
    template: dict[str, Any], *, section: str = "Resources", **given: str
) -> dict[str, dict[str, Any]]:
    """The resources CloudFormation creates from the translated ``template`` for the parameter
    values ``given``: conditions evaluated, every ``Fn::If`` decided, ``AWS::NoValue`` dropped
    (a ``Ref`` to a parameter stays a ``Ref``). ``section="Outputs"``: the outputs it reports."""
    return {
        name: _decided(template, body, given)
        for name, body in template.get(section, {}).items()
        if "Condition" not in body
        or condition_value(template, {"Condition": body["Condition"]}, given)
    }


def refusals(template: dict[str, Any], **given: str) -> list[str]:
    """``rule: description`` of every assertion of the template's ``Rules`` that refuses the
    parameter values ``given`` (defaults otherwise), as CloudFormation would before creating
    anything."""
    refused: list[str] = []
    for name, rule in template.get("Rules", {}).items():
        condition = rule.get("RuleCondition")
        if condition is not None and not condition_value(template, condition, given):
            continue
        for assertion in rule["Assertions"]:
            if not condition_value(template, assertion["Assert"], given):
                refused.append(f"{name}: {assertion.get('AssertDescription', '')}")
    return refused


def _lint_findings(translated: dict[str, Any]) -> list[Any]:
    from cfnlint.api import ManualArgs, lint

    findings: list[Any] = lint(
        json.dumps(translated), config=ManualArgs(regions=[REGION, "eu-west-1"])
    )
    return findings


def lint(path: Path, out: Path | None, report: Report) -> None:
    try:
        translated = translate(path)
    except Exception as exc:  # the transform's own refusal is the finding
        report.check(False, f"samtranslator: {type(exc).__name__}: {exc}")
        return
    resources = translated.get("Resources", {})
    serverless = [n for n, r in resources.items() if r["Type"].startswith("AWS::Serverless::")]
    report.check(
        not serverless,
        f"samtranslator expanded the template ({len(resources)} CloudFormation resources)",
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(translated, indent=1, sort_keys=True), "utf-8")
    findings = _lint_findings(translated)
    cycles = [m for m in findings if m.rule.id == CYCLE_RULE]
    report.check(
        not cycles,
        f"no dependency cycle after the transform (cfn-lint {CYCLE_RULE}: {len(cycles)})",
    )
    for match in cycles:
        print(f"       {match.rule.id} {match.message}")
    errors = [m for m in findings if m.rule.id.startswith("E")]
    warnings = [m for m in findings if m.rule.id.startswith("W")]
    report.check(
        not errors,
        f"cfn-lint on the translated template: {len(errors)} error(s), {len(warnings)} warning(s)",
    )
    for match in [*errors, *warnings]:
        print(f"       {match.rule.id} {match.message} ({_path_of(match)})")
    check_deploy_role_policy(translated, report)


def check_deploy_role_policy(translated: dict[str, Any], report: Report) -> None:
    """infra/deploy-role-policy.json is what the template's resource handlers declare."""
    actions, unknown = deploy_role_actions(translated)
    current = DEPLOY_POLICY.read_text("utf-8") if DEPLOY_POLICY.exists() else ""
    fresh = current == deploy_role_policy(translated)
    report.check(
        not unknown and fresh,
        f"{DEPLOY_POLICY.relative_to(ROOT)}: the {len(actions)} actions the translated "
        "template's resource handlers declare"
        + (f"; no schema for {', '.join(unknown)}" if unknown else "")
        + ("" if fresh else " (stale: python scripts/cloud_template.py deploy-policy --write)"),
    )


# The deploy role (DeployRoleArn, CloudFormation's service role): CloudFormation creates, updates
# and deletes each resource with its permissions, and every resource type's registry schema lists
# the actions its handlers call (handlers.<create|read|update|delete|list>.permissions; cfn-lint
# ships the schemas). The policy is their union over the translated template's resource types
# (every condition's), plus lambda:InvokeFunction for the custom resources' service tokens, on
# "*": most resources get names CloudFormation generates, so scoping them is the operator's choice.
DEPLOY_POLICY: Final = ROOT / "infra" / "deploy-role-policy.json"
_HANDLERS: Final = ("create", "read", "update", "delete", "list")


def deploy_role_actions(translated: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The actions the template's resource handlers declare, and the types with no schema."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER

    actions: set[str] = set()
    unknown: list[str] = []
    for resource_type in sorted({r["Type"] for r in translated["Resources"].values()}):
        if resource_type.startswith("Custom::"):
            actions.add("lambda:InvokeFunction")  # CloudFormation calls the service token
            continue
        try:
            schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(REGION, resource_type).schema
        except Exception:  # an unknown type is reported, not raised
            unknown.append(resource_type)
            continue
        for handler in _HANDLERS:
            actions.update(schema.get("handlers", {}).get(handler, {}).get("permissions", []))
    # IAM action names are case-insensitive, and a schema may spell one otherwise (s3:getObject)
    spelled: dict[str, str] = {}
    for action in actions:
        spelled[action.lower()] = min(spelled.get(action.lower(), action), action)
    return [spelled[key] for key in sorted(spelled)], unknown


def deploy_role_policy(translated: dict[str, Any]) -> str:
    actions, _ = deploy_role_actions(translated)
    statement = {
        "Sid": "CreateUpdateDeleteTheStacksResources",
        "Effect": "Allow",
        "Action": actions,
        "Resource": "*",
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]}, indent=2) + "\n"


def _path_of(match: Any) -> str:
    path = getattr(getattr(match, "path", None), "path", None) or []
    return "/".join(str(part) for part in path[:3])


# --------------------------------------------------------------------------------------------
# checkov
# --------------------------------------------------------------------------------------------


def accepted_findings(scanner: str = "checkov") -> dict[tuple[str, str], str]:
    """(check id, resource) -> reason, from the ``scanner`` section of
    infra/accepted-findings.yaml (``checkov``, ``cfn-guard``)."""
    import yaml

    loaded = yaml.safe_load(ACCEPTED_FINDINGS.read_text("utf-8")) or {}
    accepted: dict[tuple[str, str], str] = {}
    for entry in loaded.get(scanner, []):
        reason = str(entry.get("reason", "")).strip()
        if not reason:
            raise ValueError(f"{ACCEPTED_FINDINGS.name}: {entry.get('check')} has no reason")
        for resource in _expanded(entry["resources"]):
            accepted[(str(entry["check"]), resource)] = reason
    return accepted


def _expanded(resources: list[Any]) -> list[str]:
    """An acceptance's resources, each group of ``TOOL_GROUPS`` as every tool's resource."""
    expanded: list[str] = []
    for resource in map(str, resources):
        suffix = TOOL_GROUPS.get(resource)
        expanded += [resource] if suffix is None else [tool_resource(t, suffix) for t in tools()]
    return expanded


def _checkov_failures(translated: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    with tempfile.TemporaryDirectory(prefix="cloud-check-") as work:
        target = Path(work) / "translated.template.json"
        target.write_text(json.dumps(translated, indent=1), "utf-8")
        checkov = Path(sys.executable).with_name("checkov")
        run = subprocess.run(
            [
                str(checkov),
                "--file",
                str(target),
                "--framework",
                "cloudformation",
                "--output",
                "json",
                "--compact",
                "--quiet",
                "--skip-download",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        if run.returncode not in (0, 1) or not run.stdout.strip():
            raise RuntimeError(f"checkov exited {run.returncode}: {run.stderr.strip()[-2000:]}")
        results = json.loads(run.stdout)
    for block in results if isinstance(results, list) else [results]:
        for failed in block.get("results", {}).get("failed_checks", []):
            resource = str(failed["resource"]).split(".", 1)[-1]
            yield str(failed["check_id"]), resource, str(failed.get("check_name", ""))


# --------------------------------------------------------------------------------------------
# cfn-guard: the AWS Control Tower proactive controls and the well-architected rule sets
# --------------------------------------------------------------------------------------------
# The npm package of the CDK's cfn-guard validator ships the released cfn-guard binary for Linux
# and macOS (x86_64, aarch64; its version in guard-version.json) and the rules of the Control
# Tower proactive controls (rules/control-tower/cfn-guard, one .guard file per control), both
# Apache-2.0: pinning the package pins both. npm installs it into .cfn-guard/<version>/ (ignored
# by git) on first use. The Guard Rules Registry's well-architected rule sets (Reliability and
# Security pillars) are in no package: infra/guard-rules/ holds them as the registry builds them,
# with their licence and source commit.

GUARD_PACKAGE: Final = "@cdklabs/cdk-validator-cfnguard"
GUARD_PACKAGE_VERSION: Final = "0.0.62"
GUARD_HOME: Final = ROOT / ".cfn-guard"
CONTROL_TOWER_RULES: Final = "rules/control-tower/cfn-guard"  # in the package
REGISTRY_RULE_SETS: Final = tuple(
    ROOT / "infra" / "guard-rules" / f"wa-{pillar}-Pillar.guard"
    for pillar in ("Reliability", "Security")
)
TEMPLATE_WIDE: Final = "(template)"  # a failed rule that names no resource
GUARD_SYSTEMS: Final = {"Linux": "ubuntu", "Darwin": "macos"}
GUARD_MACHINES: Final = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
}
GUARD_NONCOMPLIANT: Final = 19  # cfn-guard validate's exit status when a rule failed
CONTROL_ID: Final = re.compile(r"\[(CT\.[A-Z0-9]+\.PR\.\d+)\]:\s*(.*)")
VIOLATION: Final = re.compile(r"Violation:\s*([^;\n]*)")  # the registry's rules


class GuardUnavailable(RuntimeError):
    """cfn-guard cannot be installed or run here; the message says what to do."""


def guard_package(home: Path = GUARD_HOME) -> Path:
    """The pinned package's folder; npm installs it into ``home`` on first use."""
    installed = home / GUARD_PACKAGE_VERSION
    package = installed / "node_modules" / GUARD_PACKAGE
    if (package / "package.json").is_file():
        return package
    npm = shutil.which("npm")
    spec = f"{GUARD_PACKAGE}@{GUARD_PACKAGE_VERSION}"
    if npm is None:
        raise GuardUnavailable(
            f"npm is not on PATH: install Node.js with npm (e.g. apt-get install npm) and rerun; "
            f"the gate installs {spec} (cfn-guard, the Control Tower rules) into {home.name}/"
        )
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=home))
    try:
        # No peer dependencies (aws-cdk-lib), no scripts: only the binary and the rules are used.
        options = ["--no-save", "--ignore-scripts", "--legacy-peer-deps", "--no-audit", "--no-fund"]
        run = subprocess.run(
            [npm, "install", "--prefix", str(staging), *options, "--loglevel=error", spec],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        if run.returncode != 0:
            raise GuardUnavailable(
                f"npm install {spec} exited {run.returncode}: {run.stderr.strip()[-500:]}"
            )
        # Atomic; when a concurrent install got there first, its copy stays and this one goes.
        with contextlib.suppress(OSError):
            staging.rename(installed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return package


def guard_binary(package: Path) -> Path:
    system = GUARD_SYSTEMS.get(platform.system())
    machine = GUARD_MACHINES.get(platform.machine().lower())
    binary = package / "bin" / str(system) / str(machine) / "cfn-guard"
    if system is None or machine is None or not binary.is_file():
        raise GuardUnavailable(
            f"{GUARD_PACKAGE}@{GUARD_PACKAGE_VERSION} has no cfn-guard for "
            f"{platform.system()} {platform.machine()} (only Linux and macOS, x86_64 and aarch64)"
        )
    return binary


def guard_version(package: Path) -> str:
    released: dict[str, Any] = json.loads((package / "guard-version.json").read_text("utf-8"))
    return str(released.get("version", "?"))


def _guard_detail(node: Any, paths: set[str], messages: set[str]) -> None:
    """The data paths a failed rule's clauses reached, and its custom messages."""
    if isinstance(node, list):
        for item in node:
            _guard_detail(item, paths, messages)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "path" and isinstance(value, str):
                paths.add(value)
            elif key == "custom_message" and isinstance(value, str):
                messages.add(value)
            else:
                _guard_detail(value, paths, messages)


def guard_rule_sets(package: Path) -> list[Path]:
    return [package / CONTROL_TOWER_RULES, *REGISTRY_RULE_SETS]


def _named(failure: dict[str, Any]) -> tuple[str, set[str], str]:
    """A failed rule's name (its Control Tower control id, else its guard rule name), the
    resources it reports, and its title."""
    paths: set[str] = set()
    messages: set[str] = set()
    _guard_detail(failure, paths, messages)
    control = [m for text in messages for m in CONTROL_ID.finditer(text)]
    violation = [m for text in messages for m in VIOLATION.finditer(text)]
    if control:
        rule, title = control[0].group(1), control[0].group(2)
    else:
        rule = str(failure.get("Rule", {}).get("name", "?"))
        title = violation[0].group(1) if violation else ""
    resources = {p.split("/")[2] for p in paths if p.startswith("/Resources/")}
    return rule, resources or {TEMPLATE_WIDE}, title.strip()


def guard_failures(
    translated: dict[str, Any], package: Path, rule_sets: list[Path] | None = None
) -> list[tuple[str, str, str]]:
    """(rule, resource, title) for each resource a rule of ``rule_sets`` (rule files or folders;
    default: every set the gate runs) finds non-compliant, sorted; a rule in two sets once."""
    binary = guard_binary(package)
    with tempfile.TemporaryDirectory(prefix="cloud-check-") as work:
        target = Path(work) / "translated.template.json"
        target.write_text(json.dumps(translated, indent=1), "utf-8")
        sets = guard_rule_sets(package) if rule_sets is None else rule_sets
        rules = [arg for rule_set in sets for arg in ("--rules", str(rule_set))]
        output = ["--structured", "--output-format", "json", "--show-summary", "none"]
        run = subprocess.run(
            [str(binary), "validate", *rules, "--data", str(target), *output],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
    if run.returncode not in (0, GUARD_NONCOMPLIANT) or not run.stdout.strip():
        raise RuntimeError(f"cfn-guard exited {run.returncode}: {run.stderr.strip()[-2000:]}")
    found: dict[tuple[str, str], str] = {}
    for data_file in json.loads(run.stdout):
        for failure in data_file.get("not_compliant", []):
            rule, resources, title = _named(failure)
            for resource in resources:
                found.setdefault((rule, resource), title)
    return sorted((rule, resource, title) for (rule, resource), title in found.items())


def guard(path: Path, report: Report) -> None:
    try:
        package = guard_package()
        found = guard_failures(translate(path), package)
        found = sorted(set(found) | set(guard_failures(load_template(ACCOUNT_TEMPLATE), package)))
    except GuardUnavailable as exc:
        report.check(False, f"cfn-guard: {exc}")
        return
    label = (
        f"cfn-guard {guard_version(package)} on the translated template and "
        f"{ACCOUNT_TEMPLATE.relative_to(ROOT)} (the Control Tower rules "
        f"of {GUARD_PACKAGE}@{GUARD_PACKAGE_VERSION}, the well-architected rule sets of "
        f"{REGISTRY_RULE_SETS[0].parent.relative_to(ROOT)}/)"
    )
    judge("cfn-guard", label, found, accepted_findings("cfn-guard"), report)


def judge(
    scanner: str,
    label: str,
    found: list[tuple[str, str, str]],
    accepted: dict[tuple[str, str], str],
    report: Report,
) -> None:
    """A scanner's findings against its acceptances: every finding must be accepted, and an
    acceptance that matches no finding is stale, a FAIL too (remove it with the fix: an
    acceptance nobody needs is a reason nobody re-reads)."""
    unlisted = [(c, r, n) for c, r, n in found if (c, r) not in accepted]
    listed = [(c, r, n) for c, r, n in found if (c, r) in accepted]
    stale = sorted(set(accepted) - {(c, r) for c, r, _ in found})
    report.check(
        not unlisted,
        f"{label}: {len(found)} finding(s), {len(listed)} accepted in "
        f"{ACCEPTED_FINDINGS.relative_to(ROOT)} ({scanner}), {len(unlisted)} not listed",
    )
    for check, resource, name in unlisted:
        print(f"       {check} {resource}: {name}")
    report.check(
        not stale, f"{scanner}: every acceptance still matches a finding ({len(stale)} stale)"
    )
    for check, resource in stale:
        print(f"       {check} {resource} is accepted but no longer found; remove it")


# --------------------------------------------------------------------------------------------
# The stack's own rules on the translated template (the reviewer's items neither scanner knows)
# --------------------------------------------------------------------------------------------

RUNTIME_SERVICES: Final = ("lambda.amazonaws.com", "states.amazonaws.com")
KEY_CONTROL_ACTIONS: Final = ("kms:PutKeyPolicy", "kms:CreateGrant")
ITEM_WRITES: Final = (
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
)
DEPLOYER: Final = json.dumps({"Ref": "DeployRoleArn"})


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _statements(document: Any) -> Iterator[dict[str, Any]]:
    """A policy document's Allow statements, both branches of an ``Fn::If`` included."""
    pending = list(_as_list(document.get("Statement", [])))
    while pending:
        node = pending.pop()
        if isinstance(node, dict) and "Fn::If" in node:
            pending.extend(b for b in node["Fn::If"][1:] if b != {"Ref": "AWS::NoValue"})
        elif isinstance(node, dict) and node.get("Effect") == "Allow":
            yield node


def _covers(statement: dict[str, Any], action: str) -> bool:
    return any(
        fnmatch.fnmatchcase(action.lower(), str(pattern).lower())
        for pattern in _as_list(statement.get("Action", []))
    )


def _principals(statement: dict[str, Any]) -> set[str]:
    principal = statement.get("Principal", {})
    named = principal.get("AWS", []) if isinstance(principal, dict) else [principal]
    return {json.dumps(p, sort_keys=True) for p in _as_list(named)}


def runtime_roles(translated: dict[str, Any]) -> set[str]:
    """Logical ids of the roles a function or a state machine runs as."""
    found = set()
    for name, resource in translated["Resources"].items():
        if resource["Type"] != "AWS::IAM::Role":
            continue
        trust = resource["Properties"].get("AssumeRolePolicyDocument", {})
        services = {
            str(s)
            for statement in _statements(trust)
            for s in _as_list(statement.get("Principal", {}).get("Service", []))
        }
        if services & set(RUNTIME_SERVICES):
            found.add(name)
    return found


def role_statements(translated: dict[str, Any], role: str) -> Iterator[dict[str, Any]]:
    """Every Allow statement of the IAM policies attached to ``role`` (inline or separate)."""
    resources = translated["Resources"]
    for policy in resources[role]["Properties"].get("Policies", []):
        yield from _statements(policy["PolicyDocument"])
    target = {"Ref": role}
    for resource in resources.values():
        props = resource.get("Properties", {})
        attached = props.get("RoleName") == target or target in props.get("Roles", [])
        if resource["Type"] in ("AWS::IAM::RolePolicy", "AWS::IAM::Policy") and attached:
            yield from _statements(props["PolicyDocument"])


def key_policy_violations(translated: dict[str, Any]) -> list[str]:
    """Only the deploying role may change a key policy; no runtime role may change one or grant."""
    resources = translated["Resources"]
    runtime = runtime_roles(translated)
    runtime_arns = {json.dumps({"Fn::GetAtt": [r, "Arn"]}, sort_keys=True) for r in runtime}
    wrong = []
    for name, resource in resources.items():
        if resource["Type"] != "AWS::KMS::Key":
            continue
        for statement in _statements(resource["Properties"]["KeyPolicy"]):
            sid = f"{name}.{statement.get('Sid', '?')}"
            principals = _principals(statement)
            if _covers(statement, "kms:PutKeyPolicy") and principals != {DEPLOYER}:
                wrong.append(f"{sid}: kms:PutKeyPolicy for {sorted(principals)}")
            held = [a for a in KEY_CONTROL_ACTIONS if _covers(statement, a)]
            if held and principals & runtime_arns:
                wrong.append(f"{sid}: {held} for a runtime role")
    for role in sorted(runtime):
        for statement in role_statements(translated, role):
            held = [a for a in KEY_CONTROL_ACTIONS if _covers(statement, a)]
            if held:
                wrong.append(f"{role}.{statement.get('Sid', '?')}: {held} in its IAM policy")
    return wrong


def item_write_violations(translated: dict[str, Any]) -> list[str]:
    """Every item write of a runtime role is bounded by a non-wildcard dynamodb:LeadingKeys."""
    tables = {n for n, r in translated["Resources"].items() if r["Type"] == "AWS::DynamoDB::Table"}
    wrong = []
    for role in sorted(runtime_roles(translated)):
        for statement in role_statements(translated, role):
            targets = {t for kind, t in _references(statement.get("Resource")) if t in tables}
            writes = [a for a in ITEM_WRITES if _covers(statement, a)]
            if not (targets and writes):
                continue
            like = statement.get("Condition", {}).get("ForAllValues:StringLike", {})
            leading = _as_list(like.get("dynamodb:LeadingKeys", []))
            if not leading or "*" in leading:
                wrong.append(f"{role}.{statement.get('Sid', '?')}: {writes} on any item")
    return wrong


def _references(node: Any) -> Iterator[tuple[str, str]]:
    if isinstance(node, list):
        for item in node:
            yield from _references(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "Ref" and isinstance(value, str):
                yield "ref", value
            elif key == "Fn::GetAtt":
                yield "getatt", str(value[0] if isinstance(value, list) else value.split(".")[0])
            elif key == "Fn::Sub":  # "text" or ["text", {variables}]
                text, variables = (value, {}) if isinstance(value, str) else value
                for target in re.findall(r"\$\{([A-Za-z0-9]+)(?:\.[A-Za-z]+)?\}", text):
                    if target not in variables:
                        yield "sub", target
                yield from _references(variables)
            else:
                yield from _references(value)


def references(node: Any) -> set[str]:
    """Every logical id or parameter ``node`` names (Ref, Fn::GetAtt, Fn::Sub's ${...})."""
    return {name for _, name in _references(node)}


def _routes(translated: dict[str, Any]) -> Iterator[tuple[str, str, bool, set[str], set[str]]]:
    """(API, route key, public?, functions it reaches, throttle settings) per HTTP API route."""
    resources = translated["Resources"]
    for name, api in resources.items():
        if api["Type"] != "AWS::ApiGatewayV2::Api" or "Body" not in api["Properties"]:
            continue
        settings = {
            key: set(value)
            for r in resources.values()
            if r["Type"] == "AWS::ApiGatewayV2::Stage"
            and r["Properties"].get("ApiId") == {"Ref": name}
            for key, value in r["Properties"].get("RouteSettings", {}).items()
        }
        for path, operations in api["Properties"]["Body"]["paths"].items():
            for method, operation in operations.items():
                route = f"{method.upper()} {path}"
                uri = operation.get("x-amazon-apigateway-integration", {}).get("uri")
                functions = {target for _, target in _references(uri)}
                public = {"NONE": []} in operation.get("security", [])
                yield name, route, public, functions, settings.get(route, set())


def public_functions(translated: dict[str, Any]) -> set[str]:
    """Functions that only routes without an authorizer reach."""
    reached: dict[str, bool] = {}
    for _, _, public, functions, _ in _routes(translated):
        for function in functions:
            reached[function] = reached.get(function, True) and public
    return {function for function, only_public in reached.items() if only_public}


def public_route_violations(translated: dict[str, Any]) -> list[str]:
    """Every route without an authorizer is throttled on its own, and a function only such
    routes reach has reserved (capped) concurrency."""
    limits = {"ThrottlingBurstLimit", "ThrottlingRateLimit"}
    wrong = [
        f"{api} {route}: public and not throttled"
        for api, route, public, _, settings in _routes(translated)
        if public and not limits <= settings
    ]
    resources = translated["Resources"]
    for function in sorted(public_functions(translated)):
        if "ReservedConcurrentExecutions" not in resources[function]["Properties"]:
            wrong.append(f"{function}: only public routes reach it, no reserved concurrency")
    return wrong


def secret_violations(translated: dict[str, Any]) -> list[str]:
    """Every secret a function reads is under a key of the stack, rotates, and has a resource
    policy that refuses its value to every function role but its readers': whoever reads one can
    forge what it keys (an approver's session, a requestState, a page cursor)."""
    resources = translated["Resources"]
    runtime = runtime_roles(translated)
    readers: dict[str, set[str]] = {}
    for role in runtime:
        for statement in role_statements(translated, role):
            if _covers(statement, "secretsmanager:GetSecretValue"):
                for _, secret in _references(statement.get("Resource")):
                    readers.setdefault(secret, set()).add(role)
    rotated = {
        target
        for r in resources.values()
        if r["Type"] == "AWS::SecretsManager::RotationSchedule"
        for _, target in _references(r["Properties"].get("SecretId"))
    }
    wrong = []
    for secret, roles in sorted(readers.items()):
        if "KmsKeyId" not in resources[secret]["Properties"]:
            wrong.append(f"{secret}: read by {sorted(roles)}, under the AWS-managed key")
        if secret not in rotated:
            wrong.append(f"{secret}: read by {sorted(roles)}, never rotated")
        excepted = _read_only_by(resources, secret)
        if excepted is None:
            wrong.append(f"{secret}: read by {sorted(roles)}, no resource policy refuses others")
        elif excepted & runtime != roles:
            wrong.append(
                f"{secret}: read by {sorted(roles)}, its resource policy lets "
                f"{sorted(excepted & runtime)} read it"
            )
    return wrong


def _read_only_by(resources: dict[str, Any], secret: str) -> set[str] | None:
    """What the secret's resource policy excepts from its Deny of GetSecretValue (by
    aws:PrincipalArn), as logical ids and parameters; None without such a Deny."""
    for resource in resources.values():
        props = resource.get("Properties", {})
        if resource["Type"] != "AWS::SecretsManager::ResourcePolicy" or props.get("SecretId") != {
            "Ref": secret
        }:
            continue
        for statement in _as_list(props.get("ResourcePolicy", {}).get("Statement", [])):
            condition = statement.get("Condition", {})
            principals = condition.get("StringNotEquals", {}).get("aws:PrincipalArn")
            if (
                statement.get("Effect") == "Deny"
                and statement.get("Principal") == "*"
                and "secretsmanager:GetSecretValue" in _as_list(statement.get("Action"))
                and set(condition) == {"StringNotEquals"}
                and principals is not None
            ):
                return {target for _, target in _references(principals)}
    return None


# -- evaluating a role's statements for one request ------------------------------------------
# moto's IAM enforcement (INITIAL_NO_AUTH_ACTION_COUNT) checks actions and resources but no
# condition keys, so it would allow every write a dynamodb:LeadingKeys condition denies. This
# evaluator covers what the stack's policies use: Allow statements, wildcard actions, a resource
# that is a !GetAtt/!Ref of a logical id (or "*"), String{Equals,Like} with the ForAllValues /
# ForAnyValue qualifiers; any other operator makes the statement not apply (deny, never allow).

STRING_OPERATORS: Final[dict[str, Callable[[str, str], bool]]] = {
    "StringEquals": lambda value, pattern: value == pattern,
    "StringLike": lambda value, pattern: fnmatch.fnmatchcase(value, pattern),
}


def _resolved(value: Any, parameters: dict[str, str]) -> str:
    """A condition value: a literal, or an !Sub of parameters."""
    if isinstance(value, dict) and "Fn::Sub" in value:
        return re.sub(r"\$\{([A-Za-z0-9:]+)\}", lambda m: parameters[m.group(1)], value["Fn::Sub"])
    if isinstance(value, dict) and "Ref" in value:
        return parameters[value["Ref"]]
    return str(value)


def _condition_holds(
    condition: dict[str, Any], context: dict[str, list[str]], parameters: dict[str, str]
) -> bool:
    for operator, tests in condition.items():
        qualifier, _, name = operator.rpartition(":")
        match = STRING_OPERATORS.get(name)
        if match is None:
            return False
        for key, expected in tests.items():
            patterns = [_resolved(v, parameters) for v in _as_list(expected)]
            values = context.get(key, [])
            hits = [any(match(v, p) for p in patterns) for v in values]
            if qualifier == "ForAllValues":
                ok = all(hits)
            elif qualifier == "ForAnyValue":
                ok = any(hits)
            elif not qualifier:
                ok = len(hits) == 1 and hits[0]
            else:
                return False
            if not ok:
                return False
    return True


def role_allows(
    translated: dict[str, Any],
    role: str,
    action: str,
    resource: str,
    context: dict[str, list[str]],
    parameters: dict[str, str],
) -> bool:
    """Whether one of ``role``'s IAM statements allows ``action`` on the logical id ``resource``
    with the request's condition ``context`` (e.g. ``{"dynamodb:LeadingKeys": [pk]}``)."""
    for statement in role_statements(translated, role):
        targets = statement.get("Resource")
        on_it = targets == "*" or resource in {t for _, t in _references(targets)}
        if (
            _covers(statement, action)
            and on_it
            and _condition_holds(statement.get("Condition", {}), context, parameters)
        ):
            return True
    return False


def scan(path: Path, report: Report) -> None:
    translated = translate(path)
    found = set(_checkov_failures(translated))
    found |= set(_checkov_failures(load_template(ACCOUNT_TEMPLATE)))
    label = f"checkov on the translated template and {ACCOUNT_TEMPLATE.relative_to(ROOT)}"
    judge("checkov", label, sorted(found), accepted_findings(), report)
    for rule, violations in stack_rules(translated).items():
        report.check(not violations, f"rule {rule}: {len(violations)} violation(s)")
        for violation in violations:
            print(f"       {violation}")


def stack_rules(translated: dict[str, Any]) -> dict[str, list[str]]:
    """The stack's own rules (separation of duties, item scope, public routes, the secrets)."""
    return {
        "only the deploying role changes a key policy; no runtime role holds it or CreateGrant": (
            key_policy_violations(translated)
        ),
        "every item write of a runtime role is bounded by dynamodb:LeadingKeys": (
            item_write_violations(translated)
        ),
        "every public route is throttled; its functions reserve concurrency": (
            public_route_violations(translated)
        ),
        "every secret a function reads is under the stack's key, rotates, and refuses others": (
            secret_violations(translated)
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["translate", "lint", "scan", "guard", "deploy-policy"])
    parser.add_argument("--write", action="store_true", help="deploy-policy: rewrite the file")
    parser.add_argument("--template", type=Path, default=ROOT / "template.yaml")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report = Report()
    if args.command == "translate":
        translated = translate(args.template)
        text = json.dumps(translated, indent=1, sort_keys=True)
        if args.out is None:
            print(text)
        else:
            args.out.write_text(text, "utf-8")
        return 0
    if args.command == "deploy-policy":
        text = deploy_role_policy(translate(args.template))
        if args.write:
            DEPLOY_POLICY.write_text(text, "utf-8")
        else:
            print(text, end="")
        return 0
    if args.command == "lint":
        lint(args.template, args.out, report)
    elif args.command == "guard":
        guard(args.template, report)
    else:
        scan(args.template, report)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

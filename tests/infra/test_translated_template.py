"""template.yaml as CloudFormation receives it: packaged, SAM-translated, then cfn-lint.

``sam validate --lint`` and cfn-lint on ``template.yaml`` see the SAM resources unexpanded; a
dependency cycle through the resources SAM generates (the HTTP API's OpenAPI body, the function
permissions) only shows once the template is translated. ``scripts/cloud_template.py`` is the
translation the cloud gate (``make cloud-check``) uses; these tests run it in the suite too.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Final

from scripts.cloud_template import _lint_findings, _packaged, load_template, translate

ROOT: Final = Path(__file__).resolve().parents[2]
TEMPLATE: Final = ROOT / "template.yaml"


@cache
def translated() -> dict[str, Any]:
    return translate(TEMPLATE)


def test_the_translation_leaves_no_serverless_resource() -> None:
    kinds = {resource["Type"] for resource in translated()["Resources"].values()}
    assert not {kind for kind in kinds if kind.startswith("AWS::Serverless::")}
    assert {
        "AWS::Lambda::Function",
        "AWS::ApiGatewayV2::Api",
        "AWS::StepFunctions::StateMachine",
    } <= kinds


def test_the_translated_template_has_no_dependency_cycle_and_no_lint_error() -> None:
    findings = _lint_findings(translated())
    errors = [f"{m.rule.id} {m.message}" for m in findings if m.rule.id.startswith("E")]
    assert not [e for e in errors if e.startswith("E3004")], errors  # the cycle, named
    assert not errors


def test_packaging_inlines_the_state_machines_and_the_dashboard_body() -> None:
    packaged = _packaged(load_template(TEMPLATE), ROOT)["Resources"]
    for machine in ("WithdrawStateMachine", "ForgetStateMachine"):
        assert "DefinitionUri" not in packaged[machine]["Properties"]
        assert "States" in packaged[machine]["Properties"]["Definition"]
    body = packaged["Dashboard"]["Properties"]["DashboardBody"]["Fn::ToJsonString"]
    assert "widgets" in body
    assert packaged["CoreLayer"]["Properties"]["ContentUri"].startswith("s3://")

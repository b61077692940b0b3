"""How many tenant stacks fit one account and region, per deployment profile, from the template
and the account's default quotas.

What one stack takes is read from the SAM-translated template (``cloud_template.deployed``, the
profile's parameter values, every other parameter at its default): reserved Lambda concurrency,
IAM roles, CloudWatch Logs resource policies, OpenSearch domains, DynamoDB tables, state
machines, user pools, one CloudFormation stack. The quotas (``infra/quotas.json``) are AWS's
published defaults with their source; nothing is fetched. The tenants that fit are the smallest
quota divided by what a stack takes; the rates (API Gateway, KMS) are shared by every tenant and
shown as what they leave each one.

Usage: python -m scripts.tenant_quotas   (prints the Markdown table docs/deploying-aws.md shows)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Final

from scripts.cloud_template import ROOT, deployed, translate
from scripts.cost_table import PROFILES, _parameter_default

QUOTAS: Final = ROOT / "infra" / "quotas.json"
# The profiles the table shows: each with the account stack's log policy (many tenants).
SHOWN: Final = ("dev", "production", "existing (shared domain)")
COUNTED: Final[dict[str, str]] = {
    "logs_resource_policies": "AWS::Logs::ResourcePolicy",
    "opensearch_domains": "AWS::OpenSearchService::Domain",
    "iam_roles": "AWS::IAM::Role",
    "dynamodb_tables": "AWS::DynamoDB::Table",
    "state_machines": "AWS::StepFunctions::StateMachine",
    "cognito_user_pools": "AWS::Cognito::UserPool",
}


def reserved_concurrency(template: dict[str, Any], resources: dict[str, Any]) -> int:
    """The concurrency a stack's functions reserve (parameters at their defaults)."""
    total = 0
    for body in resources.values():
        if body["Type"] == "AWS::Lambda::Function":
            value = body["Properties"].get("ReservedConcurrentExecutions")
            total += int(_parameter_default(template, value) or 0)
    return total


def usage(template: dict[str, Any], given: dict[str, str]) -> dict[str, int]:
    """What one stack takes of each counted quota."""
    resources = deployed(template, **given)
    taken = {
        quota: sum(1 for body in resources.values() if body["Type"] == kind)
        for quota, kind in COUNTED.items()
    }
    taken["lambda_concurrency"] = reserved_concurrency(template, resources)
    taken["cloudformation_stacks"] = 1
    return taken


def fits(quota: dict[str, Any], taken: int) -> int | None:
    """Stacks that fit ``quota`` when each takes ``taken`` (None: it does not bound them)."""
    if taken == 0:
        return None
    return (int(quota["value"]) - int(quota.get("unreserved_minimum", 0))) // taken


def _cell(quota: dict[str, Any], taken: int) -> str:
    bound = fits(quota, taken)
    return f"{taken} → {bound:,}" if bound is not None else "0 → no bound"


def markdown(template: dict[str, Any], quotas: dict[str, Any]) -> str:
    table = quotas["quotas"]
    header = " | ".join(SHOWN)
    lines = [
        f"| Quota (default, {quotas['as_of']}) | Default | {header} |",
        "|---|---:|" + "---:|" * len(SHOWN),
    ]
    takes = {p: usage(template, {**PROFILES[p], "OpenSearchLogsPolicy": "account"}) for p in SHOWN}
    for key in ("lambda_concurrency", *COUNTED, "cloudformation_stacks"):
        quota = table[key]
        cells = " | ".join(_cell(quota, takes[p][key]) for p in SHOWN)
        lines.append(f"| {quota['name']} | {int(quota['value']):,} | {cells} |")
    lines.append(_tenants_row("account log policy", [_bound(table, takes[p]) for p in SHOWN]))
    own = [_bound(table, usage(template, PROFILES[p])) for p in SHOWN]
    lines.append(_tenants_row("each stack's own log policy", own))
    return "\n".join(lines)


def _bound(table: dict[str, Any], taken: dict[str, int]) -> int:
    """The stacks that fit every quota at once."""
    return min(b for k, n in taken.items() if (b := fits(table[k], n)) is not None)


def _tenants_row(label: str, bounds: list[int]) -> str:
    cells = " | ".join(f"**{b:,}**" for b in bounds)
    return f"| **Tenants per account-region** ({label}) | | {cells} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--template", type=Path, default=ROOT / "template.yaml")
    parser.add_argument("--quotas", type=Path, default=QUOTAS)
    args = parser.parse_args(argv)
    quotas = json.loads(args.quotas.read_text(encoding="utf-8"))
    print(markdown(translate(args.template), quotas))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

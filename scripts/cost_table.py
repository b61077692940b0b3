"""What one tenant stack costs, per deployment profile, from the template and list prices.

The resources are the SAM-translated template's (``cloud_template.deployed``: conditions decided
for each profile's parameter values), so a resource added to or sized in template.yaml changes
the table. Prices and the per-call usage assumptions live in ``infra/prices.json`` with their
date and source URL; nothing is fetched.

Two figures per profile:

- idle per month: what the stack costs with no traffic (OpenSearch nodes and their storage,
  the VPC's interface endpoints, KMS keys, secrets, alarm metrics, the dashboard, the every-minute outbox drainer and its
  custom metrics and traces);
- per million tool calls: the HTTP API request, the adapter's and the tool's Lambda invocation,
  DynamoDB request units, KMS requests, log ingestion and one trace per call.

Usage: python scripts/cost_table.py [--template T] [--prices P]  (prints a Markdown table)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from scripts.cloud_template import ROOT, deployed, translate

PRICES: Final = ROOT / "infra" / "prices.json"
GIB: Final = 1024**3
# Each profile: its parameter values. "existing" shares a domain another stack pays for.
PROFILES: Final[dict[str, dict[str, str]]] = {
    "dev": {"OpenSearchProfile": "dev"},
    "production": {"OpenSearchProfile": "production"},
    "production + dedicated masters": {
        "OpenSearchProfile": "production",
        "OpenSearchDedicatedMasters": "true",
    },
    "production in a VPC (3 AZs, endpoints)": {
        "OpenSearchProfile": "production",
        "VpcId": "vpc-0123456789abcdef0",
        "VpcSubnetIds": "subnet-0aaa1111,subnet-0bbb2222,subnet-0ccc3333",
        "VpcRouteTableIds": "rtb-0aaa1111",
    },
    "existing (shared domain)": {
        "OpenSearchMode": "existing",
        "ExistingOpenSearchEndpoint": "https://search-shared.example",
        "ExistingOpenSearchDomainName": "shared",
        "ExistingOpenSearchSecurityRoleName": "opensearch-security-manager",
    },
}


@dataclass(frozen=True)
class Cost:
    profile: str
    idle_month: float
    per_million_calls: float
    opensearch_month: float


def _price(prices: dict[str, Any], name: str) -> float:
    return float(prices["prices"][name]["value"])


def _parameter_default(template: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"Ref"}:
        return template["Parameters"][value["Ref"]]["Default"]
    return value


def _of_type(resources: dict[str, dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [body["Properties"] for body in resources.values() if body["Type"] == kind]


def opensearch_month(
    template: dict[str, Any], resources: dict[str, dict[str, Any]], prices: dict[str, Any]
) -> float:
    """Data nodes, dedicated masters and their gp3 storage, for a month."""
    hourly = prices["prices"]["opensearch_instance_hour"]
    hours = prices["usage"]["hours_per_month"]
    total = 0.0
    for domain in _of_type(resources, "AWS::OpenSearchService::Domain"):
        cluster = domain["ClusterConfig"]
        nodes = int(cluster["InstanceCount"])
        total += nodes * hours * hourly[_parameter_default(template, cluster["InstanceType"])]
        if cluster.get("DedicatedMasterEnabled"):
            master = _parameter_default(template, cluster["DedicatedMasterType"])
            total += int(cluster["DedicatedMasterCount"]) * hours * hourly[master]
        storage = nodes * int(_parameter_default(template, domain["EBSOptions"]["VolumeSize"]))
        total += storage * _price(prices, "opensearch_gp3_gb_month")
    return total


def _alarm_metrics(resources: dict[str, dict[str, Any]]) -> int:
    """CloudWatch bills an alarm per metric it reads (a metric-math alarm: each MetricStat)."""
    count = 0
    for alarm in _of_type(resources, "AWS::CloudWatch::Alarm"):
        count += 1 if "MetricName" in alarm else sum("MetricStat" in m for m in alarm["Metrics"])
    return count


def _lambda_gb(resources: dict[str, dict[str, Any]], name: str) -> float:
    memory_mb = int(resources[name]["Properties"].get("MemorySize", 128))
    assert resources[name]["Properties"].get("Architectures") == ["arm64"], name
    return memory_mb / 1024


def endpoints_month(
    resources: dict[str, dict[str, Any]], prices: dict[str, Any], given: dict[str, str]
) -> float:
    """Interface endpoints bill per AZ (one network interface per subnet) and hour; gateway
    endpoints (DynamoDB, S3) are free. Their per-GB processing is left out (small per call)."""
    subnets = len([s for s in given.get("VpcSubnetIds", "").split(",") if s])
    interfaces = [
        p
        for p in _of_type(resources, "AWS::EC2::VPCEndpoint")
        if p["VpcEndpointType"] == "Interface"
    ]
    hours = prices["usage"]["hours_per_month"]
    return float(
        len(interfaces) * subnets * hours * _price(prices, "vpc_interface_endpoint_az_hour")
    )


def idle_month(
    template: dict[str, Any],
    resources: dict[str, dict[str, Any]],
    prices: dict[str, Any],
    given: dict[str, str] | None = None,
) -> float:
    usage = prices["usage"]
    runs = usage["drainer_runs_per_month"]
    drainer_gb_s = runs * usage["drainer_ms_per_run"] / 1000
    drainer_gb_s *= _lambda_gb(resources, "OutboxDrainerFunction")
    fixed = {
        "opensearch": opensearch_month(template, resources, prices),
        "endpoints": endpoints_month(resources, prices, given or {}),
        "kms": len(_of_type(resources, "AWS::KMS::Key")) * _price(prices, "kms_key_month"),
        "secrets": len(_of_type(resources, "AWS::SecretsManager::Secret"))
        * _price(prices, "secret_month"),
        "alarms": _alarm_metrics(resources) * _price(prices, "cloudwatch_alarm_metric_month"),
        "dashboards": len(_of_type(resources, "AWS::CloudWatch::Dashboard"))
        * _price(prices, "cloudwatch_dashboard_month"),
        "metrics": usage["idle_custom_metrics"] * _price(prices, "cloudwatch_custom_metric_month"),
        "drainer": runs * _price(prices, "lambda_request")
        + drainer_gb_s * _price(prices, "lambda_arm64_gb_second")
        + runs * _price(prices, "xray_trace_recorded")
        + runs
        * usage["drainer_log_bytes_per_run"]
        / GIB
        * _price(prices, "cloudwatch_logs_ingested_gb"),
    }
    return float(sum(fixed.values()))


def per_million_calls(resources: dict[str, dict[str, Any]], prices: dict[str, Any]) -> float:
    usage = prices["usage"]
    gb_s = usage["adapter_ms_per_call"] / 1000 * _lambda_gb(resources, "McpAdapterFunction")
    gb_s += usage["tool_ms_per_call"] / 1000 * _lambda_gb(resources, "SearchFunction")
    one_call = (
        _price(prices, "http_api_request")
        + 2 * _price(prices, "lambda_request")
        + gb_s * _price(prices, "lambda_arm64_gb_second")
        + usage["read_units_per_call"] * _price(prices, "dynamodb_read_request_unit")
        + usage["write_units_per_call"] * _price(prices, "dynamodb_write_request_unit")
        + usage["kms_requests_per_call"] * _price(prices, "kms_request")
        + usage["log_bytes_per_call"] / GIB * _price(prices, "cloudwatch_logs_ingested_gb")
        + usage["traces_per_call"] * _price(prices, "xray_trace_recorded")
    )
    return float(one_call * 1_000_000)


def cost_table(template: dict[str, Any], prices: dict[str, Any]) -> list[Cost]:
    rows = []
    for profile, given in PROFILES.items():
        resources = deployed(template, **given)
        rows.append(
            Cost(
                profile,
                idle_month(template, resources, prices, given),
                per_million_calls(resources, prices),
                opensearch_month(template, resources, prices),
            )
        )
    return rows


def markdown(rows: list[Cost], prices: dict[str, Any]) -> str:
    lines = [
        f"| Profile ({prices['region']}, list prices of {prices['as_of']}) "
        "| Idle per month | of which OpenSearch | Per million tool calls |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {r.profile} | ${r.idle_month:,.2f} | ${r.opensearch_month:,.2f} "
        f"| ${r.per_million_calls:,.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--template", type=Path, default=ROOT / "template.yaml")
    parser.add_argument("--prices", type=Path, default=PRICES)
    args = parser.parse_args(argv)
    prices = json.loads(args.prices.read_text(encoding="utf-8"))
    print(markdown(cost_table(translate(args.template), prices), prices))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The cost table (scripts/cost_table.py): from the translated template and dated list prices."""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from typing import Any, Final

import pytest

from scripts.cloud_template import ROOT, deployed, translate
from scripts.cost_table import PRICES, PROFILES, cost_table, markdown, opensearch_month

DOC: Final = ROOT / "docs" / "deploying-aws.md"


@cache
def template() -> dict[str, Any]:
    return translate(ROOT / "template.yaml")


def prices() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(PRICES.read_text(encoding="utf-8"))
    return loaded


def test_every_price_has_its_date_and_public_source() -> None:
    data = prices()
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", data["as_of"]) and data["region"]
    for name, price in data["prices"].items():
        assert price["source"].startswith("https://aws.amazon.com/"), name


def test_the_opensearch_cost_counts_the_profiles_nodes_and_storage() -> None:
    data, hours = prices(), prices()["usage"]["hours_per_month"]
    hourly = data["prices"]["opensearch_instance_hour"]
    storage = 10 * data["prices"]["opensearch_gp3_gb_month"]["value"]
    node = hours * hourly["t3.medium.search"] + storage
    masters = 3 * hours * hourly["m6g.large.search"]
    by_profile = {
        name: opensearch_month(template(), deployed(template(), **given), data)
        for name, given in PROFILES.items()
    }
    assert by_profile == pytest.approx(
        {
            "dev": node,
            "production": 3 * node,
            "production + dedicated masters": 3 * node + masters,
            "production in a VPC (3 AZs, endpoints)": 3 * node,
            "existing (shared domain)": 0.0,
        }
    )


def test_the_table_follows_the_template_not_a_copy_of_it() -> None:
    grown = copy.deepcopy(template())
    grown["Resources"]["OpenSearchDomain"]["Properties"]["EBSOptions"]["VolumeSize"] = 100
    before = {row.profile: row for row in cost_table(template(), prices())}
    after = {row.profile: row for row in cost_table(grown, prices())}
    gp3 = prices()["prices"]["opensearch_gp3_gb_month"]["value"]
    assert after["dev"].idle_month - before["dev"].idle_month == pytest.approx(90 * gp3)
    assert after["existing (shared domain)"] == before["existing (shared domain)"]


def test_a_vpc_adds_its_interface_endpoints_per_az_and_hour() -> None:
    rows = {row.profile: row for row in cost_table(template(), prices())}
    hourly = prices()["prices"]["vpc_interface_endpoint_az_hour"]["value"]
    hours = prices()["usage"]["hours_per_month"]
    added = (
        rows["production in a VPC (3 AZs, endpoints)"].idle_month - rows["production"].idle_month
    )
    # KMS, Secrets Manager and X-Ray, in each of three subnets; gateways are free
    assert added == pytest.approx(3 * 3 * hours * hourly)


def test_the_deployment_guide_shows_the_scripts_table() -> None:
    table = markdown(cost_table(template(), prices()), prices())
    assert table in DOC.read_text(encoding="utf-8")

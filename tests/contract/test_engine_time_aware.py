"""Time-aware search (engine/temporal.py) through the engine, on every adapter set."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engram_memory.engine import lexical

from engram_testing import Harness, embedded_harness

TEXT = "Offsite planning notes: venue, agenda and travel."


def _ms(year: int, month: int, day: int) -> int:
    return int(datetime(year, month, day, 14, tzinfo=UTC).timestamp() * 1000)


def _two_dated_records(h: Harness) -> tuple[str, str]:
    # The same text, so the text channels cannot tell them apart: only valid_time can.
    h.without_quality_gate()
    march = h.remember(TEXT, valid_from=_ms(2026, 3, 10))
    may = h.remember(TEXT, valid_from=_ms(2026, 5, 20))
    return march, may


def _order(value: dict[str, Any]) -> list[str]:
    return [p["record"]["record_id"] for p in value["records"]]


def test_a_date_in_the_query_ranks_the_records_valid_then_first(harness: Harness) -> None:
    march, may = _two_dated_records(harness)
    assert _order(harness.search("offsite planning on 10 March 2026")) == [march, may]
    assert _order(harness.search("offsite planning on 20 May, 2026")) == [may, march]
    assert _order(harness.search("offsite planning in May")) == [may, march]
    # No date: the text ranking alone, ties by record id; a date no record holds changes nothing.
    plain = _order(harness.search("offsite planning"))
    assert plain == sorted([march, may])
    assert _order(harness.search("offsite planning in 2019")) == plain
    receipt = harness.search("offsite planning in May")["rank_receipt"]
    assert (receipt["profile_version"], receipt["profile_config_digest"]) == (
        lexical.receipt_profile(True)
    )
    assert receipt["profile_config_digest"] != lexical.PROFILE_CONFIG_DIGEST


def test_a_host_without_time_aware_ranking_ranks_and_receipts_as_before(tmp_path: Path) -> None:
    h = embedded_harness(tmp_path, time_aware=False)
    try:
        march, may = _two_dated_records(h)
        for query in ("offsite planning on 20 May, 2026", "offsite planning on 10 March 2026"):
            value = h.search(query)
            assert _order(value) == sorted([march, may])
            receipt = value["rank_receipt"]
            assert receipt["profile_version"] == lexical.PROFILE_VERSION == "2.0.0"
            assert receipt["profile_config_digest"] == lexical.PROFILE_CONFIG_DIGEST
    finally:
        h.close()

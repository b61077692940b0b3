"""bench.wire: the official client's validation of real results, and where a response's bytes go."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from test_hotpath_bench import conversation

from bench import wire
from bench.hotpath.corpus import Corpus


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("locomo")
    (folder / "conv-1.json").write_text(json.dumps(conversation(14)))
    return wire.run(Corpus.load(folder), records=14, searches=2, repeat=2)


def test_the_client_validation_of_real_results_is_timed_in_cpu(report: dict[str, Any]) -> None:
    cpu = report["client_validation_cpu"]
    assert cpu["search_10_records"]["validations"] == report["search_pages_of_10"] * 2
    assert cpu["get"]["validations"] == 2 * 2
    for figure in cpu.values():
        assert 0 <= figure["median_ms"] <= figure["p90_ms"]
    assert set(report["output_schema_bytes"]) == {
        "search",
        "get",
        "capture",
        "request_admission",
        "withdraw",
        "forget",
    }


def test_the_bytes_of_a_ten_record_response_are_accounted_for(report: dict[str, Any]) -> None:
    page = report["median_page"]
    assert page["records"] == 10
    # The response is the structured envelope, its text copy (§2) and the JSON-RPC frame ...
    assert (
        page["structured_content_bytes"] + page["text_copy_bytes"] + page["jsonrpc_frame_bytes"]
        == page["response_bytes"]
    )
    assert page["text_copy_bytes"] > page["structured_content_bytes"]  # the same JSON, escaped
    # ... and every byte of the envelope is in one of its parts, the memory text among them.
    parts = page["envelope_parts"]
    assert sum(parts.values()) == page["structured_content_bytes"]
    assert parts["record.components (memory text)"] == page["text_bytes"]
    assert page["times_text"] == round(page["response_bytes"] / page["text_bytes"], 1)


def test_the_checker_is_the_clients_own_and_refuses_a_result_off_its_schema() -> None:
    """What is timed is real validation: a result the schema refuses raises in the SDK's check."""
    from engram_memory.contract.envelope import success
    from engram_memory.mcp_surface.catalog import TOOL_NAMES

    schemas = wire.published_output_schemas()
    check = wire.client_validator(TOOL_NAMES["capture"], schemas["capture"])
    value = {
        "status": "committed_pending",
        "candidate_id": "candidate_" + "0" * 64,
        "record_digest": "sha256:" + "a" * 64,
        "cursor": "1",
        "transaction_receipt_digest": "sha256:" + "b" * 64,
    }
    good, _ = wire.on_the_wire(success(value, "aud_1"))
    anyio.run(check, good)
    bad, _ = wire.on_the_wire(success({**value, "record_digest": "sha256:AA"}, "aud_1"))
    with pytest.raises(RuntimeError, match="Invalid structured content"):
        anyio.run(check, bad)


def test_fewer_than_one_record_search_or_repeat_is_refused() -> None:
    with pytest.raises(SystemExit) as refused:
        wire.main(["--repeat", "0"])
    assert refused.value.code == 2

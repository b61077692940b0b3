"""The cold-import benchmark: it parses ``-X importtime`` right, and the handlers stay light.

The timing figures are reported by ``python -m bench.cold_imports``, never asserted (shared,
noisy machines). What is asserted is structural: which heavy packages a handler module loads
when Lambda imports it.
"""

from __future__ import annotations

import pytest

from bench.cold_imports import functions, measure, parse_importtime, top_level

SAMPLE = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:       300 |        420 | encodings
import time:        50 |         50 |     pydantic.version
import time:       900 |        950 |   pydantic
import time:      1000 |       1950 | engram_memory
this line is not an import line
"""

TOOL_FUNCTIONS = ["capture", "forget", "get", "request_admission", "search", "withdraw"]
# Their modules import the engine, pydantic or AWS clients: app.py is a ``deferred_handler``.
DEFERRED_FUNCTIONS = ["approval", "cognito_claims", "outbox_drainer", "workflow"]


def test_importtime_lines_are_parsed_with_their_depth() -> None:
    lines = parse_importtime(SAMPLE)
    assert [(line.module, line.depth) for line in lines] == [
        ("_io", 1),
        ("encodings", 0),
        ("pydantic.version", 2),
        ("pydantic", 1),
        ("engram_memory", 0),
    ]
    assert [line.module for line in top_level(lines)] == ["encodings", "engram_memory"]
    assert sum(line.cumulative_us for line in top_level(lines)) == 2370


def test_every_function_folder_is_benchmarked() -> None:
    assert functions() == sorted(
        [
            *TOOL_FUNCTIONS,
            "approval",
            "cognito_claims",
            "mcp_adapter",
            "opensearch_security",
            "outbox_drainer",
            "secret_rotation",
            "workflow",
        ]
    )


@pytest.mark.parametrize("function", TOOL_FUNCTIONS + DEFERRED_FUNCTIONS)
def test_a_function_imports_no_client_library_before_its_first_call(function: str) -> None:
    report = measure(function, runs=1)
    # boto3, the encryption SDK and opensearch-py load in build_engine, on the first invocation;
    # the engine and the contract's pydantic models too (cloud/tool_handler.py): Lambda's init
    # is Powertools and the handler object (bench.cold_imports --built: init x the anchor)
    # (the others: their whole module, cloud/tool_handler.py's DeferredHandler)
    deferred = {
        *("boto3", "aws-encryption-sdk", "opensearch-py", "mcp"),
        *("cryptography", "pydantic", "the engine"),
    }
    assert not deferred & set(report.heavy_at_init)
    assert report.wall_ms > 0 and report.importtime_ms > 0
    assert report.heaviest and all(ms >= 0 for _, ms in report.heaviest)


def test_the_adapter_does_not_load_the_encryption_sdk_at_init() -> None:
    report = measure("mcp_adapter", runs=1)
    assert "mcp" in report.heavy_at_init  # it serves MCP: the SDK is the point
    assert "aws-encryption-sdk" not in report.heavy_at_init
    assert "opensearch-py" not in report.heavy_at_init

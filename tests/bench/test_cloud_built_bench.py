"""The cloud benchmarks on the built artifacts: Lambda init beside the anchor, warm calls with the
stand-in cloud's time taken out (``--built``).

They run on a ``sam build`` folder in ``.aws-sam/build`` (``scripts/sam_check.sh`` with
``SAM_BUILD_DIR``); without one they are skipped: the build takes minutes and ``make cloud-check``
runs the built functions anyway. With a build but no python3.12 to run it on, they are a missing
tool (a skip here, a failure in CI). Figures are reported, never asserted; what is asserted is the
shape: every function and tool measured, moto's requests counted and timed, the calibration made.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import cold_imports, lambda_warm
from scripts.cloud_run.harness import python312

from engram_testing import tool_missing

# The cloud gate (scripts/cloud_check.sh, step 4) points these at its own build and runtime.
BUILD = Path(
    os.environ.get("ENGRAM_SAM_BUILD") or Path(__file__).resolve().parents[2] / ".aws-sam" / "build"
)
RUNTIME = os.environ.get("ENGRAM_LAMBDA_RUNTIME")
RUNTIME_ARGUMENTS = ["--runtime-dir", RUNTIME] if RUNTIME else []


@pytest.fixture(scope="module")
def built() -> tuple[Path, str]:
    if not (BUILD / "CoreLayer" / "python" / "engram_memory").is_dir():
        if os.environ.get("ENGRAM_SAM_BUILD"):  # named by the cloud gate: it must be there
            pytest.fail(f"ENGRAM_SAM_BUILD={BUILD} holds no sam build (no CoreLayer/python)")
        pytest.skip(
            f"no sam build in {BUILD}: SAM_BUILD_DIR=$PWD/.aws-sam/build bash scripts/sam_check.sh"
        )
    python = python312()
    if python is None:
        tool_missing("python3.12 (the functions' runtime) runs the built functions: install it")
    return BUILD, python


def test_lambda_init_on_the_build_is_measured_beside_the_anchor(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    build, python = built
    path = tmp_path / "init.json"
    argv = ["--built", str(build), "--python312", python, "--runs", "1", "--json", str(path)]
    argv += RUNTIME_ARGUMENTS
    functions = ["SearchFunction", "WorkflowStepFunction", "McpAdapterFunction"]
    assert cold_imports.main([*argv, *functions]) == 0

    rows = {row["function"]: row for row in json.loads(path.read_text("utf-8"))["init"]}
    assert set(rows) == {"anchor", cold_imports.SDK_ANCHOR, *functions}
    assert rows["anchor"]["cpu_x_anchor"] == 1.0
    for row in rows.values():
        assert row["cpu_ms"] > 0 and row["wall_ms"] > 0
    # the first invocation answered its sample (what init defers is paid there), for a tool
    # function, a deferred one and the adapter alike
    for function in functions:
        assert rows[function]["first_call_cpu_ms"] > 0


def test_warm_tools_on_the_build_have_moto_counted_and_taken_out(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    build, python = built
    path = tmp_path / "warm.json"
    argv = ["--built", str(build), "--python312", python, "--json", str(path), *RUNTIME_ARGUMENTS]
    assert lambda_warm.main([*argv, "--records", "4", "--calls", "1"]) == 0

    figures = json.loads(path.read_text("utf-8"))
    bare = figures["bare_round_trip"]
    assert bare["cpu_ms"] > 0 and bare["moto_ms"] > 0
    rows = {row["tool"]: row for row in figures["tools"]}
    assert tuple(rows) == lambda_warm.BUILT_TOOLS
    for row in rows.values():
        assert row["calls"] == 1 and row["cpu_ms"] > 0
        assert row["round_trips"] == pytest.approx(sum(row["requests"].values()), abs=0.05)
        assert row["wall_minus_moto_ms"] == pytest.approx(row["wall_ms"] - row["moto_ms"], abs=0.05)
    # the requests are the functions' own, counted where moto and the fake OpenSearch answer
    assert rows["search"]["requests"]["opensearch._search"] == 1
    assert rows["search"]["requests"]["dynamodb.BatchGetItem"] >= 1
    assert rows["get"]["requests"]["dynamodb.GetItem"] == 2
    assert rows["withdraw"]["requests"]["states.StartExecution"] == 1

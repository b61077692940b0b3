"""No function longer than 60 lines (issue 23): from its ``def`` line to its last line,
decorators excluded, in the package, the scripts and the benchmarks.

``STILL_LONG`` lists the functions over the limit when this test was written that other work
is still shrinking (each with its length then). It only shrinks: an entry must go once its
function is within the limit or gone, and a function not listed may never pass the limit.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("layers/core/engram_memory", "scripts", "bench")
MAX_LINES = 60

STILL_LONG: dict[str, int] = {
    "layers/core/engram_memory/embedded/cli.py::build_parser": 214,
    "scripts/cloud_run.py::Harness.flow": 186,
    "bench/locomo/experiments/late_interaction.py::main": 180,
    "bench/lambda_warm.py::profile": 105,
    "layers/core/engram_memory/cloud/stack_backup.py::backup_stack": 96,
    "bench/hotpath/__main__.py::main": 89,
    "layers/core/engram_memory/embedded/cli.py::cmd_tour": 85,
    "bench/cloud_contention.py::run_writers": 82,
    "layers/core/engram_memory/embedded/composition.py::open_embedded": 80,
    "bench/soak/__main__.py::main": 79,
    "layers/core/engram_memory/cloud/stack_backup.py::restore_stack": 78,
    "layers/core/engram_memory/cloud/stack_backup.py::backup_stack.<locals>.run": 77,
    "bench/hotpath/writes.py::main": 75,
    "scripts/cloud_run.py::Harness.start": 74,
    "layers/core/engram_memory/cloud/mcp_adapter.py::build_adapter": 74,
    "layers/core/engram_memory/operator_plane/usecases.py::_commit_transition": 73,
    "layers/core/engram_memory/cloud/approvals.py::ApprovalStore.park": 72,
    "bench/hotpath/report.py::table": 71,
    "layers/core/engram_memory/mcp_surface/server.py::EngramMcp._confirm_embedded": 70,
    "layers/core/engram_memory/cloud/stack_backup.py::restore_stack.<locals>.run": 70,
    "scripts/cloud_run.py::Harness.start_workers": 68,
    "layers/core/engram_memory/embedded/serve.py::open_server": 67,
    "layers/core/engram_memory/operator_plane/usecases.py::adjudicate": 66,
    "layers/core/engram_memory/embedded/backup.py::restore": 62,
    "bench/hotpath/runner.py::run": 61,
}


def _functions(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    """Each function under ``node`` as (qualified name, lines), nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + child.name
            yield name, (child.end_lineno or child.lineno) - child.lineno + 1
            yield from _functions(child, name + ".<locals>.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, prefix + child.name + ".")
        else:
            yield from _functions(child, prefix)


def _lengths() -> dict[str, int]:
    lengths: dict[str, int] = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            where = path.relative_to(ROOT).as_posix()
            for name, lines in _functions(module, ""):
                lengths[f"{where}::{name}"] = max(lines, lengths.get(f"{where}::{name}", 0))
    return lengths


def test_no_function_is_longer_than_the_limit() -> None:
    long = {
        name: lines
        for name, lines in _lengths().items()
        if lines > MAX_LINES and name not in STILL_LONG
    }
    assert not long, f"functions over {MAX_LINES} lines (split them): " + ", ".join(
        f"{name}:{lines}" for name, lines in sorted(long.items())
    )


def test_the_allow_list_only_holds_functions_still_too_long() -> None:
    lengths = _lengths()
    done = sorted(name for name in STILL_LONG if lengths.get(name, 0) <= MAX_LINES)
    assert not done, "within the limit or gone now, drop from STILL_LONG: " + ", ".join(
        f"{name}:{lengths.get(name, 'gone')}" for name in done
    )

"""No function longer than 60 lines (issue 23): from its ``def`` line to its last line,
decorators excluded, in the package, the scripts and the benchmarks.

A long function is split into named steps; ruff's PLR0915 (at most 50 statements) says the same
in statements while one edits.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREES = ("layers/core/engram_memory", "scripts", "bench")
MAX_LINES = 60


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
    long = {name: lines for name, lines in _lengths().items() if lines > MAX_LINES}
    assert not long, f"functions over {MAX_LINES} lines (split them): " + ", ".join(
        f"{name}:{lines}" for name, lines in sorted(long.items())
    )

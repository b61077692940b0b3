"""The dependency rules the layout stands on, checked against the code.

The package's own rules (the core never imports a host; the hosts never import each other;
adapters never import a composition; the engine imports no adapter or I/O library) are
import-linter contracts in pyproject.toml, which ./test runs (`lint-imports`). What
import-linter cannot see is checked here: the Lambda handlers in functions/, outside the
package, what the embedded command line loads when it runs, and that no two modules share a
file name (one concept, one module, one name; docs/architecture.md, "Glossary of human approval").
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = sorted((ROOT / "functions").glob("*/app.py"))


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_lambda_function_has_a_handler() -> None:
    assert len(FUNCTIONS) >= 11, FUNCTIONS


@pytest.mark.parametrize("app", FUNCTIONS, ids=lambda path: path.parent.name)
def test_a_lambda_handler_imports_only_the_cloud_host(app: Path) -> None:
    package_imports = {name for name in _imported_modules(app) if name.startswith("engram_memory")}
    assert package_imports, f"{app} imports nothing from the package"
    outside = {name for name in package_imports if not name.startswith("engram_memory.cloud")}
    assert not outside, f"{app.relative_to(ROOT)} imports {sorted(outside)}: handlers import cloud"


def test_the_embedded_command_line_imports_no_cloud_module() -> None:
    """Running the embedded CLI (even `admin --help`) loads nothing of the cloud host."""
    probe = (
        "import sys; from engram_memory.embedded import cli;"
        " cli.build_parser(lambda args: None).parse_args(['admin', 'status']);"
        " print(sorted(m for m in sys.modules if m.startswith('engram_memory.cloud')))"
    )
    done = subprocess.run(  # noqa: S603 (our own interpreter, a fixed probe)
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"


def _store_reaches(path: Path) -> list[str]:
    """Where ``path`` touches a ``.store`` attribute or calls a ``.commit(...)``, as
    ``line: source``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    reaches = [
        node
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr == "store")
        or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "commit"
        )
    ]
    return [f"{node.lineno}: {ast.unparse(node)}" for node in reaches]


def test_the_operator_plane_never_reaches_into_the_store() -> None:
    """The operator plane runs on the engine's use cases and reads (issue 37): the store and
    the commit are the engine's, so a record's lifecycle has one owner whoever moves it."""
    plane = ROOT / "layers/core/engram_memory/operator_plane"
    reaches = {
        path.name: found for path in sorted(plane.glob("*.py")) if (found := _store_reaches(path))
    }
    assert not reaches, f"operator_plane reaches past the engine: {reaches}"


PACKAGE = ROOT / "layers" / "core" / "engram_memory"
# The file names more than one module of the package may share, each with the exact modules that
# share it, so a third one is caught too. Anything else shared is one name for two concepts (say
# which one) or one concept in two places (merge them).
SHARED_FILE_NAMES: dict[str, set[str]] = {
    # composition.py: each host has one composition root, by design
    "composition.py": {"cloud/composition.py", "embedded/composition.py"},
    # backup.py: the SQLite copy without projections and the embedded host's backup command,
    # which uses it; the same word seen from the store and from the operator
    "backup.py": {"adapters/local/sqlite/backup.py", "embedded/backup.py"},
    # errors.py: the contract's error codes and the embedded host's own start-up errors
    "errors.py": {"contract/errors.py", "embedded/errors.py"},
    # inspection.py: the engine's read-only use cases and the operator plane's commands over them
    "inspection.py": {"engine/usecases/inspection.py", "operator_plane/inspection.py"},
}


def test_no_two_modules_of_the_package_share_a_file_name() -> None:
    by_name: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":  # a package's own module: every package has one
            by_name.setdefault(path.name, set()).add(path.relative_to(PACKAGE).as_posix())
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == SHARED_FILE_NAMES


def test_a_trusted_context_is_made_only_by_its_own_constructors() -> None:
    """``TrustedContext`` is made in ``engine/context.py`` (``bound``, ``for_operator``,
    ``unbound``) and nowhere else in the package: a new field then touches its class, the
    token's claims and the cloud's invocation, not every place a call is bound. (The bench
    builds its own, since it also runs against older trees.)"""
    made_by_hand = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "engine" / "context.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        made_by_hand += [
            f"{path.relative_to(PACKAGE)}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "TrustedContext"
        ]
    assert made_by_hand == []


def test_the_package_docstring_names_every_subpackage_and_nothing_gone() -> None:
    """The package's docstring is its table of contents: every subpackage and top-level
    module, and no name that is gone."""
    import engram_memory

    named = set(re.findall(r"^- ``(\w+)``", engram_memory.__doc__ or "", re.M))
    present = {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if (path.is_dir() and (path / "__init__.py").exists())
        or (path.suffix == ".py" and path.name != "__init__.py")
    }
    assert named == present

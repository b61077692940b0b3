"""Dependencies point inward: the contract and the engine know nothing of AWS, SQLite or MCP."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "layers" / "core" / "engram_memory"
FORBIDDEN = (
    "sqlite3",
    "boto3",
    "botocore",
    "aws_encryption_sdk",
    "aws_cryptographic_material_providers",
    "detect_secrets",
    "mcp",
    "starlette",
    "uvicorn",
    "jwt",
    "engram_memory.adapters",
    "engram_memory.mcp_surface",
    "engram_memory.host",
    "engram_memory.policy",
    "engram_memory.embedded.composition",
)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # resolve a relative import against the module's package
                parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[: -node.level]
                names.add(".".join([*parts, node.module or ""]).rstrip("."))
            elif node.module:
                names.add(node.module)
    return names


@pytest.mark.parametrize(
    "module",
    sorted(
        str(p.relative_to(PACKAGE))
        for layer in ("contract", "engine", "approval_page")
        for p in (PACKAGE / layer).rglob("*.py")
    ),
)
def test_the_inner_layers_import_no_adapter_or_vendor_module(module: str) -> None:
    imported = _imports(PACKAGE / module)
    offending = sorted(
        name
        for name in imported
        for banned in FORBIDDEN
        if name == banned or name.startswith(banned + ".")
    )
    assert offending == []


# An adapter implements a port and nothing more: it never reaches back into a composition (the
# embedded root, the cloud package) or the MCP surface that sits on top of the engine.
ADAPTER_FORBIDDEN = (
    "engram_memory.cloud",
    "engram_memory.embedded.composition",
    "engram_memory.embedded.cli",
    "engram_memory.embedded.in_process",
    "engram_memory.mcp_surface",
)
FUNCTIONS = PACKAGE.parents[2] / "functions"


@pytest.mark.parametrize(
    "module", sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "adapters").rglob("*.py"))
)
def test_an_adapter_imports_no_composition_root_mcp_surface_or_cloud_package(module: str) -> None:
    imported = _imports(PACKAGE / module)
    offending = sorted(
        name
        for name in imported
        for banned in ADAPTER_FORBIDDEN
        if name == banned or name.startswith(banned + ".")
    )
    assert offending == []


@pytest.mark.parametrize("app", sorted(p.parent.name for p in FUNCTIONS.glob("*/app.py")))
def test_every_function_handler_is_a_few_lines_over_the_package(app: str) -> None:
    path = FUNCTIONS / app / "app.py"
    code = [
        line
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith(("#", '"""'))
    ]
    assert len(code) <= 3, code
    imported = _imports(path)
    # the tool, adapter, workflow, approval and drainer handlers over engram_memory.cloud; the
    # OpenSearch custom resource over its own module
    assert imported and all(name.startswith("engram_memory.") for name in imported)

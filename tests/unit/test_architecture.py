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
    "engram_memory.bootstrap",
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

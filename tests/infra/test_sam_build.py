"""What `sam build` needs from the repository, checked offline in milliseconds.

Every ``CodeUri`` (functions) and ``ContentUri`` (layers) of ``template.yaml`` is a folder that
exists; each function folder has the module and the callable its ``Handler`` names (``app.handler``
from Globals unless the function says otherwise) and a ``requirements.txt`` (the python3.12 build
method wants a manifest); the CoreLayer folder holds the ``engram_memory`` package. The real
``sam build`` runs in ``scripts/sam_check.sh`` (``make sam-check``).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import Any, Final

import pytest
from cfnlint.decode.cfn_yaml import load as load_cfn_yaml

ROOT: Final = Path(__file__).resolve().parents[2]
TEMPLATE_PATH: Final = ROOT / "template.yaml"


@cache
def template() -> dict[str, Any]:
    """template.yaml with its short-form tags decoded (cfn-lint's loader, as test_template.py)."""
    loaded: dict[str, Any] = load_cfn_yaml(str(TEMPLATE_PATH))
    return loaded


def resources(kind: str) -> dict[str, dict[str, Any]]:
    return {
        name: resource
        for name, resource in template()["Resources"].items()
        if resource.get("Type") == kind
    }


FUNCTIONS: Final = sorted(resources("AWS::Serverless::Function"))
LAYERS: Final = sorted(resources("AWS::Serverless::LayerVersion"))


def local_folder(uri: object, resource: str, key: str) -> Path:
    assert isinstance(uri, str), f"{resource}.{key} must be a local path, got {uri!r}"
    assert not uri.startswith("s3://"), f"{resource}.{key} must be a local folder, got {uri}"
    folder = (ROOT / uri).resolve()
    assert folder.is_relative_to(ROOT), f"{resource}.{key} leaves the repository: {uri}"
    assert folder.is_dir(), f"{resource}.{key} is not a folder: {uri}"
    return folder


def handler_of(name: str) -> str:
    properties = resources("AWS::Serverless::Function")[name]["Properties"]
    handler = properties.get("Handler", template()["Globals"]["Function"].get("Handler"))
    assert isinstance(handler, str), f"{name} has no Handler (neither its own nor from Globals)"
    return handler


def module_names(source: str) -> set[str]:
    """Names a module binds at its top level (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def test_the_template_has_functions_and_a_layer() -> None:
    assert FUNCTIONS, "no AWS::Serverless::Function in template.yaml"
    assert LAYERS, "no AWS::Serverless::LayerVersion in template.yaml"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_code_uri_has_the_handler(name: str) -> None:
    properties = resources("AWS::Serverless::Function")[name]["Properties"]
    folder = local_folder(properties.get("CodeUri"), name, "CodeUri")
    module, _, attribute = handler_of(name).rpartition(".")
    assert module, f"{name}: Handler must be <module>.<callable>, got {handler_of(name)!r}"
    source = folder / f"{module.replace('.', '/')}.py"
    assert source.is_file(), f"{name}: {source.relative_to(ROOT)} is missing"
    assert attribute in module_names(source.read_text(encoding="utf-8")), (
        f"{name}: {source.relative_to(ROOT)} does not define {attribute}"
    )


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_code_uri_has_requirements(name: str) -> None:
    properties = resources("AWS::Serverless::Function")[name]["Properties"]
    folder = local_folder(properties.get("CodeUri"), name, "CodeUri")
    assert (folder / "requirements.txt").is_file(), (
        f"{name}: {folder.relative_to(ROOT)}/requirements.txt is missing"
    )


@pytest.mark.parametrize("name", LAYERS)
def test_layer_content_uri_is_a_folder(name: str) -> None:
    resource = resources("AWS::Serverless::LayerVersion")[name]
    folder = local_folder(resource["Properties"].get("ContentUri"), name, "ContentUri")
    if resource.get("Metadata", {}).get("BuildMethod", "").startswith("python"):
        assert (folder / "requirements.txt").is_file(), (
            f"{name}: a python build method needs {folder.relative_to(ROOT)}/requirements.txt"
        )


def test_core_layer_holds_the_domain_package() -> None:
    properties = resources("AWS::Serverless::LayerVersion")["CoreLayer"]["Properties"]
    folder = local_folder(properties.get("ContentUri"), "CoreLayer", "ContentUri")
    assert (folder / "engram_memory" / "__init__.py").is_file()

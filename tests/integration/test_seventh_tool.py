"""A seventh tool touches the files CONTRIBUTING.md lists, and nothing else needs it (issue 37).

The test copies the repository's files, adds a scratch read-only ``ping`` tool in exactly the
files CONTRIBUTING's "Add a seventh tool" names (the template aside: ``tests/infra`` holds every
registry tool's function to the template's rules), regenerates the published registry, and runs
the layout checks in the copy: the snapshot is current, the architecture holds, the engine answers
the tool, ``tools/list`` shows it, and the cloud gate's tool list, sample invocation and scanner
acceptances include it without an edit of their own.
"""

# ruff: noqa: S603 - the subprocesses are git and this environment's python on the copy
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engram_testing import tool_missing

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "layers/core/engram_memory"

INPUT_MODEL = '''
class PingInput(ToolInput):
    """Answer that the memory is reachable (a scratch tool)."""

    tool: ClassVar[ToolCard] = ToolCard(
        title="Ping the memory", effect="read", description="Answers pong." + TOOL_ERRORS
    )

    purpose_ref: Ref = Field(description="The purpose your host bound; must match it exactly.")


'''
OUTPUT_MODEL = """
class PingOutput(OutputModel):
    pong: bool = Field(description="Always true: the memory answered.")


"""
USE_CASE = '''"""The scratch ``ping`` tool."""

from typing import Any

from engram_memory.contract.models import PingInput
from engram_memory.engine.kernel import Call, Kernel


def ping(k: Kernel, call: Call, args: PingInput) -> dict[str, Any]:
    k.check_purpose(call, args.purpose_ref)
    return {"pong": True}
'''
DISPATCH = """        if isinstance(model, PingInput):
            return ping(self, call, model)
"""
CHECK_IN_THE_COPY = """
import json, sys
sys.path.insert(0, ".")
from engram_memory.contract.models import INPUT_MODELS
from engram_memory.engine.context import TOOLS, Scope, TrustedContext
from engram_memory.embedded.composition import open_embedded
from engram_memory.mcp_surface.catalog import load_tools
from scripts.cloud_template import accepted_findings, tools
from scripts.cloud_run.settings import TOOLS as GATE_TOOLS
from scripts.cloud_run.smoke import samples_of

host = open_embedded(__import__("pathlib").Path(sys.argv[1]))
ctx = TrustedContext.bound(Scope("local", "default"), "agent", "purpose:general")
answer = host.engine.handle("ping", {"purpose_ref": "purpose:general"}, ctx)
print(json.dumps({
    "grants": list(TOOLS),
    "answer": answer,
    "listed": sorted(load_tools()),
    "gate_tools": sorted(GATE_TOOLS),
    "registry": sorted(tools()),
    "samples": [label for label, _ in samples_of("functions/ping/")],
    "accepted": sorted(r for (check, r) in accepted_findings() if check == "CKV_AWS_116"),
}))
"""


def contributing_files() -> tuple[int, list[str]]:
    """The count and the files CONTRIBUTING's "Add a seventh tool" names, for the tool ``ping``."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    entry = re.search(r"1\. \*\*Add a seventh tool\*\* \((\d+)\):(.*?)Then regenerate", text, re.S)
    assert entry, "CONTRIBUTING.md has no 'Add a seventh tool' entry ending 'Then regenerate'"
    named = re.findall(r"`((?:contract|engine|functions)/[^`]+\.py|template\.yaml)`", entry[2])
    files = [name.replace("<tool>", "ping") for name in dict.fromkeys(named)]
    return int(entry[1]), [
        name if name.startswith(("functions/", "template")) else f"{PACKAGE}/{name}"
        for name in files
    ]


def copy_repository(into: Path) -> None:
    """The repository's files as they are in the working tree (tracked ones only)."""
    git = shutil.which("git")
    if git is None:
        tool_missing("no git on PATH: the copy is of the files `git ls-files` names")
    listed = subprocess.run(
        [git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def insert(path: Path, before: str, text: str) -> None:
    source = path.read_text(encoding="utf-8")
    assert source.count(before) == 1, f"{path.name}: the anchor {before!r} moved"
    path.write_text(source.replace(before, text + before), encoding="utf-8")


def add_ping(copy: Path) -> None:
    """The scratch tool, as CONTRIBUTING tells a contributor to add it (the template aside)."""
    core = copy / PACKAGE
    insert(core / "contract/models.py", "INPUT_MODELS: dict[", INPUT_MODEL)
    models = core / "contract/models.py"
    models.write_text(
        models.read_text().replace(
            '    "forget": ForgetInput,\n', '    "forget": ForgetInput,\n    "ping": PingInput,\n'
        )
    )
    insert(core / "contract/outputs.py", "OUTPUT_MODELS: dict[", OUTPUT_MODEL)
    outputs = core / "contract/outputs.py"
    outputs.write_text(
        outputs.read_text().replace(
            '    "forget": ForgetOutput,\n',
            '    "forget": ForgetOutput,\n    "ping": PingOutput,\n',
        )
    )
    (core / "engine/usecases/ping.py").write_text(USE_CASE, encoding="utf-8")
    service = core / "engine/service.py"
    insert(service, '        raise AssertionError("unreachable: every tool has a model")', DISPATCH)
    insert(
        service,
        "from engram_memory.engine.usecases.reads import get, search\n",
        "from engram_memory.contract.models import PingInput\n"
        "from engram_memory.engine.usecases.ping import ping\n",
    )
    (copy / "functions/ping").mkdir()
    app = (copy / "functions/get/app.py").read_text().replace('"get"', '"ping"')
    (copy / "functions/ping/app.py").write_text(app.replace("`get`", "`ping`"), encoding="utf-8")


def changed_files(copy: Path) -> set[str]:
    changed = set()
    for path in copy.rglob("*"):
        name = path.relative_to(copy).as_posix()
        if path.is_file() and "__pycache__" not in name and ".pytest_cache" not in name:
            original = ROOT / name
            if not original.is_file() or original.read_bytes() != path.read_bytes():
                changed.add(name)
    return changed


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("seventh-tool")
    copy_repository(copy)
    add_ping(copy)
    env = {**os.environ, "PYTHONPATH": str(copy / "layers/core")}
    subprocess.run(
        [sys.executable, "-m", "engram_memory.mcp_surface.catalog"], cwd=copy, env=env, check=True
    )
    return copy


def run_in(copy: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{copy / 'layers/core'}{os.pathsep}{copy}"}
    return subprocess.run(args, cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def test_the_tool_touches_the_files_contributing_counts(copy: Path) -> None:
    count, named = contributing_files()

    touched = changed_files(copy)

    assert len(named) == count, f"CONTRIBUTING says {count} files and names {named}"
    assert touched == (set(named) - {"template.yaml"}) | {f"{PACKAGE}/mcp_surface/tools.json"}


def test_the_layout_checks_pass_with_the_seventh_tool(copy: Path, tmp_path: Path) -> None:
    checks = run_in(
        copy,
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "tests/unit/test_mcp_surface_parts.py",
        "tests/unit/test_architecture.py",
    )
    assert checks.returncode == 0, checks.stdout[-3000:] + checks.stderr[-2000:]

    answered = run_in(copy, sys.executable, "-c", CHECK_IN_THE_COPY, str(tmp_path / "data"))
    assert answered.returncode == 0, answered.stderr[-3000:]
    seen = json.loads(answered.stdout.strip().splitlines()[-1])
    assert "ping" in seen["grants"]
    assert seen["answer"]["ok"] is True and seen["answer"]["output"]["value"]["pong"] is True
    assert "ping" in seen["listed"] and "ping" in seen["gate_tools"] and "ping" in seen["registry"]
    assert seen["samples"] == ["the registry's ping invocation"]
    assert "PingFunction" in seen["accepted"]

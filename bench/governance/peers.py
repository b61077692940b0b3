"""The forgetting run's canaries in two peers, each deleting them with its own MCP tools.

- ``server-memory`` (``@modelcontextprotocol/server-memory``, pinned in ``bench/hotpath``'s
  lock file, installed there with ``npm ci``): one entity per canary (named by the canary's key,
  so its words are only in the observation), ``create_entities``; then half removed with
  ``delete_entities`` and half with ``delete_observations``. Its store is one JSONL file
  (``MEMORY_FILE_PATH``); its search (``search_nodes``) scans that file.
- ``basic-memory`` (PyPI, pinned ``BASIC_MEMORY``; Python >= 3.12, installed into a cache venv
  under ``~/.cache/engram-bench``): one note per canary, ``write_note``; then ``delete_note``
  for each. Its store is a Markdown folder plus a SQLite database (``memory.db``: entities,
  observations, an FTS5 search index; its semantic index needs a SQLite build with extension
  loading, which this Python lacks, so it runs keyword-only and says so in its log).

Before the delete a copy of each peer's whole folder is taken (what a backup of it holds).
After the delete: how many canaries its search tool still finds (each word searched alone),
its open/read tool still opens, and the raw bytes of its files hold (while the server runs,
and after it stopped), and what the copy taken before holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from bench.governance.canaries import Canary, found_in_text, keys_in, scan
from bench.harness import stdio_session

BASIC_MEMORY = "basic-memory==0.24.1"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "engram-bench"


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (no node/npm, no Python >= 3.12, or its install failed)."""


def _text(result: Any) -> str:
    return " ".join(getattr(part, "text", "") for part in result.content) + str(
        result.structured_content or ""
    )


async def _searched(client: Client, tool: str, among: Sequence[Canary]) -> set[str]:
    """The canaries a search for one of their words answers: by the canary's name (an entity's,
    a note's title) or its other words; the queried word is taken out first (a peer's "no
    results for '<word>'" echoes it)."""
    found: set[str] = set()
    for canary in among:
        for word in canary.words:
            answer = _text(await client.call_tool(tool, {"query": word})).replace(word, "")
            if canary.key in answer or found_in_text(answer, [canary]):
                found.add(canary.key)
    return found


# -- server-memory ------------------------------------------------------------------------------


def _server_memory_params(folder: Path) -> StdioServerParameters:
    from bench.hotpath.runner import PeerUnavailable as NoNode
    from bench.hotpath.runner import ensure_peer

    try:
        entry = ensure_peer()
    except NoNode as error:
        raise PeerUnavailable(str(error)) from error
    return StdioServerParameters(
        command=shutil.which("node") or "node",
        args=[str(entry)],
        env={"MEMORY_FILE_PATH": str(folder / "memory.jsonl"), "PATH": os.environ["PATH"]},
    )


async def _server_memory(folder: Path, among: Sequence[Canary]) -> dict[str, set[str]]:
    params = _server_memory_params(folder)
    found: dict[str, set[str]] = {}
    half = len(among) // 2
    async with stdio_session(params, folder / "stderr.log") as client:
        entities = [
            {"name": c.key, "entityType": "canary", "observations": [c.text]} for c in among
        ]
        await client.call_tool("create_entities", {"entities": entities})
        found["control_search"] = await _searched(client, "search_nodes", among)
        shutil.copytree(folder, folder.parent / "server-memory-copy-before-delete")
        await client.call_tool("delete_entities", {"entityNames": [c.key for c in among[:half]]})
        deletions = [{"entityName": c.key, "observations": [c.text]} for c in among[half:]]
        await client.call_tool("delete_observations", {"deletions": deletions})
        found["search"] = await _searched(client, "search_nodes", among)
        opened = await client.call_tool("open_nodes", {"names": [c.key for c in among]})
        found["get"] = found_in_text(_text(opened), among)
        found["files_live"] = keys_in(scan([folder], among))
    return found


# -- basic-memory -------------------------------------------------------------------------------


def _works(python: str) -> bool:
    check = [python, "-c", "import sys; sys.exit(sys.version_info < (3, 12))"]
    return subprocess.run(check, capture_output=True, check=False).returncode == 0  # noqa: S603


def _python312() -> str:
    """A Python >= 3.12 to install basic-memory with: ``ENGRAM_BENCH_PYTHON``, pyenv's 3.12,
    ``python3.12`` or ``python3.13`` on PATH (a pyenv shim of a version not selected fails the
    check and is skipped)."""
    named = [os.environ.get("ENGRAM_BENCH_PYTHON")]
    pyenv = shutil.which("pyenv")
    if pyenv is not None:
        done = subprocess.run(  # noqa: S603 - pyenv's own lookup
            [pyenv, "prefix", "3.12.1"], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            named.append(str(Path(done.stdout.strip()) / "bin" / "python3"))
    named += [shutil.which("python3.12"), shutil.which("python3.13")]
    for python in filter(None, named):
        if _works(python):
            return python
    raise PeerUnavailable("basic-memory needs Python >= 3.12: set ENGRAM_BENCH_PYTHON to one")


def basic_memory_command() -> Path:
    """basic-memory's console script in its cache venv (made and installed when missing)."""
    venv = CACHE / BASIC_MEMORY.replace("==", "-")
    script = venv / "bin" / "basic-memory"
    if script.exists():
        return script
    python = _python312()
    for step in (
        [python, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", BASIC_MEMORY],
    ):
        done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)  # noqa: S603
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise PeerUnavailable(f"installing {BASIC_MEMORY} failed: {done.stderr[-400:]}")
    return script


async def _basic_memory(folder: Path, among: Sequence[Canary]) -> dict[str, set[str]]:
    env = {
        "HOME": str(folder),
        "BASIC_MEMORY_CONFIG_DIR": str(folder / "config"),
        "BASIC_MEMORY_HOME": str(folder / "notes"),
        "PATH": os.environ["PATH"],
    }
    params = StdioServerParameters(command=str(basic_memory_command()), args=["mcp"], env=env)
    found: dict[str, set[str]] = {}
    async with stdio_session(params, folder.parent / "basic-memory.stderr.log") as client:
        for canary in among:
            note = {"title": canary.key, "content": canary.text, "directory": "canaries"}
            await client.call_tool("write_note", note)
        found["control_search"] = await _searched(client, "search_notes", among)
        shutil.copytree(folder, folder.parent / "basic-memory-copy-before-delete")
        for canary in among:
            await client.call_tool("delete_note", {"identifier": canary.key})
        found["search"] = await _searched(client, "search_notes", among)
        found["get"] = set()
        for canary in among:
            read = await client.call_tool("read_note", {"identifier": canary.key})
            found["get"] |= found_in_text(_text(read), [canary])
        found["files_live"] = keys_in(scan([folder], among))
    return found


PEERS = {"server-memory": _server_memory, "basic-memory": _basic_memory}


def run(among: Sequence[Canary], work: Path, names: Sequence[str] = tuple(PEERS)) -> dict[str, Any]:
    """Each peer of ``names`` over ``among`` in its own folder under ``work``: per channel, the
    canaries it still gives up after its own delete (or why the peer could not run)."""
    report: dict[str, Any] = {}
    for name in names:
        peer = PEERS[name]
        folder = work / name
        folder.mkdir(parents=True)
        try:
            found = anyio.run(peer, folder, among)
        except PeerUnavailable as error:
            report[name] = {"unavailable": str(error)}
            continue
        stopped = scan([folder], among)
        found["files_stopped"] = keys_in(stopped)
        found["copy_before_delete"] = keys_in(scan([work / f"{name}-copy-before-delete"], among))
        report[name] = {
            "canaries": len(among),
            "channels": {key: {"found": len(keys)} for key, keys in found.items()},
            "files_holding": {
                str(Path(path).relative_to(folder)): len(keys) for path, keys in stopped.items()
            },
        }
    return report

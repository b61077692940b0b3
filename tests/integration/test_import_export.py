"""``admin import`` and ``admin export --format``: real files in a temporary folder, the real
console entry point, the real SQLite data directory; the MCP memory server's file read back by
the real ``@modelcontextprotocol/server-memory`` from npm through the official ``mcp`` client."""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import sqlite3
import string
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engram_memory.entry import main

from engram_testing import tool_missing

GRAPH = [
    {
        "type": "entity",
        "name": "Alice",
        "entityType": "person",
        "observations": ["Prefers tabs over spaces", "Maintains the billing service"],
    },
    {
        "type": "entity",
        "name": "Billing",
        "entityType": "service",
        "observations": ["Runs nightly"],
    },
    {"type": "relation", "from": "Alice", "to": "Billing", "relationType": "maintains"},
]


def _secret() -> str:
    return "ghp_" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(36))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _import(
    capsys: pytest.CaptureFixture[str], data: Path, source: Path, fmt: str, *extra: str
) -> tuple[int, dict[str, Any], str]:
    code, out, err = _run(
        capsys, "admin", "import", str(source), "--data-dir", str(data), "--format", fmt,
        "--principal", "alice", "--purpose", "moving-in", "--json", *extra,
    )  # fmt: skip
    return code, (json.loads(out) if code == 0 else {}), err


def _records(data: Path) -> int:
    with sqlite3.connect(data / "engram.db") as db:
        return int(db.execute("SELECT count(*) FROM records").fetchone()[0])


def _candidates(data: Path) -> int:
    with sqlite3.connect(data / "engram.db") as db:
        return int(db.execute("SELECT count(*) FROM candidates").fetchone()[0])


@pytest.fixture
def data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    directory = tmp_path / "data"
    assert main(["init", "--data-dir", str(directory)]) == 0
    capsys.readouterr()
    return directory


def test_mcp_memory_file_dry_run_then_import_then_nothing_more(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = _secret()
    lines = [*GRAPH, {"type": "entity", "name": "Ops", "entityType": "team",
                      "observations": [f"deploy token {secret}"]}]  # fmt: skip
    source = tmp_path / "memory.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")

    code, dry, err = _import(capsys, data, source, "mcp-memory", "--dry-run")
    assert code == 0, err
    assert (dry["accepted"], dry["rejected"]) == (3, 1)
    assert dry["not_accepted"] == [
        {"place": "memory.jsonl:4", "outcome": "rejected", "reason": "secret:GitHub Token"}
    ]
    assert _candidates(data) == 0  # the dry run wrote nothing

    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0, err
    assert (done["accepted"], done["rejected"]) == (3, 1)
    assert secret not in json.dumps(done) + err
    assert _records(data) == 3

    code, again, _ = _import(capsys, data, source, "mcp-memory")
    assert (again["already_imported"], again["accepted"]) == (4, 0)
    assert _records(data) == 3


def test_malformed_file_is_one_line_and_nothing_imported(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "memory.jsonl"
    good = json.dumps(GRAPH[0])
    source.write_text(f"{good}\n{json.dumps(GRAPH[1])}\n{{not json\n", encoding="utf-8")
    code, _, err = _import(capsys, data, source, "mcp-memory")
    assert code == 2
    assert err.count("\n") == 1 and "memory.jsonl:3" in err
    assert _candidates(data) == 0


def test_mem0_export_and_markdown_folder(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mem0 = tmp_path / "mem0.json"
    mem0.write_text(
        json.dumps(
            [
                {
                    "id": "m1",
                    "memory": "Likes green tea",
                    "user_id": "alice",
                    "metadata": {},
                    "created_at": "2024-07-20T10:00:00-07:00",
                    "updated_at": None,
                },
                {
                    "id": "m2",
                    "memory": "Lives in Lisbon",
                    "user_id": "alice",
                    "created_at": "2024-07-21",
                },
            ]
        ),
        encoding="utf-8",
    )
    code, done, err = _import(capsys, data, mem0, "mem0")
    assert (code, done["accepted"]) == (0, 2), err
    bad, secret = tmp_path / "bad.json", _secret()
    bad.write_text(json.dumps([{"id": "m3", "memory": "x", "created_at": secret}]), "utf-8")
    code, _, err = _import(capsys, data, bad, "mem0")
    assert code == 2 and "bad.json[0].created_at" in err and secret not in err

    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "coffee.md").write_text(
        "---\ntitle: Coffee\ntype: note\ndate: 2024-01-02\n---\nBrewing notes.\n\n"
        "- [method] Pour over gives a clean cup\n- [decision] Buy a burr grinder\n"
        "- relates_to [[Tea]]\n",
        encoding="utf-8",
    )
    (notes / "sub" / "tea.md").write_text("Green tea at 80 degrees.\n", encoding="utf-8")
    code, done, err = _import(capsys, data, notes, "markdown")
    assert (code, done["accepted"]) == (0, 2), err
    assert _records(data) == 4

    (notes / "broken.md").write_text("---\ntitle: [unclosed\n---\nx\n", encoding="utf-8")
    code, _, err = _import(capsys, data, notes, "markdown")
    assert code == 2 and "broken.md:" in err
    assert _records(data) == 4


def test_a_note_with_more_observations_than_a_capture_holds_loses_none(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    facts = [f"- [fact] Station {n} of the survey reads {n * 37 % 1000} metres" for n in range(70)]
    (notes / "survey.md").write_text("Survey log.\n\n" + "\n".join(facts) + "\n", "utf-8")
    code, done, err = _import(capsys, data, notes, "markdown")
    assert (code, done["accepted"]) == (0, 2), err  # 63 observations, then the other 7
    exported = tmp_path / "survey.jsonl"
    code, _, err = _run(
        capsys, "admin", "export", "--data-dir", str(data), "--output", str(exported)
    )
    assert code == 0, err
    texts = [
        component["text"]
        for line in exported.read_text("utf-8").splitlines()
        for component in json.loads(line)["record"]["components"]
    ]
    assert sorted(t for t in texts if t.startswith("[fact]")) == sorted(f[2:] for f in facts)
    assert any(t.startswith("# survey (part 2 of 2)") for t in texts)
    code, done, err = _import(capsys, data, notes, "markdown")
    assert (code, done["accepted"], _records(data)) == (0, 0, 2), err  # a re-run adds nothing


def test_a_near_duplicate_of_a_current_record_is_held_in_the_dry_run_and_the_real_run(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, again = tmp_path / "first.jsonl", tmp_path / "again.jsonl"
    first.write_text(json.dumps(GRAPH[1]) + "\n", "utf-8")
    reworded = {"type": "entity", "name": "Billing", "entityType": "service"}
    again.write_text(json.dumps({**reworded, "observations": ["Runs nightly!"]}) + "\n", "utf-8")
    assert _import(capsys, data, first, "mcp-memory")[1]["accepted"] == 1
    held = [
        {"place": "again.jsonl:1", "outcome": "pending_adjudication", "reason": "near-duplicate"}
    ]
    for extra in ("--dry-run", None):
        code, done, err = _import(capsys, data, again, "mcp-memory", *filter(None, [extra]))
        assert (code, done["pending_adjudication"], done["not_accepted"]) == (0, 1, held), err
    assert (_records(data), _candidates(data)) == (1, 2)


def _imported_then_exported(
    capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path, fmt: str
) -> Path:
    """GRAPH imported into ``data``, then exported in ``fmt``: the exported file."""
    source = tmp_path / "memory.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in GRAPH), encoding="utf-8")
    assert _import(capsys, data, source, "mcp-memory")[0] == 0
    exported = tmp_path / f"exported.{fmt}.jsonl"
    code, _, err = _run(
        capsys, "admin", "export", "--data-dir", str(data), "--format", fmt,
        "--output", str(exported),
    )  # fmt: skip
    assert code == 0, err
    return exported


def test_our_export_moves_into_another_data_directory(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = _imported_then_exported(capsys, data, tmp_path, "engram")
    other = tmp_path / "other"
    assert main(["init", "--data-dir", str(other)]) == 0
    capsys.readouterr()
    code, done, err = _import(capsys, other, exported, "engram")
    assert (code, done["accepted"]) == (0, 3), err


def _read_graph(server: Path, memory_file: Path) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def read() -> dict[str, Any]:
        params = StdioServerParameters(
            command="node",
            args=[str(server)],
            env={"MEMORY_FILE_PATH": str(memory_file), "PATH": "/usr/bin:/bin"},
        )
        log = (memory_file.parent / "server-memory.log").open("w")  # pytest's stderr has no fd
        async with (
            stdio_client(params, errlog=log) as (reader, writer),
            ClientSession(reader, writer) as s,
        ):
            await s.initialize()
            result = await s.call_tool("read_graph", {})
            text = result.content[0]
            graph: dict[str, Any] = json.loads(getattr(text, "text", "{}"))
        log.close()
        return graph

    return asyncio.run(read())


@pytest.fixture(scope="module")
def memory_server(tmp_path_factory: pytest.TempPathFactory) -> Path:
    npm = shutil.which("npm")
    if shutil.which("node") is None or npm is None:
        tool_missing("node and npm are not installed: the MCP memory server cannot run")
    folder = tmp_path_factory.mktemp("server-memory")
    install = [npm, "install", "--silent", "--prefix", str(folder)]
    subprocess.run(  # noqa: S603 - npm from PATH, installing the one package named here
        [*install, "@modelcontextprotocol/server-memory"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return folder / "node_modules" / "@modelcontextprotocol" / "server-memory" / "dist" / "index.js"


def test_exported_mcp_memory_file_is_read_by_the_real_server(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], memory_server: Path
) -> None:
    exported = _imported_then_exported(capsys, data, tmp_path, "mcp-memory")
    graph = _read_graph(memory_server, exported)
    entities = sorted(graph["entities"], key=lambda e: e["name"])
    assert [{**e, "type": "entity"} for e in entities] == GRAPH[:2]
    assert [{**r, "type": "relation"} for r in graph["relations"]] == GRAPH[2:]


def test_manual_mode_holds_each_item_and_a_rerun_finds_it_imported(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _run(capsys, "admin", "policy", "set", "--mode", "manual", "--data-dir", str(data))[0] == 0
    )
    source = tmp_path / "memory.jsonl"
    source.write_text(json.dumps(GRAPH[0]) + "\n", encoding="utf-8")
    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0 and done["pending_adjudication"] == 1, err
    assert done["not_accepted"][0]["reason"] == "manual"
    assert (_candidates(data), _records(data)) == (1, 0)
    # the hold was stored with the item's admission key: the re-run replays it
    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0 and (done["pending_adjudication"], done["already_imported"]) == (0, 1), err
    assert (_candidates(data), _records(data)) == (1, 0)

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
    lines = [*GRAPH, {"type": "entity", "name": f"deploy token {secret}", "entityType": "team",
                      "observations": ["Owns the deploy pipeline"]}]  # fmt: skip
    source = tmp_path / "memory.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    rejected = {"place": "memory.jsonl:4", "outcome": "rejected", "reason": "secret:GitHub Token"}

    code, dry, err = _import(capsys, data, source, "mcp-memory", "--dry-run")
    assert code == 0, err
    assert (dry["accepted"], dry["rejected"]) == (3, 1)
    assert dry["not_accepted"] == [{**rejected, "earlier": False}]
    assert _candidates(data) == 0  # the dry run wrote nothing

    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0, err
    assert (done["accepted"], done["rejected"]) == (3, 1)
    assert secret not in json.dumps(done) + err
    assert _records(data) == 3

    # A re-run tells the earlier outcomes apart: three already imported, one rejected (again,
    # with its rule), in the dry run as in the real run; nothing added. The format's name as
    # people know the package (server-memory) reads the same file.
    for extra, name in (("--dry-run", "server-memory"), (None, "mcp-memory")):
        code, again, err = _import(capsys, data, source, name, *filter(None, [extra]))
        assert code == 0, err
        counts = (again["already_imported"], again["rejected"], again["accepted"])
        assert counts == (3, 1, 0), again
        assert again["not_accepted"] == [{**rejected, "earlier": True}]
    assert (_records(data), _candidates(data)) == (3, 4)


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
        {
            "place": "again.jsonl:1",
            "outcome": "pending_adjudication",
            "reason": "near-duplicate",
            "earlier": False,
        }
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


def test_manual_mode_holds_each_item_and_a_rerun_finds_it_held_until_decided(
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
    # the re-run finds the item still held, not imported, and adds nothing
    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0 and (done["pending_adjudication"], done["already_imported"]) == (1, 0), err
    assert done["not_accepted"] == [
        {"place": "memory.jsonl:1", "outcome": "pending_adjudication", "reason": "manual",
         "earlier": True}
    ]  # fmt: skip
    assert (_candidates(data), _records(data)) == (1, 0)
    # once a person accepts it, a re-run counts it as already imported
    with sqlite3.connect(data / "engram.db") as db:
        (candidate,) = db.execute("SELECT candidate_id FROM candidates").fetchone()
    assert _run(capsys, "admin", "adjudicate", candidate, "accept", "--data-dir", str(data))[0] == 0
    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0 and (done["pending_adjudication"], done["already_imported"]) == (0, 1), err
    assert (_candidates(data), _records(data)) == (1, 1)


# --------------------------------------------------------------------------------------------
# Import that loses nothing clean (issue 38, item 7)
# --------------------------------------------------------------------------------------------


def _aws_key() -> str:
    """A fresh AWS access key id of the corpus's shape (tests/data/secrets): the scanner flags
    it, and no fixed value can leak from one test into another's assertions."""
    alphabet = string.ascii_uppercase + "234567"
    return "AKIA" + "".join(secrets.choice(alphabet) for _ in range(16))


def _exported(capsys: pytest.CaptureFixture[str], data: Path, tmp_path: Path) -> list[Any]:
    exported = tmp_path / f"export-{secrets.token_hex(4)}.jsonl"
    code, _, err = _run(
        capsys, "admin", "export", "--data-dir", str(data), "--output", str(exported)
    )
    assert code == 0, err
    return [json.loads(line)["record"] for line in exported.read_text("utf-8").splitlines()]


def _texts(record: dict[str, Any]) -> dict[str, str]:
    return {c["component_id"]: c["text"] for c in record["components"]}


def _written(data: Path) -> bytes:
    """Every byte the data directory holds (the store, its journal, the audit log)."""
    return b"".join(path.read_bytes() for path in sorted(data.rglob("*")) if path.is_file())


def test_a_secret_observation_is_dropped_and_the_entitys_clean_ones_arrive(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = _aws_key()
    clean = [
        "Leads the payments team",
        "Prefers written design reviews",
        "Based in the Lisbon office",
        "On call the first week of each month",
    ]
    # The file as @modelcontextprotocol/server-memory writes it: one JSON object a line, the
    # entities and then the relations, "type" first.
    lines = [
        {"type": "entity", "name": "Dana", "entityType": "person",
         "observations": [*clean[:2], f"staging key {key} for the deploy job", *clean[2:]]},
        {"type": "entity", "name": "Payments", "entityType": "team",
         "observations": ["Owns the card ledger", "   ", 42]},
        {"type": "relation", "from": "Dana", "to": "Payments", "relationType": "leads"},
    ]  # fmt: skip
    source = tmp_path / "memory.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")

    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0, err
    assert (done["accepted"], done["rejected"], done["not_accepted"]) == (3, 0, [])
    assert done["dropped"] == [
        {"place": "memory.jsonl:1", "entity": "Dana", "observation": 3,
         "reason": "secret:AWS Access Key"},
        {"place": "memory.jsonl:2", "entity": "Payments", "observation": 2, "reason": "empty"},
        {"place": "memory.jsonl:2", "entity": "Payments", "observation": 3,
         "reason": "not a string"},
    ]  # fmt: skip
    dana = next(r for r in _exported(capsys, data, tmp_path) if _texts(r).get("name") == "Dana")
    observations = {cid: text for cid, text in _texts(dana).items() if cid.startswith("obs-")}
    assert observations == {"obs-1": clean[0], "obs-2": clean[1], "obs-4": clean[2],
                            "obs-5": clean[3]}  # fmt: skip
    # the text report says the place too, and nothing anywhere holds the key
    code, out, err = _run(
        capsys, "admin", "import", str(source), "--data-dir", str(data), "--format",
        "mcp-memory", "--principal", "alice", "--purpose", "moving-in",
    )  # fmt: skip
    assert code == 0 and "memory.jsonl:1" in out and "secret:AWS Access Key" in out, err
    code, audit, _ = _run(capsys, "admin", "audit", "--data-dir", str(data), "--json")
    assert code == 0 and "admin.import" in audit
    assert key not in json.dumps(done) + out + err + audit
    assert key.encode() not in _written(data)


def test_an_entity_with_more_observations_than_a_capture_holds_loses_none(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = [f"Survey station {n} reads {n * 37 % 1000} metres" for n in range(1, 71)]
    entity = {"type": "entity", "name": "Survey", "entityType": "log", "observations": facts}
    source = tmp_path / "memory.jsonl"
    source.write_text(json.dumps(entity) + "\n", encoding="utf-8")
    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert (code, done["accepted"]) == (0, 2), err  # 62 observations, then the other 8
    exported = tmp_path / "exported.jsonl"
    code, _, err = _run(
        capsys, "admin", "export", "--data-dir", str(data), "--format", "mcp-memory",
        "--output", str(exported),
    )  # fmt: skip
    assert code == 0, err
    (back,) = [json.loads(line) for line in exported.read_text("utf-8").splitlines()]
    assert {**back, "observations": sorted(back["observations"])} == {
        **entity,
        "observations": sorted(facts),
    }  # merged by name: each part's observations in turn


def test_an_entity_whose_name_is_a_secret_is_rejected_and_its_name_withheld(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = _aws_key()
    source = tmp_path / "memory.jsonl"
    entity = {"type": "entity", "name": f"key {key}", "entityType": "credential",
              "observations": ["Rotated monthly", ""]}  # fmt: skip
    source.write_text(json.dumps(entity) + "\n", encoding="utf-8")
    code, done, err = _import(capsys, data, source, "mcp-memory")
    assert code == 0 and done["rejected"] == 1, err
    assert done["dropped"] == [
        {"place": "memory.jsonl:1", "entity": "(withheld)", "observation": 2, "reason": "empty"}
    ]
    assert key not in json.dumps(done) + err


def test_a_relation_is_one_sentence_and_cites_a_one_line_source(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "memory.jsonl"
    relations = [
        {"type": "relation", "from": "Alice", "to": "Acme", "relationType": "works_at"},
        {"type": "relation", "from": "Acme", "to": "Lisbon", "relationType": "isBasedIn"},
    ]
    source.write_text("".join(json.dumps(r) + "\n" for r in relations), encoding="utf-8")
    assert _import(capsys, data, source, "mcp-memory")[1]["accepted"] == 2
    records = _exported(capsys, data, tmp_path)
    assert sorted(_texts(r)["relation"] for r in records) == [
        "Acme is based in Lisbon.",
        "Alice works at Acme.",
    ]
    refs = [c["source_ref"] for r in records for c in r["citations"]]
    assert "mcp-memory:relation:Alice works_at Acme" in refs
    assert not any("\n" in ref for ref in refs)
    # the raw fields stay exact, so the MCP memory server's file comes back as it was
    assert {(_texts(r)["from"], _texts(r)["relationType"]) for r in records} == {
        ("Alice", "works_at"),
        ("Acme", "isBasedIn"),
    }


def test_a_note_keeps_its_title_once_and_no_empty_headings(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    # A basic-memory note: the title in the front matter and again as the first heading, the
    # observations under a heading of their own (they become components), then the relations.
    (notes / "coffee.md").write_text(
        "---\ntitle: Coffee Brewing\ntype: note\npermalink: coffee-brewing\n---\n\n"
        "# Coffee Brewing\n\nNotes on brewing at home.\n\n## Observations\n"
        "- [method] Pour over gives a clean cup\n- [tip] Water at 94 degrees\n\n"
        "## Gear\n\n### Grinders\n\n## Relations\n- relates_to [[Tea]]\n\n"
        "```sh\n# not a heading\n```\n",
        encoding="utf-8",
    )
    # An Obsidian note without front matter: its opening heading is its title.
    (notes / "green-tea.md").write_text("\n# Green Tea\n\nAt 80 degrees.\n", encoding="utf-8")
    assert _import(capsys, data, notes, "markdown")[1]["accepted"] == 2
    assert sorted(_texts(record)["note"] for record in _exported(capsys, data, tmp_path)) == [
        "# Coffee Brewing\nNotes on brewing at home.\n\n## Relations\n- relates_to [[Tea]]\n\n"
        "```sh\n# not a heading\n```",
        "# Green Tea\nAt 80 degrees.",
    ]


@pytest.mark.parametrize(
    ("fmt", "shape", "named"),
    [
        ("mem0", "mcp-memory", "this looks like a server-memory JSONL file"),
        ("engram", "mcp-memory", "this looks like a server-memory JSONL file"),
        ("markdown", "mcp-memory", "this looks like a server-memory JSONL file"),
        ("mcp-memory", "mem0", "this looks like a saved mem0 get_all() answer"),
        ("mcp-memory", "mem0-page", "this looks like a saved mem0 get_all() answer"),
        ("mem0", "markdown", "this looks like a folder of Markdown notes"),
        ("markdown", "mem0-folder", "this looks like a saved mem0 get_all() answer"),
    ],
)
def test_a_wrong_format_names_the_format_the_file_looks_like(
    data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    shape: str,
    named: str,
) -> None:
    memories = [{"id": "m1", "memory": "Likes green tea", "user_id": "alice"}]
    if shape == "markdown":
        source = tmp_path / "notes"
        source.mkdir()
        (source / "tea.md").write_text("# Tea\n\nGreen at 80 degrees.\n", "utf-8")
    elif shape == "mem0-folder":
        source = tmp_path / "pages"
        source.mkdir()
        (source / "page-1.json").write_text(json.dumps({"results": memories}), "utf-8")
    else:
        source = tmp_path / "source.json"
        document: Any = {
            "mcp-memory": None,
            "mem0": memories,
            "mem0-page": {"count": 1, "next": None, "previous": None, "results": memories},
        }[shape]
        text = "".join(json.dumps(line) + "\n" for line in GRAPH) if document is None else (
            json.dumps(document, indent=2)
        )  # fmt: skip
        source.write_text(text, encoding="utf-8")
    code, _, err = _import(capsys, data, source, fmt)
    expected = shape.removesuffix("-page").removesuffix("-folder")
    assert code == 2 and named in err and f"use --format {expected}" in err, err
    assert "not JSON" not in err and err.count("\n") == 1
    assert _candidates(data) == 0


def _mem0_memory(memory_id: str, text: str, user: str | None, day: int) -> dict[str, Any]:
    """One memory as mem0's get_all() documents it (docs.mem0.ai, "Get Memories")."""
    return {
        "id": memory_id,
        "memory": text,
        "user_id": user,
        "agent_id": None,
        "hash": secrets.token_hex(16),
        "metadata": None,
        "categories": ["preferences"],
        "created_at": f"2024-07-{day:02d}T23:57:00.108347-07:00",
        "updated_at": f"2024-07-{day:02d}T23:57:00.108367-07:00",
    }


def _principals(data: Path) -> dict[str, int]:
    with sqlite3.connect(data / "engram.db") as db:
        rows = db.execute("SELECT principal, count(*) FROM candidates GROUP BY principal")
        return {str(who): int(n) for who, n in rows}


def test_mem0_saved_pages_and_the_v2_answer_map_user_ids_to_principals(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pages = tmp_path / "pages"
    pages.mkdir()
    first = [
        _mem0_memory("m1", "Prefers window seats on long flights", "alice", 1),
        _mem0_memory("m2", "Allergic to peanuts and tree nuts", "bob", 2),
    ]
    moved = _mem0_memory("m2", "Allergic to peanuts, tree nuts and sesame", "bob", 9)
    # v1 paginated: {"count", "next", "previous", "results"}, one saved file a page; the second
    # page repeats m2 as it was edited between the two requests (its latest version counts)
    (pages / "page-1.json").write_text(json.dumps({
        "count": 3, "next": "https://api.mem0.ai/v1/memories/?page=2&page_size=2",
        "previous": None, "results": first}), "utf-8")  # fmt: skip
    (pages / "page-2.json").write_text(json.dumps({
        "count": 3, "next": None, "previous": "https://api.mem0.ai/v1/memories/?page=1&page_size=2",
        "results": [moved, _mem0_memory("m3", "Runs a book club on Thursdays", None, 3)]}),
        "utf-8")  # fmt: skip
    argv = ("--principal-from", "user_id", "--principal-map", "alice=agent-alice")
    code, done, err = _import(capsys, data, pages, "mem0", *argv)
    assert code == 0 and done["accepted"] == 3, err
    assert done["captured_as"] == {"agent-alice": 1, "alice": 1, "bob": 1}  # m3: --principal
    assert _principals(data) == {"agent-alice": 1, "alice": 1, "bob": 1}
    texts = sorted(_texts(r)["memory"] for r in _exported(capsys, data, tmp_path))
    assert "Allergic to peanuts, tree nuts and sesame" in texts
    assert "Allergic to peanuts and tree nuts" not in texts

    # v2 (POST /v2/memories/): {"results": [...], "total": n}; and a file of several pages
    v2 = tmp_path / "v2.json"
    v2.write_text(json.dumps({"results": [_mem0_memory("m4", "Drinks oat milk", "carol", 4)],
                              "total": 1}), "utf-8")  # fmt: skip
    assert _import(capsys, data, v2, "mem0", *argv)[1]["captured_as"] == {"carol": 1}
    several = tmp_path / "several.json"
    several.write_text(json.dumps([
        {"results": [_mem0_memory("m5", "Cycles to work in summer", "dave", 5)]},
        {"results": [_mem0_memory("m6", "Reads crime fiction at night", "dave", 6)]},
    ]), "utf-8")  # fmt: skip
    code, done, err = _import(capsys, data, several, "mem0", *argv)
    assert (code, done["accepted"], done["captured_as"]) == (0, 2, {"dave": 2}), err


def test_mem0_principal_options_are_checked_before_anything_is_written(
    data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "mem0.json"
    memories = [_mem0_memory("m1", "Prefers tea", "alice", 1),
                _mem0_memory("m2", "Walks the dog at seven", None, 2)]  # fmt: skip
    source.write_text(json.dumps(memories), "utf-8")
    base = ("admin", "import", str(source), "--data-dir", str(data), "--purpose", "moving-in")
    refusals = {
        ("--format", "mem0", "--principal-from", "user_id"): "mem0.json[1]: names no principal",
        ("--format", "mem0"): "name --principal",
        ("--format", "mem0", "--principal", "p", "--principal-map", "alice"): "VALUE=PRINCIPAL",
        ("--format", "mcp-memory", "--principal-from", "user_id"): "--format mem0 only",
    }
    for extra, said in refusals.items():
        code, _, err = _run(capsys, *base, *extra)
        assert code == 2 and said in err, (extra, err)
    assert _candidates(data) == 0


def test_an_import_reads_its_source_again_one_item_at_a_time(tmp_path: Path) -> None:
    """The source is validated whole first, then read again item by item for the import: what
    an import holds grows with one item, not with the file (a 100,000-entity file held every
    capture's arguments at once, 463 MB)."""
    import tracemalloc

    from engram_memory.operator_plane.moving_in import read_source

    source = tmp_path / "memory.jsonl"
    lines = [
        {"type": "entity", "name": f"fact-{n:05d}", "entityType": "note",
         "observations": [f"Observation {n}: the release train leaves on Tuesdays."]}
        for n in range(3_000)
    ]  # fmt: skip
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    items = read_source("mcp-memory", source, "general", 1_796_000_000_000)
    assert len(items) == 3_000 and items.first_unnamed == "memory.jsonl:1"

    tracemalloc.start()
    try:
        seen = sum(1 for _ in items)  # one at a time, as import_items reads it
        one_at_a_time = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        held = list(items)  # what an import held before
        all_at_once = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == len(held) == 3_000
    assert held[0].place == "memory.jsonl:1" and held[-1].place == "memory.jsonl:3000"
    assert one_at_a_time * 4 < all_at_once, (one_at_a_time, all_at_once)

"""The embedded operations plane from the command line (issue 12): no silent regeneration, the
operations API's commands, backup and restore, token revocation and key rotation."""

from __future__ import annotations

import io
import json
import re
import shutil
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from engram_memory.binding.tokens import context_from_claims
from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import open_embedded
from engram_memory.embedded.errors import DataDirectoryRefused
from engram_memory.embedded.host_file import load_host_config
from engram_memory.embedded.issuer_keys import local_verifier
from engram_memory.embedded.serve import describe_lifetime, open_server, print_banner
from engram_memory.engine.context import TrustedContext, new_audit_id

from engram_testing import capture_args, handled, scanned_bytes

Capture = pytest.CaptureFixture[str]


def _one_line_error(capsys: Capture) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def toured(tmp_path: Path, capsys: Capture) -> Path:
    """A data directory holding memories (the tour's)."""
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    assert main(["tour", "--data-dir", str(data), "--yes"]) == 0
    capsys.readouterr()
    return data


# -- no silent regeneration ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["tour", "--yes"],
        ["init"],
        ["verify"],
        ["admin", "reindex"],
        ["admin", "adjudicate", "candidate_x", "accept"],
    ],
)
def test_memories_without_their_key_store_are_refused_and_nothing_is_regenerated(
    toured: Path, capsys: Capture, command: list[str]
) -> None:
    shutil.rmtree(toured / "keys")
    before = sorted(path.name for path in toured.iterdir())
    assert (
        main(
            [*command[:2], "--data-dir", str(toured), *command[2:]]
            if command[0] == "admin"
            else [command[0], "--data-dir", str(toured), *command[1:]]
        )
        == 2
    )
    line = _one_line_error(capsys)
    assert "holds memories but its key store is missing" in line
    assert "Put the original keys/ folder back" in line
    assert not (toured / "keys").exists()
    assert sorted(path.name for path in toured.iterdir()) == before


def test_the_server_refuses_memories_without_keys_before_creating_any(toured: Path) -> None:
    shutil.rmtree(toured / "keys")
    with pytest.raises(DataDirectoryRefused, match="holds memories"):
        open_server(toured, port=8765)
    assert not (toured / "keys").exists()


def test_another_data_directorys_key_store_is_refused(
    toured: Path, tmp_path: Path, capsys: Capture
) -> None:
    other = tmp_path / "other"
    assert main(["init", "--data-dir", str(other)]) == 0
    shutil.rmtree(toured / "keys")
    shutil.copytree(other / "keys", toured / "keys")
    capsys.readouterr()
    assert main(["verify", "--data-dir", str(toured)]) == 2
    assert "does not belong to the database" in _one_line_error(capsys)


def test_a_lost_master_key_alone_is_refused_too(toured: Path, capsys: Capture) -> None:
    (toured / "keys" / "master.key").unlink()
    assert main(["verify", "--data-dir", str(toured)]) == 2
    assert "master.key" in _one_line_error(capsys)
    assert not (toured / "keys" / "master.key").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["verify"],
        ["admin", "reindex"],
        ["admin", "adjudicate", "candidate_x", "accept"],
        ["admin", "audit"],
        ["admin", "policy", "show"],
    ],
)
def test_the_operations_plane_never_creates_a_mistyped_data_directory(
    tmp_path: Path, capsys: Capture, command: list[str]
) -> None:
    typo = tmp_path / "dtaa"
    where = 3 if command[:2] == ["admin", "policy"] else (2 if command[0] == "admin" else 1)
    assert main([*command[:where], "--data-dir", str(typo), *command[where:]]) == 2
    line = _one_line_error(capsys)
    assert str(typo) in line and "data directory" in line
    assert not typo.exists()


def test_an_empty_data_directory_without_keys_is_initialised_as_before(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data)]) == 0
    shutil.rmtree(data / "keys")  # nothing was ever written: nothing to strand
    assert main(["init", "--data-dir", str(data)]) == 0
    assert (data / "keys" / "master.key").is_file()


# -- the operations API from the command line ----------------------------------------------------


def _ctx(principal: str = "agent-alice") -> TrustedContext:
    return TrustedContext(
        tenant_id="local",
        workspace_id="default",
        principal=principal,
        purpose_ref="purpose:general",
        audit_id=new_audit_id(),
    )


def _files_holding(directory: Path, needles: list[bytes]) -> list[str]:
    """Every file under ``directory`` (the database, its -wal and -shm, the key file, the audit
    log, a backup) whose bytes hold one of ``needles``."""
    scanned = {path: scanned_bytes(path) for path in directory.rglob("*") if path.is_file()}
    return sorted(
        str(path.relative_to(directory))
        for path, content in scanned.items()
        if any(needle in content for needle in needles)
    )


def _captured(data: Path, text: str, key: str, *, admit: bool) -> str:
    """A candidate captured (and submitted when ``admit``) by an agent; its id."""
    host = open_embedded(data)
    try:
        now_ms = int(time.time() * 1000)
        captured: dict[str, Any] = handled(
            host.engine, "capture", capture_args(text, key=key, valid_from=now_ms - 60_000), _ctx()
        )
        candidate_id: str = captured["output"]["value"]["candidate_id"]
        if admit:
            handled(
                host.engine,
                "request_admission",
                {"candidate_id": candidate_id, "idempotency_key": f"{key}-admit"},
                _ctx(),
            )
        return candidate_id
    finally:
        host.close()


def _admin(capsys: Capture, data: Path, *words: str, code: int = 0) -> Any:
    """Run ``engram-memory admin WORDS... --data-dir DATA --operator ops-carol``; its JSON."""
    assert (
        main(["admin", *words, "--data-dir", str(data), "--operator", "ops-carol", "--json"])
        == code
    )
    if code != 0:
        return None  # the caller reads the error line
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def data(tmp_path: Path, capsys: Capture) -> Path:
    data = tmp_path / "data"
    _initialised(data, capsys)
    return data


def _backed_up(data: Path, capsys: Capture) -> Path:
    """``admin backup`` of ``data`` beside it; the backup file."""
    backup_file = data.parent / "engram.backup"
    _admin(capsys, data, "backup", str(backup_file))
    return backup_file


def _initialised(data: Path, capsys: Capture) -> None:
    assert main(["init", "--data-dir", str(data)]) == 0
    capsys.readouterr()


def test_pending_list_show_adjudicate_and_withdraw(data: Path, capsys: Capture) -> None:
    assert main(["admin", "policy", "set", "--data-dir", str(data), "--mode", "manual"]) == 0
    held = _captured(data, "Releases are cut on Tuesdays.", "operator-cli-key-0001", admit=True)
    draft = _captured(data, "A draft to withdraw.", "operator-cli-key-0002", admit=False)
    capsys.readouterr()
    listed = {
        row["candidate_id"]: (row["waiting"], row["held_for"], row["first_line"])
        for row in _admin(capsys, data, "pending", "list")
    }
    assert listed == {  # why each waits, and what it says (issue 38, item 3)
        held: ("held", "adjudication required (manual admission)", "Releases are cut on Tuesdays."),
        draft: ("not submitted", None, "A draft to withdraw."),
    }
    assert main(["admin", "pending", "list", "--data-dir", str(data)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    columns = ["candidate", "captured at", "captured by", "waiting", "held for", "first line"]
    assert re.split(r"\s{2,}", header) == columns
    shown_rows = {row.split()[0]: row for row in rows}
    assert shown_rows[held].endswith(
        "held           adjudication required (manual admission)  Releases are cut on Tuesdays."
    )
    assert shown_rows[draft].endswith(
        "not submitted  -                                         A draft to withdraw."
    )
    shown = _admin(capsys, data, "pending", "show", held)
    assert shown["record"]["components"][0]["text"] == "Releases are cut on Tuesdays."
    outcome = _admin(capsys, data, "adjudicate", held, "accept", "--reason", "checked")
    assert outcome["status"] == "accepted"
    withdrawn = _admin(capsys, data, "pending", "withdraw", draft, "--reason", "stray draft")
    assert withdrawn["receipt"]["to_state"] == "withdrawn"
    assert _admin(capsys, data, "pending", "list") == []
    assert main(["admin", "pending", "show", "--data-dir", str(data), held]) == 1
    assert "NOT_FOUND" in _one_line_error(capsys)
    audit = [json.loads(line) for line in (data / "audit.log").read_text().splitlines()]
    operator_lines = [line for line in audit if line["tool"].startswith("admin.")]
    assert {line["principal"] for line in operator_lines} >= {"operator:ops-carol"}
    assert [line["tool"] for line in operator_lines][:5] == [
        "admin.pending_list",
        "admin.pending_list",
        "admin.pending_show",
        "admin.adjudicate",
        "admin.withdraw",
    ]
    assert "Tuesdays" not in (data / "audit.log").read_text()


def test_admin_audit_shows_an_invalid_schemas_field_and_rule_which_the_agent_never_sees(
    data: Path, capsys: Capture
) -> None:
    secretish = "sk-live-" + "Q" * 40
    host = open_embedded(data)
    try:
        arguments = {"query": secretish, "purpose_ref": "purpose:general", "limit": 51}
        refused = handled(host.engine, "search", arguments, _ctx())
    finally:
        host.close()
    assert refused["error"] == {
        "code": "INVALID_SCHEMA",
        "message": "The arguments do not match the closed input schema.",
        "retriable": False,
    }
    assert main(["admin", "audit", "--data-dir", str(data), "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    (entry,) = [e for e in entries if e["audit_id"] == refused["auditId"]]
    assert entry["violation"] == {
        "pointer": "/limit",
        "rule": "less_than_equal",
        "says": "must be at most 50",
        "more": 0,
    }
    assert main(["admin", "audit", "--data-dir", str(data)]) == 0
    shown = capsys.readouterr().out
    (row,) = [line for line in shown.splitlines() if refused["auditId"] in line]
    assert row.endswith("INVALID_SCHEMA  /limit: must be at most 50")
    assert shown.splitlines()[0].split()[-1] == "violation"
    assert secretish not in shown


def test_records_commands_walk_the_lifecycle_and_status_counts_it(
    data: Path, capsys: Capture
) -> None:
    candidate = _captured(data, "Deploys need two approvals.", "operator-cli-key-0003", admit=True)
    (record,) = _admin(capsys, data, "records", "list")
    record_id = record["record_id"]
    assert record["candidate_id"] == candidate and record["state"] == "accepted_current"
    steps = [
        ("dispute", "accepted_disputed"),
        ("resolve", "accepted_current"),
        ("supersede", "historical"),
        ("expire", "expired"),
        ("trust-invalidate", "trust_invalid"),
        ("forget", "tombstoned"),
    ]
    for name, to_state in steps:
        receipt = _admin(capsys, data, "records", name, record_id, "--reason", "cli")["receipt"]
        assert receipt["to_state"] == to_state, name
    assert _admin(capsys, data, "records", "list", "--state", "tombstoned")[0]["body"] == (
        "shredded"
    )
    shown = _admin(capsys, data, "records", "show", record_id)
    assert shown["state"] == "tombstoned" and shown["record"] is None
    history = _admin(capsys, data, "records", "history", record_id)
    assert [event["operation"] for event in history] == [
        "capture",
        "admit",
        "dispute",
        "resolve",
        "supersede",
        "expire",
        "trust_invalidate",
        "tombstone",
    ]
    report = _admin(capsys, data, "status")
    assert report["records"] == {"tombstoned": 1}
    assert report["index"]["fresh"] is True and report["key_store"]["health"] == "ok"
    _admin(capsys, data, "records", "dispute", record_id, "--reason", "x", code=1)
    assert "ALREADY_TERMINAL" in _one_line_error(capsys)
    assert main(["verify", "--data-dir", str(data)]) == 0


# -- export, backup, restore ------------------------------------------------------------------------


def _agent(data: Path, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One agent call on the data directory, in process; its envelope."""
    host = open_embedded(data)
    try:
        envelope: dict[str, Any] = handled(
            host.engine, tool, {**arguments, "purpose_ref": "purpose:general"}, _ctx()
        )
    finally:
        host.close()
    return envelope


def _search(data: Path, query: str) -> list[str]:
    found = _agent(data, "search", {"query": query})
    return [packet["record"]["record_id"] for packet in found["output"]["value"]["records"]]


def test_export_writes_the_current_records_with_their_receipts(data: Path, capsys: Capture) -> None:
    _captured(data, "Export: the wiki moved to docs.", "operator-cli-key-0010", admit=True)
    _captured(data, "Export: a disputed note.", "operator-cli-key-0011", admit=True)
    records = _admin(capsys, data, "records", "list")
    disputed = next(r["record_id"] for r in records if r["record_id"] not in _search(data, "wiki"))
    _admin(capsys, data, "records", "dispute", disputed, "--reason", "contested")
    out = data.parent / "export.jsonl"
    assert main(["admin", "export", "--data-dir", str(data), "--output", str(out)]) == 0
    assert "exported 1 record(s)" in capsys.readouterr().err
    (line,) = [json.loads(text) for text in out.read_text().splitlines()]
    assert line["record"]["components"][0]["text"] == "Export: the wiki moved to docs."
    assert line["receipts"]["admission"]["record_digest"] == line["record"]["record_digest"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "disputed note" not in out.read_text()
    assert main(["admin", "export", "--data-dir", str(data), "--output", str(out)]) == 2
    assert "already exists" in _one_line_error(capsys)


def _tables(database: Path) -> set[str]:
    conn = sqlite3.connect(database)
    try:
        return {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()


def test_backup_then_restore_beside_the_original_keys(data: Path, capsys: Capture) -> None:
    _captured(
        data, "Restore: the pager rota is in the handbook.", "operator-cli-key-0020", admit=True
    )
    pending = _captured(data, "Restore: a pending note.", "operator-cli-key-0021", admit=False)
    shelf = data.parent / "shelf"
    shelf.mkdir()
    saved = _admin(capsys, data, "backup", str(shelf / "engram.backup"))
    assert saved["keys_included"] is False and saved["records"] == 1
    assert not any(name.startswith(("lex_", "vec_")) for name in _tables(shelf / "engram.backup"))

    target = data.parent / "restored"
    target.mkdir()
    shutil.copytree(data / "keys", target / "keys")
    report = _admin(capsys, target, "restore", str(shelf / "engram.backup"))
    assert report["projected"] == 1 and report["pending_candidates_without_key"] == 0
    assert len(_search(target, "pager rota handbook")) == 1
    shown = _admin(capsys, target, "pending", "show", pending)
    assert shown["record"]["components"][0]["text"] == "Restore: a pending note."
    assert main(["verify", "--data-dir", str(target)]) == 0


def test_a_restore_with_moved_keys_brings_host_json_back(data: Path, capsys: Capture) -> None:
    assert main(["admin", "policy", "set", "--data-dir", str(data), "--mode", "manual"]) == 0
    config = json.loads((data / "host.json").read_text())
    config.update(default_token_ttl_s=5_400, resource="https://memory.example.com/mcp")
    (data / "host.json").write_text(json.dumps(config))
    _captured(data, "Host file: the rota is kept.", "operator-cli-key-0050", admit=False)
    capsys.readouterr()
    backup_file = _backed_up(data, capsys)
    target = data.parent / "moved"
    target.mkdir()
    shutil.move(data / "keys", target / "keys")  # the live key store, moved as the docs say
    report = _admin(capsys, target, "restore", str(backup_file))
    assert report["host_config"].startswith("restored from the backup")
    restored = load_host_config(target)
    assert restored.admission.mode == "manual" and restored.default_token_ttl_s == 5_400
    assert restored.resource == "https://memory.example.com/mcp"
    assert stat.S_IMODE((target / "host.json").stat().st_mode) == 0o600


def test_a_forget_after_the_backup_reaches_the_restored_copy_and_leaves_no_text(
    data: Path, capsys: Capture
) -> None:
    # The Done-when test of issue 12, embedded: back up, forget, restore the backup beside the
    # same key store: the forgotten record is unreadable and unsearchable, and its text is in
    # no file of the restored data directory nor of the original.
    text = "Forget later: the vault combination is zanzibar-quokka-77."
    forgotten = _captured(data, text, "operator-cli-key-0055", admit=True)
    kept = _captured(
        data, "Kept: the lunch rota is on the fridge.", "operator-cli-key-0056", admit=True
    )
    records = {r["candidate_id"]: r["record_id"] for r in _admin(capsys, data, "records", "list")}
    record_id = records[forgotten]
    assert _search(data, "zanzibar quokka") == [record_id]
    shelf = data.parent / "shelf"
    shelf.mkdir()
    backup_file = shelf / "engram.backup"
    _admin(capsys, data, "backup", str(backup_file))
    needles = [b"zanzibar", b"quokka", text.encode()]
    assert _files_holding(shelf, needles) == []  # the backup holds the body sealed

    forget = _admin(capsys, data, "records", "forget", record_id, "--reason", "obsolete")
    assert forget["receipt"]["to_state"] == "tombstoned"

    target = data.parent / "restored"
    target.mkdir()
    shutil.copytree(data / "keys", target / "keys")
    report = _admin(capsys, target, "restore", str(backup_file))
    assert report["records"] == 2 and report["records_without_key"] == 1
    assert report["projected"] == 1  # only the record whose key still exists

    assert _search(target, "zanzibar quokka") == []
    assert _search(target, "lunch rota fridge") == [records[kept]]
    assert _agent(target, "get", {"record_id": record_id})["error"]["code"] == "NOT_FOUND"
    shown = _admin(capsys, target, "records", "show", record_id)
    assert shown["record"] is None  # not even the operator can read it
    index = _admin(capsys, target, "status")["index"]
    assert index["fresh"] is True and index["current_records_without_key"] == 1
    exported = data.parent / "restored-export.jsonl"
    assert main(["admin", "export", "--data-dir", str(target), "--output", str(exported)]) == 0
    capsys.readouterr()
    assert [
        json.loads(line)["record"]["record_id"] for line in exported.read_text().splitlines()
    ] == [records[kept]]
    exported.unlink()
    assert _files_holding(target, needles) == []
    assert _files_holding(data, needles) == []
    assert _files_holding(shelf, needles) == []


def test_a_data_directory_from_before_sealed_bodies_is_sealed_when_opened(
    data: Path, capsys: Capture
) -> None:
    _captured(
        data, "Legacy: the old wiki lives at wiki-heliotrope.", "operator-cli-key-0057", admit=True
    )
    (record,) = _admin(capsys, data, "records", "list")
    host = open_embedded(data)
    try:
        row = host.store.record_get(host.store.scopes()[0], record["record_id"])
        assert row is not None
        plaintext = host.engine.bodies(host.store.scopes()[0], [row])[record["record_id"]]
    finally:
        host.close()
    conn = sqlite3.connect(data / "engram.db")  # as a version before sealed bodies wrote it
    conn.execute(
        "UPDATE records SET body = ? WHERE record_id = ?",
        (
            json.dumps(plaintext, sort_keys=True, separators=(",", ":")).encode(),
            record["record_id"],
        ),
    )
    conn.commit()
    conn.close()

    shown = _admin(capsys, data, "records", "show", record["record_id"])
    assert (
        shown["record"]["components"][0]["text"] == "Legacy: the old wiki lives at wiki-heliotrope."
    )
    raw = sqlite3.connect(data / "engram.db").execute("SELECT body FROM records").fetchone()[0]
    assert raw.startswith(b"erb1") and b"heliotrope" not in raw
    assert _search(data, "wiki heliotrope") == [record["record_id"]]


def test_restore_refuses_a_target_with_memories_or_a_foreign_key_store(
    data: Path, capsys: Capture
) -> None:
    _captured(data, "Refuse: a memory.", "operator-cli-key-0030", admit=True)
    backup_file = _backed_up(data, capsys)
    _admin(capsys, data, "restore", str(backup_file), code=1)
    assert "RESTORE_REFUSED" in (line := _one_line_error(capsys)) and "holds memories" in line
    foreign = data.parent / "foreign"
    _initialised(foreign, capsys)
    _admin(capsys, foreign, "restore", str(backup_file), code=1)
    assert "RESTORE_REFUSED" in (line := _one_line_error(capsys)) and "not the backup's" in line
    assert _admin(capsys, foreign, "records", "list") == []


def test_restore_without_keys_needs_new_keys_and_says_what_was_lost(
    data: Path, capsys: Capture
) -> None:
    _captured(data, "New keys: the record survives.", "operator-cli-key-0040", admit=True)
    _captured(data, "New keys: the pending note does not.", "operator-cli-key-0041", admit=False)
    backup_file = _backed_up(data, capsys)
    target = data.parent / "bare"
    _admin(capsys, target, "restore", str(backup_file), code=1)
    assert "no key store" in _one_line_error(capsys)
    assert not target.exists()
    report = _admin(capsys, target, "restore", str(backup_file), "--new-keys")
    assert report["new_key_store"] is True and report["pending_candidates_without_key"] == 1
    # Record bodies are sealed under keys that are never in a backup: on new keys the journal
    # and the records' digests come back, their text does not.
    assert report["records"] == 1 and report["records_without_key"] == 1
    assert report["projected"] == 0 and _search(target, "record survives") == []


def test_restore_with_new_keys_adopts_a_key_store_that_holds_no_key_yet(
    data: Path, capsys: Capture
) -> None:
    # A key store `init` made (or a --new-keys restore killed after making it) protects nothing:
    # restoring onto it with --new-keys again is allowed, not refused as another's key store.
    _captured(data, "Fresh keys: the journal comes back.", "operator-cli-key-0042", admit=True)
    backup_file = _backed_up(data, capsys)
    target = data.parent / "initialised"
    _initialised(target, capsys)
    report = _admin(capsys, target, "restore", str(backup_file), "--new-keys")
    assert report["new_key_store"] is True and report["records_without_key"] == 1
    shutil.rmtree(target)
    shutil.copytree(data / "keys", target / "keys")  # a key store holding keys: not adopted
    _admin(capsys, target, "restore", str(backup_file), "--new-keys")  # its own: restored
    assert _admin(capsys, target, "status")["key_store"]["health"] == "ok"


def test_a_withdraw_after_the_backup_reaches_the_restored_copy(data: Path, capsys: Capture) -> None:
    draft = _captured(
        data, "Withdrawn later: a secret-ish draft.", "operator-cli-key-0050", admit=False
    )
    backup_file = _backed_up(data, capsys)
    _admin(capsys, data, "pending", "withdraw", draft, "--reason", "mistake")
    target = data.parent / "restored"
    target.mkdir()
    shutil.copytree(data / "keys", target / "keys")
    report = _admin(capsys, target, "restore", str(backup_file))
    assert report["pending_candidates_without_key"] == 1
    _admin(capsys, target, "pending", "show", draft, code=1)
    assert "BLOB_MISSING" in _one_line_error(capsys)
    # status names the candidate that no longer opens, and fails (exit 1)
    assert (
        main(["admin", "status", "--data-dir", str(target), "--operator", "ops-carol", "--json"])
        == 1
    )
    health = json.loads(capsys.readouterr().out)["key_store"]
    assert health["health"] == "keys_missing"
    assert health["unreadable"] == [{"candidate_id": draft, "code": "BLOB_MISSING"}]


def _admission(data: Path, candidate_id: str, key: str) -> dict[str, Any]:
    """The agent's request_admission of ``candidate_id``, in process; its envelope."""
    host = open_embedded(data)
    try:
        args = {"candidate_id": candidate_id, "idempotency_key": key}
        envelope: dict[str, Any] = handled(host.engine, "request_admission", args, _ctx())
    finally:
        host.close()
    return envelope


def _restored_beside_the_keys(capsys: Capture, data: Path, backup_file: Path) -> Path:
    """``backup_file`` restored into a fresh data directory beside a copy of ``data``'s keys/
    (a restore on the same host, as docs/operating.md says)."""
    target = data.parent / "restored"
    target.mkdir()
    shutil.copytree(data / "keys", target / "keys")
    _admin(capsys, target, "restore", str(backup_file))
    return target


def test_a_capture_pending_at_the_backup_and_admitted_after_opens_after_a_restore(
    data: Path, capsys: Capture
) -> None:
    # Issue 24: admission destroyed the candidate's key, so the backup's pending candidate
    # answered BLOB_MISSING after a restore although its capture was acknowledged before it.
    text = "Admitted later: the standup moved to 9:40."
    pending = _captured(data, text, "operator-cli-key-0058", admit=False)
    backup_file = _backed_up(data, capsys)
    _admin(capsys, data, "adjudicate", pending, "accept", "--reason", "checked")
    (record,) = _admin(capsys, data, "records", "list")

    target = _restored_beside_the_keys(capsys, data, backup_file)
    assert _admin(capsys, target, "status")["key_store"]["health"] == "ok"
    shown = _admin(capsys, target, "pending", "show", pending)
    assert shown["record"]["components"][0]["text"] == text
    admitted = _admission(target, pending, "operator-cli-key-0058-admit")
    assert admitted["output"]["value"]["outcome"]["record_id"] == record["record_id"]
    got = _agent(target, "get", {"record_id": record["record_id"]})
    assert got["output"]["value"]["record"]["components"][0]["text"] == text
    assert main(["verify", "--data-dir", str(target)]) == 0


@pytest.mark.parametrize("ending", ["forget", "reject"])
def test_a_capture_forgotten_or_rejected_after_the_backup_stays_unreadable_after_a_restore(
    data: Path, capsys: Capture, ending: str
) -> None:
    # Keeping the admitted candidate's key must not bring a forgotten record back through the
    # candidate the backup holds: forget destroys the candidate's key with the record's. A
    # rejection destroys both keys at once (a rejected capture may hold a secret).
    text = "Shredded later: the alarm code is walrus-pelican-31."
    if ending == "reject":
        assert main(["admin", "policy", "set", "--data-dir", str(data), "--mode", "manual"]) == 0
    pending = _captured(data, text, "operator-cli-key-0059", admit=ending == "reject")
    capsys.readouterr()
    shelf = data.parent / "shelf"
    shelf.mkdir()
    backup_file = shelf / "engram.backup"
    _admin(capsys, data, "backup", str(backup_file))
    if ending == "forget":
        _admin(capsys, data, "adjudicate", pending, "accept", "--reason", "checked")
        (record,) = _admin(capsys, data, "records", "list")
        _admin(capsys, data, "records", "forget", record["record_id"], "--reason", "obsolete")
    else:
        _admin(capsys, data, "adjudicate", pending, "reject", "--reason", "holds a secret")

    target = _restored_beside_the_keys(capsys, data, backup_file)
    _admin(capsys, target, "pending", "show", pending, code=1)
    assert "BLOB_MISSING" in _one_line_error(capsys)
    refused = _admission(target, pending, "operator-cli-key-0059-again")
    assert refused["error"]["code"] == "BLOB_MISSING"
    assert _admin(capsys, target, "records", "list") == []
    needles = [b"walrus", b"pelican", text.encode()]
    for directory in (target, data, shelf):
        assert _files_holding(directory, needles) == []


def test_a_damaged_backup_is_invalid_and_changes_nothing(data: Path, capsys: Capture) -> None:
    _captured(data, "Damaged: a memory.", "operator-cli-key-0060", admit=True)
    backup_file = _backed_up(data, capsys)
    conn = sqlite3.connect(backup_file)
    # Every event's hash replaced (the store keeps a digest as its 32 bytes): the chain breaks.
    conn.execute("UPDATE journal_events SET event_hash = zeroblob(32)")
    conn.commit()
    conn.close()
    target = data.parent / "restored"
    target.mkdir()
    shutil.copytree(data / "keys", target / "keys")
    _admin(capsys, target, "restore", str(backup_file), code=1)
    assert "BACKUP_INVALID" in (line := _one_line_error(capsys)) and "journal" in line
    assert sorted(path.name for path in target.iterdir()) == ["keys"]
    (data.parent / "garbage").write_bytes(b"not a database at all")
    _admin(capsys, target, "restore", str(data.parent / "garbage"), code=1)
    assert "BACKUP_INVALID" in _one_line_error(capsys)


# -- tokens ------------------------------------------------------------------------------------------


def _mint(data: Path, capsys: Capture, principal: str) -> str:
    assert (
        main(
            [
                "token",
                "--data-dir",
                str(data),
                "--principal",
                principal,
                "--workspace",
                "default",
                "--purpose",
                "purpose:general",
                "--tools",
                "search,get",
            ]
        )
        == 0
    )
    return capsys.readouterr().out.strip()


def _search_with(data: Path, token: str) -> dict[str, Any]:
    config = load_host_config(data).serving_on("127.0.0.1", 8765)
    claims = local_verifier(data, config).verify(token)
    ctx = context_from_claims(claims, audit_id=new_audit_id(), host=config, raw_token=token)
    host = open_embedded(data)
    try:
        envelope: dict[str, Any] = handled(
            host.engine, "search", {"query": "anything", "purpose_ref": "purpose:general"}, ctx
        )
        return envelope
    finally:
        host.close()


def test_tokens_revoke_by_token_and_by_principal(data: Path, capsys: Capture) -> None:
    alice, bob = _mint(data, capsys, "agent-alice"), _mint(data, capsys, "agent-bob")
    assert _search_with(data, alice)["ok"] and _search_with(data, bob)["ok"]
    revoked = _admin(capsys, data, "tokens", "revoke", "--token", alice)
    assert revoked["revoked"] == "token"
    assert _search_with(data, alice)["error"]["code"] == "AUTHORIZATION_REVOKED"
    assert _search_with(data, bob)["ok"]
    _admin(capsys, data, "tokens", "revoke", "--principal", "agent-bob")
    assert _search_with(data, bob)["error"]["code"] == "AUTHORIZATION_REVOKED"
    assert alice not in (data / "audit.log").read_text()
    assert main(["admin", "tokens", "revoke", "--data-dir", str(data), "--token", "x.y"]) == 2
    assert "not a token" in _one_line_error(capsys)


def _refusal(capsys: Capture, data: Path, *words: str) -> str:
    assert main(["admin", *words, "--data-dir", str(data)]) == 1
    return _one_line_error(capsys)


def test_operator_not_found_says_which_and_why(toured: Path, capsys: Capture) -> None:
    record_id = _admin(capsys, toured, "records", "list")[0]["record_id"]
    assert "not-an-id is not a record id (mem_" in _refusal(
        capsys, toured, "records", "show", "not-an-id"
    )
    assert f"no record {record_id}x in any workspace" in _refusal(
        capsys, toured, "records", "history", record_id + "x"
    )
    assert (
        f"record {record_id} is not in workspace research: it is in workspace default"
        " (add --workspace default)"
    ) in _refusal(
        capsys, toured, "records", "dispute", record_id, "--workspace", "research", "--reason", "r"
    )
    assert "is not a candidate id" in _refusal(capsys, toured, "pending", "show", record_id)


def test_a_mistyped_workspace_is_named_not_shown_empty(toured: Path, capsys: Capture) -> None:
    _mint(toured, capsys, "agent-fay")  # its workspace: default
    assert (
        main(["admin", "records", "list", "--data-dir", str(toured), "--workspace", "defualt"]) == 0
    )
    out, err = capsys.readouterr()
    assert out.strip() == "no records"
    assert "no records, captures or tokens in workspace defualt; known: default" in err
    assert main(["admin", "records", "list", "--data-dir", str(toured)]) == 0
    assert "workspace" not in capsys.readouterr().err


def test_a_token_minted_just_after_its_principal_is_revoked_works(
    data: Path, capsys: Capture
) -> None:
    # Early in a second, so the revocation and the new token share it: a whole-second `iat`
    # would read as "issued before the revocation".
    time.sleep(1.05 - time.time() % 1)
    _admin(capsys, data, "tokens", "revoke", "--principal", "agent-dora")
    later = _mint(data, capsys, "agent-dora")
    assert _search_with(data, later)["ok"]


def test_revoking_a_token_twice_keeps_the_first_time(data: Path, capsys: Capture) -> None:
    token = _mint(data, capsys, "agent-erin")
    first = _admin(capsys, data, "tokens", "revoke", "--token", token)
    again = _admin(capsys, data, "tokens", "revoke", "--token", token)
    assert again["at"] == first["at"] and again["already_revoked"] is True
    assert "already_revoked" not in first
    assert main(["admin", "tokens", "revoke", "--data-dir", str(data), "--token", token]) == 0
    assert f"already revoked at {first['at']}" in capsys.readouterr().out


def test_the_banner_shows_the_token_lifetime_from_host_json(tmp_path: Path) -> None:
    out = io.StringIO()
    print_banner(
        out,
        url="http://127.0.0.1:8765/mcp",
        token="t",
        data_dir=tmp_path,
        port=8765,
        token_ttl_s=5_400,
    )
    assert "The token expires in 1 h 30 min (default_token_ttl_s in" in out.getvalue()
    assert "they are for its address: no --port needed" in out.getvalue()
    assert describe_lifetime(86_400) == "1 d" and describe_lifetime(45) == "45 s"


# -- keys rotate ---------------------------------------------------------------------------------


def test_keys_rotate_keeps_old_tokens_until_they_expire_and_rewraps_data_keys(
    data: Path, capsys: Capture
) -> None:
    before = _mint(data, capsys, "agent-alice")
    pending = _captured(data, "Rotation: a pending note.", "operator-cli-key-0070", admit=False)
    _captured(data, "Rotation: an admitted record.", "operator-cli-key-0071", admit=True)
    master_before = (data / "keys" / "master.key").read_bytes()
    report = _admin(capsys, data, "keys", "rotate")
    # Both candidates' keys: an admitted one's stays until its record is forgotten.
    assert report["data_keys_rewrapped"] == 2 and report["data_keys_unbound"] == 0
    assert (data / "keys" / "master.key").read_bytes() != master_before
    assert not (data / "keys" / "master.key.next").exists()
    after = _mint(data, capsys, "agent-alice")
    kid = jwt.get_unverified_header
    assert kid(before)["kid"] == report["issuer_key"]["previous_kid"]
    assert kid(after)["kid"] == report["issuer_key"]["kid"] != kid(before)["kid"]
    assert _search_with(data, before)["ok"] and _search_with(data, after)["ok"]
    shown = _admin(capsys, data, "pending", "show", pending)
    assert shown["record"]["components"][0]["text"] == "Rotation: a pending note."
    # The record's body opens under the new master key: its scope key was re-wrapped.
    (record,) = _admin(capsys, data, "records", "list")
    shown = _admin(capsys, data, "records", "show", record["record_id"])
    assert shown["record"]["components"][0]["text"] == "Rotation: an admitted record."
    assert "master.key" not in json.dumps(report) and master_before.hex() not in json.dumps(report)


def test_a_rotation_stopped_half_way_is_finished_on_the_next_open(
    data: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    pending = _captured(data, "Half-way: a pending note.", "operator-cli-key-0080", admit=False)

    def crash(_staged: Path, _master: Path) -> None:
        raise OSError(5, "simulated crash before the new master key is in place")

    monkeypatch.setattr("engram_memory.embedded.rotation._install", crash)
    assert main(["admin", "keys", "rotate", "--data-dir", str(data)]) == 1
    capsys.readouterr()
    assert (data / "keys" / "master.key.next").exists()
    monkeypatch.undo()
    shown = _admin(capsys, data, "pending", "show", pending)  # the open finishes the rotation
    assert shown["record"]["components"][0]["text"] == "Half-way: a pending note."
    assert not (data / "keys" / "master.key.next").exists()


def test_a_staged_master_key_the_key_file_never_adopted_is_discarded(
    data: Path, capsys: Capture
) -> None:
    pending = _captured(data, "Discarded: a pending note.", "operator-cli-key-0090", admit=False)
    (data / "keys" / "master.key.next").write_bytes(b"\x01" * 32)
    shown = _admin(capsys, data, "pending", "show", pending)
    assert shown["record"]["components"][0]["text"] == "Discarded: a pending note."
    assert not (data / "keys" / "master.key.next").exists()

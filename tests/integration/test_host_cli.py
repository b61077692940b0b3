"""The host's command line: init, token, and the operations plane (audit, policy, adjudicate)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from test_operator_cli import _captured, _ctx, data

from engram_memory.binding.host_config import HostConfig
from engram_memory.binding.tokens import context_from_claims
from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import open_embedded
from engram_memory.embedded.host_file import load_host_config
from engram_memory.embedded.issuer_keys import local_verifier
from engram_memory.engine.context import TOOLS

from engram_testing import handled

Capture = pytest.CaptureFixture[str]

__all__ = ["data"]  # the operator CLI tests' fixture, re-used


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _assert_one_line_error(capsys: Capture, *fragments: str) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("engram-memory: error: ")
    assert "Traceback" not in captured.err
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


# --------------------------------------------------------------------------------------------
# init
# --------------------------------------------------------------------------------------------


def test_init_creates_every_private_file_once_and_records_the_resource(
    tmp_path: Path, capsys: Capture
) -> None:
    data = tmp_path / "data"
    resource = "https://memory.example/mcp"
    assert main(["init", "--data-dir", str(data), "--resource", resource]) == 0
    out = capsys.readouterr().out
    assert str(data.resolve()) in out and resource in out
    keys = data / "keys"
    files = ["master.key", "cursor.key", "issuer-ed25519.pem", "candidate-keys.db"]
    before = {name: (keys / name).read_bytes() for name in files}
    assert main(["init", "--data-dir", str(data)]) == 0
    assert {name: (keys / name).read_bytes() for name in files} == before  # keys never replaced
    assert _mode(data) == 0o700 and _mode(keys) == 0o700
    for name in files:
        assert _mode(keys / name) == 0o600
    assert _mode(data / "host.json") == 0o600 and _mode(data / "audit.log") == 0o600
    assert (data / "engram.db").exists()
    assert load_host_config(data).resource == resource  # kept by the second init


def test_init_keeps_an_existing_host_json_and_only_updates_the_resource(
    tmp_path: Path, capsys: Capture
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "host.json").write_text(
        json.dumps({"tenant_id": "acme", "admission": {"mode": "manual"}})
    )
    assert main(["init", "--data-dir", str(data), "--resource", "http://127.0.0.1:9000/mcp"]) == 0
    config = load_host_config(data)
    assert (config.tenant_id, config.admission.mode) == ("acme", "manual")
    assert config.resource == "http://127.0.0.1:9000/mcp"


def test_init_with_an_invalid_resource_exits_2_and_creates_nothing(
    tmp_path: Path, capsys: Capture
) -> None:
    data = tmp_path / "data"
    assert main(["init", "--data-dir", str(data), "--resource", "not a url"]) == 2
    _assert_one_line_error(capsys, "--resource")
    assert not data.exists()


def test_commands_report_an_invalid_host_json_in_one_line(data: Path, capsys: Capture) -> None:
    (data / "host.json").write_text('{"admission": {"mode": "sometimes"}}')
    assert main(["admin", "policy", "show", "--data-dir", str(data)]) == 2
    _assert_one_line_error(capsys, "host.json", "admission.mode")


# --------------------------------------------------------------------------------------------
# token
# --------------------------------------------------------------------------------------------


def _token_args(data: Path, *extra: str) -> list[str]:
    return [
        "token",
        "--data-dir",
        str(data),
        "--principal",
        "agent-bob",
        "--workspace",
        "ws-research",
        "--purpose",
        "purpose:general",
        *extra,
    ]


def test_token_prints_exactly_one_token_that_verifies(data: Path, capsys: Capture) -> None:
    args = _token_args(
        data,
        "--tools",
        "search,get,capture",
        "--confirm",
        "capture",
        "--expires-in",
        "120",
        "--agent-id",
        "agent-7",
    )
    assert main(args) == 0
    captured = capsys.readouterr()
    (note,) = captured.err.splitlines()  # no server runs: the default address, said
    assert "no server is serving" in note and "127.0.0.1:8765" in note
    lines = captured.out.splitlines()
    assert len(lines) == 1 and captured.out == lines[0] + "\n"
    config = load_host_config(data)
    claims = local_verifier(data, config).verify(lines[0])
    assert claims.audience == config.resource and claims.issuer == config.issuer
    assert claims.expires_at - claims.issued_at == 120
    ctx = context_from_claims(claims, audit_id="aud_t", host=config)
    assert (ctx.tenant_id, ctx.workspace_id, ctx.principal) == ("local", "ws-research", "agent-bob")
    assert ctx.purpose_ref == "purpose:general" and ctx.agent_id == "agent-7"
    assert ctx.grants == frozenset({"search", "get", "capture"})
    assert ctx.confirm_required == frozenset({"capture"})


def test_token_uses_the_host_resource_tenant_and_default_lifetime(
    tmp_path: Path, capsys: Capture
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "host.json").write_text(json.dumps({"tenant_id": "acme", "default_token_ttl_s": 900}))
    assert main(["init", "--data-dir", str(data), "--resource", "https://m.example/mcp"]) == 0
    capsys.readouterr()
    assert main(_token_args(data, "--tools", ",".join(TOOLS))) == 0
    token = capsys.readouterr().out.strip()
    config = load_host_config(data)
    claims = local_verifier(data, config).verify(token)
    assert claims.audience == "https://m.example/mcp" and claims.tenant_id == "acme"
    assert claims.expires_at - claims.issued_at == 900
    assert context_from_claims(claims, audit_id="a", host=config).grants == frozenset(TOOLS)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--tools", "search,delete"], "delete"),
        (["--tools", ""], "--tools"),
        (["--tools", "search", "--confirm", "capture"], "capture"),
        (["--tools", "search", "--expires-in", "0"], "--expires-in"),
        (["--tools", "search", "--expires-in", "soon"], "--expires-in"),
        ([], "--tools"),
    ],
)
def test_token_refuses_bad_input_in_one_line_with_exit_code_2(
    data: Path, capsys: Capture, extra: list[str], fragment: str
) -> None:
    assert main(_token_args(data, *extra)) == 2
    _assert_one_line_error(capsys, fragment)


def test_token_needs_an_initialised_data_directory(tmp_path: Path, capsys: Capture) -> None:
    missing = tmp_path / "missing"
    assert main(_token_args(missing, "--tools", "search")) == 2
    _assert_one_line_error(capsys, "engram-memory init")
    assert not missing.exists()


# --------------------------------------------------------------------------------------------
# admin policy
# --------------------------------------------------------------------------------------------


def test_policy_set_manual_is_saved_and_shown(data: Path, capsys: Capture) -> None:
    assert main(["admin", "policy", "show", "--data-dir", str(data)]) == 0
    assert "admission mode: auto" in capsys.readouterr().out
    assert main(["admin", "policy", "set", "--data-dir", str(data), "--mode", "manual"]) == 0
    assert "manual (was auto)" in capsys.readouterr().out
    assert main(["admin", "policy", "show", "--data-dir", str(data)]) == 0
    shown = capsys.readouterr().out
    assert "admission mode: manual" in shown and "policy version: builtin-1:" in shown
    assert load_host_config(data).admission.mode == "manual"
    assert open_embedded_policy_mode(data) == "manual"


def open_embedded_policy_mode(data: Path) -> str:
    host = open_embedded(data)
    try:
        return host.config.admission_policy().mode
    finally:
        host.close()


def test_policy_set_refuses_an_unknown_mode(data: Path, capsys: Capture) -> None:
    assert main(["admin", "policy", "set", "--data-dir", str(data), "--mode", "maybe"]) == 2
    _assert_one_line_error(capsys, "--mode")
    assert load_host_config(data) == HostConfig()


# --------------------------------------------------------------------------------------------
# admin audit
# --------------------------------------------------------------------------------------------


def test_audit_lists_the_tour_calls_without_content(tmp_path: Path, capsys: Capture) -> None:
    data = tmp_path / "data"
    assert main(["tour", "--data-dir", str(data), "--yes"]) == 0
    capsys.readouterr()
    assert main(["admin", "audit", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["auditId", "time", "principal", "tool", "outcome", "violation"]
    rows = [line.split() for line in lines[1:-1]]
    assert {row[5] for row in rows} == {"-"}  # the tour's calls break no schema
    entries = [json.loads(line) for line in (data / "audit.log").read_text().splitlines()]
    assert len(rows) == len(entries) >= 6
    assert {row[3] for row in rows} == set(TOOLS)
    assert all(row[0].startswith("aud_") and row[2] == "tour-agent" for row in rows)
    assert {"OK", "NOT_FOUND"} <= {row[4] for row in rows}
    assert "WAL" not in out and "Tour" not in out and "sha256:" not in out


def test_audit_shows_only_the_most_recent_entries(tmp_path: Path, capsys: Capture) -> None:
    data = tmp_path / "data"
    assert main(["tour", "--data-dir", str(data), "--yes"]) == 0
    capsys.readouterr()
    assert main(["admin", "audit", "--data-dir", str(data), "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    last = json.loads((data / "audit.log").read_text().splitlines()[-1])
    assert len(lines) == 4 and lines[2].split()[0] == last["audit_id"]
    assert main(["admin", "audit", "--data-dir", str(data), "--limit", "0"]) == 2
    _assert_one_line_error(capsys, "--limit")


def test_audit_neutralises_terminal_escapes_in_a_principal(data: Path, capsys: Capture) -> None:
    entry = {
        "audit_id": "aud_x",
        "at": "t",
        "principal": "evil\x1b[2J",
        "tool": "get",
        "code": "OK",
    }
    (data / "audit.log").write_text(json.dumps(entry) + "\nnot json\n")
    assert main(["admin", "audit", "--data-dir", str(data)]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out and "evil?[2J" in captured.out
    assert "1 unreadable line" in captured.err


# --------------------------------------------------------------------------------------------
# admin adjudicate
# --------------------------------------------------------------------------------------------


def test_adjudicating_an_unknown_candidate_exits_1_with_a_readable_message(
    data: Path, capsys: Capture
) -> None:
    assert main(["admin", "adjudicate", "--data-dir", str(data), "cand_missing", "accept"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    (line,) = captured.err.splitlines()
    assert "NOT_FOUND: cand_missing is not a candidate id" in line


def test_adjudicate_refuses_an_unknown_decision(data: Path, capsys: Capture) -> None:
    assert main(["admin", "adjudicate", "--data-dir", str(data), "cand_x", "maybe"]) == 2
    _assert_one_line_error(capsys, "decision")


def _held_candidate(data: Path, text: str, key: str) -> str:
    candidate_id = _captured(data, text, key, admit=False)
    host = open_embedded(data)
    try:
        admission = {"candidate_id": candidate_id, "idempotency_key": f"{key}-admit"}
        held = handled(host.engine, "request_admission", admission, _ctx())
        assert held["output"]["value"]["outcome"]["status"] == "pending_adjudication"
        return candidate_id
    finally:
        host.close()


def test_an_operator_accepts_and_rejects_candidates_held_in_manual_mode(
    data: Path, capsys: Capture
) -> None:
    pytest.importorskip("engram_memory.operator_plane.decisions")
    assert main(["admin", "policy", "set", "--data-dir", str(data), "--mode", "manual"]) == 0
    kept = _held_candidate(
        data, "Releases are cut from the main branch on Tuesdays.", "adjudicate-key-000001"
    )
    dropped = _held_candidate(
        data, "A draft note the operator will reject.", "adjudicate-key-000002"
    )
    capsys.readouterr()

    adjudicate = [
        "admin",
        "adjudicate",
        "--data-dir",
        str(data),
        "--operator",
        "ops-carol",
        "--json",
    ]
    assert main([*adjudicate, kept, "accept"]) == 0
    accepted = json.loads(capsys.readouterr().out)
    assert accepted["status"] == "accepted" and accepted["candidate_id"] == kept
    assert main([*adjudicate, dropped, "reject"]) == 0
    rejected = json.loads(capsys.readouterr().out)
    assert rejected["status"] == "rejected" and "record_id" not in rejected

    host = open_embedded(data)
    try:
        got = handled(
            host.engine,
            "get",
            {"record_id": accepted["record_id"], "purpose_ref": "purpose:general"},
            _ctx(),
        )
    finally:
        host.close()
    assert got["ok"] is True
    # A candidate that is no longer pending cannot be adjudicated again the other way.
    assert main([*adjudicate, dropped, "accept"]) == 1
    assert "failed" in capsys.readouterr().err

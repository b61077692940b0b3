"""The command line as a person meets it (issue 24, item 4): the command a message names runs as
typed, text for people by default and the JSON documents with ``--json``, the approvals shown as
the page shows them, one-line errors for what does not exist or is decided already, and progress
on a terminal."""

# ruff: noqa: S603 - every subprocess runs this environment's own engram-memory

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engram_memory.adapters.local.approval_book import ApprovalBook
from engram_memory.contract.types import format_instant
from engram_memory.embedded.book_channel import EmbeddedApprovals
from engram_memory.embedded.cli import main
from engram_memory.embedded.composition import init_data_dir, open_embedded
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.gate import Approval, ConfirmationNeeded, ConfirmationRequest
from engram_memory.mcp_surface.approval_channel import Question
from engram_memory.operator_plane import text

from engram_testing import capture_args, context, forget_request, handled

Capture = pytest.CaptureFixture[str]
SCRIPT = Path(sys.executable).parent / "engram-memory"  # the installed console script
VENV_HOME = Path(sys.executable).parents[2]  # where the README's set-up leaves .venv
NOTE = "Releases are cut on Tuesdays after the freeze."


def _without_venv_on_path() -> dict[str, str]:
    """The environment of a shell after the README's set-up: .venv/bin is not on PATH."""
    return {**os.environ, "PATH": "/usr/bin:/bin"}


def _run(*words: str, cwd: Path = VENV_HOME) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *words],
        cwd=cwd,
        env=_without_venv_on_path(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ctx() -> TrustedContext:
    return context(
        principal="agent-alice", tenant="local", workspace="default", purpose="purpose:general"
    )


def _admitted(data: Path, note: str = NOTE) -> tuple[str, str]:
    """A record an agent captured and had admitted: (candidate id, record id)."""
    host = open_embedded(data)
    try:
        now_ms = int(time.time() * 1000)
        args = capture_args(note, key="usability-key-00001", valid_from=now_ms - 60_000)
        captured: dict[str, Any] = handled(host.engine, "capture", args, _ctx())
        candidate_id: str = captured["output"]["value"]["candidate_id"]
        handled(
            host.engine,
            "request_admission",
            {"candidate_id": candidate_id, "idempotency_key": "usability-key-00001-admit"},
            _ctx(),
        )
        (record,) = host.store.records_list(Scope("local", "default"), None, "", 10)
        return candidate_id, record.record_id
    finally:
        host.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """An initialised data directory, as `init` leaves it."""
    init_data_dir(tmp_path / "data")
    return tmp_path / "data"


def test_the_command_a_message_names_runs_as_typed(tmp_path: Path) -> None:
    """After ./run, .venv/bin is not on PATH: a message naming a bare ``engram-memory`` would
    send the operator to a command that does not exist."""
    data = tmp_path / "data"
    made = _run("init", "--data-dir", str(data))
    assert made.returncode == 0, made.stderr
    named = re.search(r"Mint a bearer token: (.+?) token --data-dir", made.stdout)
    assert named is not None, made.stdout
    command = shlex.split(named.group(1))
    assert command != ["engram-memory"]
    ran = subprocess.run(
        [*command, "approvals", "list", "--data-dir", str(data)],
        cwd=VENV_HOME,
        env=_without_venv_on_path(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    # an error's next step names the same command, and it runs too
    missing = _run("approvals", "list", "--data-dir", str(tmp_path / "nothing-here"))
    assert missing.returncode != 0 and len(missing.stderr.strip().splitlines()) == 1
    assert f"run `{named.group(1)} init --data-dir" in missing.stderr
    assert not (tmp_path / "nothing-here").exists()


def test_admin_prints_text_by_default_and_the_same_json_with_json(
    data: Path, capsys: Capture
) -> None:
    _, record_id = _admitted(data)
    assert main(["admin", "records", "list", "--data-dir", str(data)]) == 0
    shown = capsys.readouterr().out
    header, row = shown.splitlines()
    assert header.split() == ["record", "state", "valid", "from", "body"]
    assert record_id in row and "accepted_current" in row
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", row)  # ISO-8601 UTC
    assert not re.search(r"\b\d{13}\b", shown)  # never epoch milliseconds
    assert main(["admin", "records", "list", "--data-dir", str(data), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["record_id"] == record_id and isinstance(listed["valid_from"], int)
    assert listed["valid_from_at"] == format_instant(listed["valid_from"])
    assert main(["admin", "status", "--data-dir", str(data)]) == 0
    status = capsys.readouterr().out
    assert "health: ok" in status and not status.lstrip().startswith("{")


def test_approvals_list_shows_what_the_human_decides_on(data: Path, capsys: Capture) -> None:
    _, record_id = _admitted(data)
    book = ApprovalBook(data)
    asked = book.open(
        forget_request(record_id, scope=Scope("local", "default")),
        agent_id="agent-7",
        session_id=None,
        now_ms=int(time.time() * 1000),
    )
    book.close()
    assert main(["approvals", "list", "--data-dir", str(data)]) == 0
    listed = capsys.readouterr().out
    assert asked.approval_id in listed
    assert "permanently forget this memory record" in listed  # the operation
    assert NOTE in listed  # the memory's text, as the page shows it
    assert "Requested by: alice" in listed and "Agent: agent-7" in listed
    assert re.search(r"Time left: \d+ min", listed)
    assert asked.secret not in listed
    assert main(["approvals", "list", "--data-dir", str(data), "--json"]) == 0
    (question,) = json.loads(capsys.readouterr().out)
    assert question["approval_id"] == asked.approval_id and NOTE in question["summary"]
    assert question["expires_at"].endswith("Z") and question["seconds_left"] > 0


def test_approvals_list_without_a_data_directory_is_an_error(
    tmp_path: Path, capsys: Capture
) -> None:
    assert main(["approvals", "list", "--data-dir", str(tmp_path / "none")]) != 0
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no Engram Memory data directory" in line


def test_answering_an_unknown_approval_names_it(data: Path, capsys: Capture) -> None:
    assert main(["approvals", "approve", "--data-dir", str(data), "apr_nope"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no approval apr_nope" in line


def test_revoking_an_unknown_token_id_is_an_error(data: Path, capsys: Capture) -> None:
    mint = ["token", "--data-dir", str(data), "--principal", "bot", "--workspace", "default"]
    assert main([*mint, "--purpose", "general", "--tools", "search"]) == 0
    token = capsys.readouterr().out.strip()
    revoke = ["admin", "tokens", "revoke", "--data-dir", str(data)]
    assert main([*revoke, "--token-id", "tok-never-minted"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "no token with id tok-never-minted" in line
    import jwt

    token_id = jwt.decode(token, options={"verify_signature": False})["jti"]
    assert main([*revoke, "--token-id", token_id]) == 0
    assert f"token: {token_id}" in capsys.readouterr().out


def test_a_token_id_beginning_with_a_dash_is_revoked(
    data: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids minted before the ``tok_`` prefix were bare URL-safe base64: 1 in 64 began with "-",
    which argparse read as a flag, and the revoke failed while the token kept working."""
    import jwt

    from engram_memory.binding import tokens

    mint = ["token", "--data-dir", str(data), "--principal", "bot", "--workspace", "default"]
    assert main([*mint, "--purpose", "general", "--tools", "search"]) == 0
    assert jwt.decode(capsys.readouterr().out.strip(), options={"verify_signature": False})[
        "jti"
    ].startswith("tok_")
    monkeypatch.setattr(tokens, "_token_id", lambda: "-dashed_id")
    assert main([*mint, "--purpose", "general", "--tools", "search"]) == 0
    capsys.readouterr()
    revoke = ["admin", "tokens", "revoke", "--data-dir", str(data), "--token-id", "-dashed_id"]
    assert main(revoke) == 0
    assert "token: -dashed_id" in capsys.readouterr().out


def test_answering_a_decided_candidate_says_when(data: Path, capsys: Capture) -> None:
    candidate_id, _ = _admitted(data)
    adjudicate = ["admin", "adjudicate", "--data-dir", str(data), candidate_id]
    assert main([*adjudicate, "reject", "--reason", "late"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.search(r"already decided \(accepted at \d{4}-\d\d-\d\dT", line), line
    assert "DIGEST_CONFLICT" not in line


def test_restore_without_keys_says_what_the_docs_say(
    data: Path, tmp_path: Path, capsys: Capture
) -> None:
    _admitted(data)
    backup = tmp_path / "backup.db"
    assert main(["admin", "backup", str(backup), "--data-dir", str(data)]) == 0
    capsys.readouterr()
    assert main(["admin", "restore", str(backup), "--data-dir", str(tmp_path / "new")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "move the live keys/ folder" in line
    operating = (Path(__file__).parents[2] / "docs" / "operating.md").read_text()
    assert "Move the live `keys/`" in operating and "copy the original keys" not in line


def test_long_operations_show_progress_on_a_terminal_only(data: Path, tmp_path: Path) -> None:
    import pty

    _admitted(data)

    def backup(target: str, *extra: str) -> str:
        master, terminal = pty.openpty()
        try:
            done = subprocess.run(
                [
                    str(SCRIPT),
                    "admin",
                    "backup",
                    str(tmp_path / target),
                    "--data-dir",
                    str(data),
                    *extra,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=terminal,
                timeout=120,
                check=True,
            )
            os.close(terminal)
            seen = b""
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the terminal's other end is closed: all read
                    break
                if not chunk:
                    break
                seen += chunk
            assert done.stdout
            return seen.decode()
        finally:
            os.close(master)

    assert "backup: 1 records checked in default" in backup("one.db")
    assert backup("two.db", "--json") == ""
    # not a terminal: nothing on stderr
    piped = _run("admin", "backup", str(tmp_path / "three.db"), "--data-dir", str(data))
    assert piped.returncode == 0 and piped.stderr == ""


def test_the_progress_bar_writes_only_to_a_terminal() -> None:
    class Terminal:
        def __init__(self, tty: bool) -> None:
            self.tty, self.written = tty, ""

        def isatty(self) -> bool:
            return self.tty

        def write(self, chunk: str) -> int:
            self.written += chunk
            return len(chunk)

        def flush(self) -> None:
            pass

    for tty, enabled, expected in ((True, True, True), (False, True, False), (True, False, False)):
        stream = Terminal(tty)
        shown = text.Progress("export", stream, enabled=enabled)  # type: ignore[arg-type]
        stop = text.watching(shown)
        text.progress(3, 10, "records exported")
        stop()
        text.progress(4, 10, "records exported")  # nobody watches any more
        shown.close()
        shown_line = "export [#######.................]  30%  3/10 records exported"
        assert (shown_line in stream.written) is expected
        assert "4/10" not in stream.written
    counter = Terminal(True)
    text.Progress("restore", counter)(5, None, "pages")  # type: ignore[arg-type]
    assert "restore: 5 pages" in counter.written


def test_records_history_shows_who_did_each_step_and_why(data: Path, capsys: Capture) -> None:
    _, record_id = _admitted(data)
    step = ["--data-dir", str(data), "--operator", "ops-carol"]
    assert (
        main(["admin", "records", "dispute", record_id, *step, "--reason", "source doubted"]) == 0
    )
    assert main(["admin", "records", "forget", record_id, *step, "--reason", "asked to"]) == 0
    capsys.readouterr()
    assert main(["admin", "records", "history", record_id, "--data-dir", str(data), "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    assert [(e["operation"], e["actor"], e["reason"]) for e in history] == [
        ("capture", "agent-alice", None),
        ("admit", "agent-alice", None),
        ("dispute", "operator:ops-carol", "source doubted"),
        ("tombstone", "operator:ops-carol", "asked to"),
    ]
    assert main(["admin", "records", "history", record_id, "--data-dir", str(data)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    columns = ["cursor", "at", "operation", "target", "by", "reason", "approved by"]
    assert re.split(r"\s{2,}", header) == columns
    assert "operator:ops-carol" in rows[-1] and rows[-1].split()[-3:] == ["asked", "to", "-"]


Answer = Callable[[EmbeddedApprovals, ConfirmationRequest, Question], Approval | None]


def _approved_in_the_book(
    data: Path, tool: str, arguments: dict[str, Any], answer: Answer
) -> dict[str, Any]:
    """An agent's ``tool`` call asked through the data directory's approval book, answered by
    ``answer``, then retried with that answer: the retry's envelope."""
    host = open_embedded(data)
    channel = EmbeddedApprovals(
        lambda: ApprovalBook(data), lambda: host.engine, base_url=None, clock=host.engine.clock
    )
    try:
        needed = host.engine.handle(tool, arguments, _ctx())
        assert isinstance(needed, ConfirmationNeeded)
        question = channel.ask(needed.request, _ctx(), "terminal")
        approval = answer(channel, needed.request, question)
        assert approval is not None
        retried = host.engine.handle(tool, arguments, _ctx(), approval)
        assert not isinstance(retried, ConfirmationNeeded)
        return retried
    finally:
        channel.close()
        host.close()


def _from_terminal(data: Path) -> Answer:
    def answer(
        channel: EmbeddedApprovals, request: ConfirmationRequest, question: Question
    ) -> Approval | None:
        words = ["approvals", "approve", "--data-dir", str(data), "--operator", "ops-dana"]
        assert main([*words, question.approval_id]) == 0
        given = channel.given(request)  # the agent's retry finds the terminal's answer
        return given if isinstance(given, Approval) else None

    return answer


def _in_the_form(
    channel: EmbeddedApprovals, _request: ConfirmationRequest, question: Question
) -> Approval | None:
    given = channel.answer(question, True)  # the client's form, as the MCP surface records it
    return given if isinstance(given, Approval) else None


def test_records_history_names_the_agents_reason_and_who_approved(
    data: Path, capsys: Capture
) -> None:
    """Issue 38, item 2: a forget approved at the terminal and a withdraw answered in the
    client's form show the agent's reason_ref and the approver, as JSON and as the table."""
    _, record_id = _admitted(data)
    forget = {
        "record_id": record_id,
        "idempotency_key": "usability-forget-00001",
        "reason_ref": "reason:user-asked",
    }
    assert _approved_in_the_book(data, "forget", forget, _from_terminal(data))["ok"]
    host = open_embedded(data)
    try:
        args = capture_args("A draft nobody needs.", key="usability-draft-00001")
        captured = handled(host.engine, "capture", args, _ctx())
    finally:
        host.close()
    draft = captured["output"]["value"]["candidate_id"]
    withdraw = {
        "candidate_id": draft,
        "idempotency_key": "usability-withdraw-0001",
        "reason_ref": "reason:draft-abandoned",
    }
    assert _approved_in_the_book(data, "withdraw", withdraw, _in_the_form)["ok"]
    capsys.readouterr()

    shown = ["--data-dir", str(data), "--json"]
    assert main(["admin", "records", "history", record_id, *shown]) == 0
    last = json.loads(capsys.readouterr().out)[-1]
    assert (last["operation"], last["actor"], last["reason"], last["approved_by"]) == (
        "tombstone",
        "agent-alice",
        "reason:user-asked",
        "operator:ops-dana at the terminal",
    )
    assert main(["admin", "records", "history", draft, *shown]) == 0
    last = json.loads(capsys.readouterr().out)[-1]
    assert (last["operation"], last["reason"], last["approved_by"]) == (
        "withdraw",
        "reason:draft-abandoned",
        "form answered by the client",
    )
    assert main(["admin", "records", "history", record_id, "--data-dir", str(data)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[-3:] == ["reason", "approved", "by"]
    assert rows[-1].endswith("reason:user-asked  operator:ops-dana at the terminal")


def test_the_banner_names_the_command_the_way_it_was_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    from engram_memory.embedded.serve import print_banner
    from engram_memory.operator_plane.commands import command_name

    monkeypatch.chdir(VENV_HOME)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "serve"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    relative = command_name()
    assert (VENV_HOME / relative).resolve() == SCRIPT.resolve() and "/" in relative
    out = io.StringIO()
    print_banner(out, url="http://127.0.0.1:8765/mcp", token="t", data_dir=tmp_path, port=8765)
    assert f"`{relative} token --help`" in out.getvalue()
    assert f'"command": "{SCRIPT}"' in out.getvalue()  # the desktop host's: absolute
    monkeypatch.setenv("PATH", str(SCRIPT.parent))  # activated: the bare name is this program
    assert command_name() == "engram-memory"
    monkeypatch.setattr(sys, "argv", ["/somewhere/pytest"])  # not started as engram-memory
    assert command_name() == "engram-memory"

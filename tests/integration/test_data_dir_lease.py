"""One owner per data directory (issue 24), against real ``engram-memory serve`` processes.

A running server holds the data directory's lease (a ``flock``, dropped by the kernel however the
process ends). A second server, ``admin keys rotate`` and ``admin restore`` into that directory
are refused in one line naming the server's PID, and write nothing; the read-only commands work
beside it; revocations, policy changes and adjudications made from the terminal reach the running
server at its next call. The rotate-while-serving sequence of the issue loses nothing.
"""

from __future__ import annotations

# ruff: noqa: S603 - every subprocess runs this environment's own engram-memory or python
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_serve_day_one import DEADLINE_S, engram, free_port, init, serving, token, wait_until

from engram_memory.mcp_surface.catalog import TOOL_NAMES

from engram_testing import capture_args

PURPOSE = "purpose:general"
ALL_TOOLS = "search,get,capture,request_admission"


# -- helpers ------------------------------------------------------------------------------------


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """``engram-memory ARGV...`` in a subprocess."""
    return subprocess.run(
        [engram(), *argv], capture_output=True, text=True, timeout=DEADLINE_S, check=False
    )


def admin(data: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return run("admin", *words, "--data-dir", str(data))


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@contextlib.contextmanager
def served(data: Path, port: int) -> Iterator[subprocess.Popen[str]]:
    with serving([engram(), "serve", "--data-dir", str(data), "--port", str(port)], port) as p:
        yield p


def agent_token(data: Path, port: int, principal: str = "agent-lease") -> str:
    return token(data, "--port", str(port), principal=principal, purpose=PURPOSE, tools=ALL_TOOLS)


@contextlib.asynccontextmanager
async def mcp_client(port: int, bearer: str) -> AsyncIterator[Client]:
    """The official client over streamable HTTP, under a deadline."""
    with anyio.fail_after(DEADLINE_S):
        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {bearer}"},
            timeout=httpx2.Timeout(30, read=DEADLINE_S),
        ) as http:
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
            async with Client(transport, mode="legacy") as client:
                yield client


async def call(port: int, bearer: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tool call in its own client connection; the result envelope."""
    async with mcp_client(port, bearer) as client:
        result = await client.call_tool(TOOL_NAMES[tool], arguments)
    envelope = result.structured_content
    assert isinstance(envelope, dict), result
    return envelope


def tool(port: int, bearer: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return anyio.run(call, port, bearer, name, arguments)


def capture(port: int, bearer: str, text: str) -> str:
    key = "lease-" + hashlib.sha256(text.encode()).hexdigest()[:24]
    envelope = tool(port, bearer, "capture", capture_args(text, key=key, purpose=PURPOSE))
    assert envelope["ok"], envelope
    candidate_id: str = envelope["output"]["value"]["candidate_id"]
    return candidate_id


def admit(port: int, bearer: str, candidate_id: str) -> dict[str, Any]:
    arguments = {"candidate_id": candidate_id, "idempotency_key": f"admit-{candidate_id}"}
    return tool(port, bearer, "request_admission", arguments)


def admitted(port: int, bearer: str, candidate_id: str) -> str:
    envelope = admit(port, bearer, candidate_id)
    assert envelope["ok"], envelope
    outcome = envelope["output"]["value"]["outcome"]
    assert outcome["status"] == "accepted", outcome
    record_id: str = outcome["record_id"]
    return record_id


def get_text(port: int, bearer: str, record_id: str) -> str:
    envelope = tool(port, bearer, "get", {"record_id": record_id, "purpose_ref": PURPOSE})
    assert envelope["ok"], envelope
    text: str = envelope["output"]["value"]["record"]["components"][0]["text"]
    return text


def found(port: int, bearer: str, query: str) -> list[str]:
    envelope = tool(port, bearer, "search", {"query": query, "purpose_ref": PURPOSE})
    assert envelope["ok"], envelope
    return [packet["record"]["record_id"] for packet in envelope["output"]["value"]["records"]]


def key_files(data: Path) -> dict[str, bytes]:
    """The key files a rotation replaces."""
    keys = data / "keys"
    return {
        name: (keys / name).read_bytes()
        for name in ("master.key", "issuer-ed25519.pem")
        if (keys / name).exists()
    }


# -- the lease ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stdio", [False, True], ids=["http", "stdio"])
def test_a_second_server_on_the_same_data_directory_is_refused_naming_the_first(
    tmp_path: Path, stdio: bool
) -> None:
    data = tmp_path / "data"
    init(data)
    with served(data, free_port()) as first:
        argv = ["serve", "--data-dir", str(data), "--port", str(free_port())]
        second = subprocess.run(
            [engram(), *argv, *(["--stdio"] if stdio else [])],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            input="",
        )
        assert first.poll() is None  # the first one serves on
    assert second.returncode == 1
    assert second.stdout == ""  # no banner, no token
    line = one_line(second)
    assert f"PID {first.pid}" in line and str(data.resolve()) in line, line


def test_the_lease_goes_with_a_killed_server(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    init(data)
    with served(data, port) as first:
        first.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the flock
        first.wait(timeout=DEADLINE_S)
    with served(data, free_port()) as second:
        assert second.poll() is None
    assert admin(data, "keys", "rotate").returncode == 0


def test_a_reader_beside_a_rotation_under_way_leaves_its_staged_key_alone(
    tmp_path: Path,
) -> None:
    """The open of a process that does not own the directory never finishes (or undoes) a
    rotation: beside a rotation under way, the staged master key is that rotation's own."""
    data = tmp_path / "data"
    init(data)
    staged = data / "keys" / "master.key.next"
    staged.write_bytes(os.urandom(32))  # what a rotation stages before it re-wraps the key file
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib\n"
            "from engram_memory.embedded.data_dir_lease import acquire_lease\n"
            f"lease = acquire_lease(pathlib.Path({str(data)!r}), 'a rotation')\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert admin(data, "pending", "list").returncode == 0  # opens the data directory
        assert staged.exists()
        refused = admin(data, "keys", "rotate")
        assert refused.returncode == 1
        assert f"a rotation (PID {holder.pid})" in one_line(refused)
    finally:
        holder.communicate("", timeout=DEADLINE_S)
    assert admin(data, "pending", "list").returncode == 0  # now the owner: it finishes it
    assert not staged.exists()


# -- operator commands beside a running server --------------------------------------------------


def test_restore_into_the_served_directory_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """A served directory that holds no memories yet passes every other check of a restore; the
    restore would replace the database under the server, which would write on into the file
    it has open, unlinked: every later capture lost."""
    data, port = tmp_path / "data", free_port()
    init(data)
    backup = tmp_path / "engram.backup"
    with served(data, port) as server:
        assert admin(data, "backup", str(backup)).returncode == 0  # read-only: works alongside
        before = sorted(path.name for path in data.iterdir())
        refused = admin(data, "restore", str(backup))
        assert refused.returncode == 1
        line = one_line(refused)
        assert f"PID {server.pid}" in line and "nothing was changed" in line, line
        assert sorted(path.name for path in data.iterdir()) == before
        bearer = agent_token(data, port)
        capture(port, bearer, "Restore refused: the server serves on.")
    listed = admin(data, "pending", "list")
    assert listed.returncode == 0 and "candidate_" in listed.stdout  # the capture was kept


def test_read_only_commands_work_beside_a_running_server(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    init(data)
    with served(data, port):
        bearer = agent_token(data, port)
        candidate = capture(port, bearer, "Beside the server: a pending note.")
        for words in (
            ["status"],
            ["audit"],
            ["records", "list"],
            ["pending", "list"],
            ["pending", "show", candidate],
        ):
            done = admin(data, *words)
            assert done.returncode == 0, (words, done.stderr)
        assert run("verify", "--data-dir", str(data), "--workspace", "default").returncode == 0
        assert run("approvals", "list", "--data-dir", str(data)).returncode == 0


def test_an_import_beside_a_running_server_is_served_at_once(tmp_path: Path) -> None:
    """``admin import`` writes through the engine's commits, as ``adjudicate`` does: no lease,
    and what it admits is found through the running server."""
    data, port = tmp_path / "data", free_port()
    init(data)
    source = tmp_path / "memory.jsonl"
    entity = {"type": "entity", "name": "Lisbon", "entityType": "city",
              "observations": ["Imported beside a running server"]}  # fmt: skip
    source.write_text(json.dumps(entity) + "\n", encoding="utf-8")
    with served(data, port):
        bearer = agent_token(data, port)
        captured = capture(port, bearer, "Written by the agent while the import runs.")
        done = admin(
            data, "import", str(source), "--format", "mcp-memory", "--principal", "importer",
            "--purpose", PURPOSE, "--json",
        )  # fmt: skip
        assert done.returncode == 0 and json.loads(done.stdout)["accepted"] == 1, done.stderr
        assert found(port, bearer, "imported beside running server")
        assert admitted(port, bearer, captured)


def test_what_the_terminal_changes_reaches_the_running_server_at_its_next_call(
    tmp_path: Path,
) -> None:
    data, port = tmp_path / "data", free_port()
    init(data)
    with served(data, port):
        bearer = agent_token(data, port)
        # policy set: the next admission is decided under the new mode, without a restart
        assert admin(data, "policy", "set", "--mode", "manual").returncode == 0
        waiting = capture(port, bearer, "Live policy: this one waits for a person.")
        outcome = admit(port, bearer, waiting)["output"]["value"]["outcome"]
        assert outcome["status"] != "accepted", outcome
        # adjudicate: the operator's decision is what the server reads next
        assert admin(data, "adjudicate", waiting, "accept").returncode == 0
        (record_id,) = found(port, bearer, "waits for a person")
        assert get_text(port, bearer, record_id) == "Live policy: this one waits for a person."
        assert admin(data, "policy", "set", "--mode", "auto").returncode == 0
        admitted(port, bearer, capture(port, bearer, "Live policy: accepted again."))
        # tokens revoke: the revoked principal's next request is a 401 that says so
        assert admin(data, "tokens", "revoke", "--principal", "agent-lease").returncode == 0
        refused = httpx2.post(
            f"http://127.0.0.1:{port}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Authorization": f"Bearer {bearer}", "Accept": "application/json"},
            timeout=10,
        )
        assert refused.status_code == 401 and "revoked" in refused.json()["error_description"]


def test_rotating_keys_while_serving_is_refused_and_loses_nothing(tmp_path: Path) -> None:
    """The issue's sequence: serve, capture A, rotate, capture B, restart, admit A and B."""
    data, port = tmp_path / "data", free_port()
    init(data)
    keys_before = key_files(data)
    with served(data, port) as server:
        bearer = agent_token(data, port)
        a = capture(port, bearer, "Captured before the rotation: the first of two memories.")
        refused = admin(data, "keys", "rotate")
        assert refused.returncode == 1
        line = one_line(refused)
        assert f"the server (PID {server.pid}) holds {data.resolve()}" in line, line
        assert "admin keys rotate" in line and "nothing was changed" in line, line
        assert key_files(data) == keys_before  # nothing written: neither key replaced
        assert not (data / "keys" / "master.key.next").exists()
        b = capture(port, bearer, "Written while keys rotate, B is admitted after the restart.")
    with served(data, port):
        record_a, record_b = admitted(port, bearer, a), admitted(port, bearer, b)
        c = capture(port, bearer, "Rotation while serving: candidate C, kept pending.")
    # With the server stopped, the rotation runs, and everything opens afterwards.
    rotated = admin(data, "keys", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert key_files(data)["master.key"] != keys_before["master.key"]
    with served(data, port):
        assert (
            get_text(port, bearer, record_a)
            == "Captured before the rotation: the first of two memories."
        )
        assert (
            get_text(port, bearer, record_b)
            == "Written while keys rotate, B is admitted after the restart."
        )
        assert admitted(port, bearer, c)
    for health in (
        admin(data, "status", "--full"),
        run("verify", "--data-dir", str(data), "--workspace", "default", "--full"),
    ):
        assert health.returncode == 0, health.stderr
    wait_until(lambda: not (data / "lease.lock").exists(), "the last server let its lease go")

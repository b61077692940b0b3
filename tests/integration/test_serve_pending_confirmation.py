"""A server whose tool call waits on an unanswered confirmation still stops promptly.

A withdraw asks its human through a form elicitation (CONTRACT.md §8, 2025-11-25: on the
request's own stream) and waits, shielded, for as long as the question lives (300 s), so that a
late answer still reaches the approval book. SIGTERM (HTTP and stdio) or stdin closing (stdio)
must not wait for that: the server stops within a bound generous for a loaded machine, the store
and the key file are closed (their write-ahead logs checkpointed and truncated) and the question
stays open in the book for the page, the terminal and the client's retry.

Real parts: the ``engram-memory`` console script in a subprocess, the official ``mcp`` client
whose elicitation callback never answers.
"""

from __future__ import annotations

# ruff: noqa: S603 - every subprocess runs this environment's own engram-memory
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client, MCPError
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from test_serve_day_one import engram, free_port, init, listening, token

from engram_memory.adapters.local.approval_book import FILE_NAME as APPROVALS_FILE
from engram_memory.mcp_surface.catalog import TOOL_NAMES

from engram_testing import capture_args

pytestmark = pytest.mark.anyio

STOP_BOUND_S = 20.0  # the question lives 300 s; a loaded machine stops well within this
START_DEADLINE_S = 60.0
WORKSPACE = "default"
PURPOSE = "purpose:shutdown"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _token(data_dir: Path, *extra: str) -> str:
    return token(
        data_dir,
        *extra,
        principal="shutdown-agent",
        workspace=WORKSPACE,
        purpose=PURPOSE,
        tools="capture,withdraw",
    )


def _wal_bytes(database: Path) -> int:
    wal = database.with_name(database.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def _open_questions(data_dir: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(data_dir / APPROVALS_FILE)) as db:
        rows = db.execute("SELECT approval_id FROM approvals WHERE state = 'pending'")
        return [row[0] for row in rows]


class SilentHuman:
    """An elicitation callback that is asked and never answers."""

    def __init__(self) -> None:
        self.asked = anyio.Event()

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def _capture_arguments() -> dict[str, Any]:
    arguments: dict[str, Any] = capture_args(
        "The release checklist lives in docs/release.md.",
        key="capture-shutdown-1",
        valid_from=int(time.time() * 1000) - 60_000,
        purpose=PURPOSE,
    )
    return arguments


def _withdraw_arguments(captured: dict[str, Any]) -> dict[str, Any]:
    return {
        "candidate_id": captured["output"]["value"]["candidate_id"],
        "idempotency_key": "withdraw-shutdown-1",
        "reason_ref": "reason:captured-by-mistake",
    }


async def _withdraw_until_asked(
    client: Client, human: SilentHuman, tg: anyio.abc.TaskGroup
) -> list[types.CallToolResult | BaseException]:
    """Capture a candidate, then withdraw it in the background until the human is asked; the
    list receives the withdraw's outcome (a result, or what the client raised)."""
    captured = await client.call_tool(TOOL_NAMES["capture"], _capture_arguments())
    assert isinstance(captured.structured_content, dict), captured
    withdraw = _withdraw_arguments(captured.structured_content)
    outcome: list[types.CallToolResult | BaseException] = []

    async def pending_withdraw() -> None:
        try:
            outcome.append(await client.call_tool(TOOL_NAMES["withdraw"], withdraw))
        except Exception as error:
            outcome.append(error)

    tg.start_soon(pending_withdraw)
    with anyio.fail_after(START_DEADLINE_S):
        await human.asked.wait()
    return outcome


async def _stops_within(stopped: Callable[[], bool], bound_s: float) -> bool:
    """Did ``stopped`` come true within ``bound_s`` seconds?"""
    with anyio.move_on_after(bound_s):
        while not stopped():
            await anyio.sleep(0.05)
        return True
    return False


def _assert_closed_cleanly(data_dir: Path) -> None:
    assert _wal_bytes(data_dir / "engram.db") == 0
    assert _wal_bytes(data_dir / "keys" / "candidate-keys.db") == 0
    # The question was not answered: it stays open for the page, the terminal and the retry.
    assert len(_open_questions(data_dir)) == 1


async def test_sigterm_stops_an_http_server_waiting_on_a_confirmation(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    init(data)
    bearer = _token(data, "--port", str(port))
    process = subprocess.Popen(
        [engram(), "serve", "--data-dir", str(data), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with anyio.fail_after(START_DEADLINE_S):
            while not listening(port):
                assert process.poll() is None, process.communicate()
                await anyio.sleep(0.1)
        human = SilentHuman()
        async with httpx2.AsyncClient(
            headers={"Authorization": f"Bearer {bearer}"}, timeout=httpx2.Timeout(120)
        ) as http:
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
            client = Client(transport, mode="legacy", elicitation_callback=human)
            async with client, anyio.create_task_group() as tg:
                outcome = await _withdraw_until_asked(client, human, tg)
                process.send_signal(signal.SIGTERM)
                stopped = await _stops_within(lambda: process.poll() is not None, STOP_BOUND_S)
                tg.cancel_scope.cancel()
        assert stopped, f"still serving {STOP_BOUND_S} s after SIGTERM"
        assert process.returncode == 0, process.communicate()[1]
        # Woken as shutdown began, the call answers CANCELLED (retriable) when that answer
        # reaches the client before its stream closes; else the client sees the server go.
        # Never anything else: the withdraw was not approved.
        (answer,) = outcome
        if isinstance(answer, types.CallToolResult):
            assert answer.structured_content is not None
            assert answer.structured_content["error"]["code"] == "CANCELLED"
            assert answer.structured_content["error"]["retriable"] is True
        else:
            assert isinstance(answer, MCPError), answer
        assert not listening(port)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    _assert_closed_cleanly(data)


class StdioHost:
    """A desktop host's side of ``serve --stdio``: JSON-RPC lines on the server's pipes, stdin
    kept open until the host closes it (the SDK's client closes it as soon as the server's
    stdout ends, which would hide a server that waits for stdin)."""

    def __init__(self, data: Path, bearer: str, errlog: Any) -> None:
        self.process = subprocess.Popen(
            [engram(), "serve", "--stdio", "--data-dir", str(data)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            text=True,
            env={**os.environ, "ENGRAM_TOKEN": bearer},
        )

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the server closed its stdout"
        message: dict[str, Any] = json.loads(line)
        return message

    def call(self, request_id: int, tool: str, arguments: dict[str, Any]) -> None:
        params = {"name": TOOL_NAMES[tool], "arguments": arguments}
        self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


@pytest.mark.parametrize("stop", ["sigterm", "stdin-closed"])
def test_a_stdio_server_waiting_on_a_confirmation_stops(tmp_path: Path, stop: str) -> None:
    data = tmp_path / "data"
    init(data)
    bearer = _token(data)
    with (tmp_path / "stderr.log").open("w", encoding="utf-8") as errlog:
        host = StdioHost(data, bearer, errlog)
        try:
            capabilities: dict[str, Any] = {"elicitation": {"form": {}}}
            client_info = {"name": "shutdown-test", "version": "1"}
            host.send(
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": capabilities,
                        "clientInfo": client_info,
                    },
                }
            )
            assert host.receive()["result"]["protocolVersion"] == "2025-11-25"
            host.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            host.call(2, "capture", _capture_arguments())
            captured = host.receive()["result"]["structuredContent"]
            assert captured["ok"], captured
            host.call(3, "withdraw", _withdraw_arguments(captured))
            assert host.receive()["method"] == "elicitation/create"  # asked; never answered
            if stop == "sigterm":
                host.process.send_signal(signal.SIGTERM)
            else:
                assert host.process.stdin is not None
                host.process.stdin.close()
            try:
                host.process.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still serving {STOP_BOUND_S} s after {stop}")
            assert host.process.returncode == 0, (tmp_path / "stderr.log").read_text()
        finally:
            if host.process.poll() is None:
                host.process.kill()
                host.process.wait()
    _assert_closed_cleanly(data)


async def test_the_http_apps_lifespan_wakes_the_waiting_calls_when_it_ends(
    tmp_path: Path,
) -> None:
    """Any ASGI server (not only ``serve``'s, which wakes them as its shutdown begins): the app's
    lifespan wakes the waits before the SDK's session manager waits for its sessions."""
    from engram_memory.embedded.serve import open_server
    from engram_memory.mcp_surface.transports import http_app

    server = open_server(tmp_path / "data")
    try:
        app = http_app(server.surface, bind_host="127.0.0.1").app
        waiting = anyio.CancelScope()
        server.surface._waits.add(waiting)  # a call waiting on its human
        async with app.router.lifespan_context(app):
            assert not waiting.cancel_called
        assert waiting.cancel_called
        assert server.surface._stopping  # and no call starts a wait after it
    finally:
        server.close()

"""``serve --stdio`` on every kind of stdin a client may give it: a pipe and a socket (read on
the event loop), a terminal and a regular file (read by a thread). Each is served; SIGTERM stops
the server while the client holds stdin open; a pipe or socket the server switched to
non-blocking mode is blocking again once it has stopped (the mode belongs to the file, which
the client's side shares).

Real parts: the ``engram-memory`` console script in a subprocess, raw JSON-RPC lines.
"""

from __future__ import annotations

# ruff: noqa: S603 - every subprocess runs this environment's own engram-memory
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
from test_serve_day_one import DEADLINE_S, engram, init, token

from engram_testing import PURPOSE, capture_args, initialize_request

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def _line(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


@contextmanager
def _server(
    data: Path, stdin: Any, stdout: Any, errlog: IO[str], *, may_capture: bool = False
) -> Iterator[subprocess.Popen[bytes]]:
    bearer = token(data, purpose=PURPOSE, tools="capture") if may_capture else token(data)
    process = subprocess.Popen(
        [engram(), "serve", "--stdio", "--data-dir", str(data)],
        stdin=stdin,
        stdout=stdout,
        stderr=errlog,
        env={**os.environ, "ENGRAM_TOKEN": bearer},
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@contextmanager
def _client_ends(kind: str) -> Iterator[tuple[int, int, int, int]]:
    """(the server's stdin, the server's stdout, the client's write end, the client's read
    end), all open in this process until the end: the server's ends are shared with it."""
    if kind == "socket":  # one socket for both, as some launchers give
        near, far = socket.socketpair()
        ends = (far.fileno(), far.fileno(), near.fileno(), near.fileno())
        try:
            yield ends
        finally:
            near.close()
            far.close()
        return
    if kind == "terminal":
        client_in, server_in = os.openpty()
    else:
        server_in, client_in = os.pipe()
    client_out, server_out = os.pipe()
    try:
        yield server_in, server_out, client_in, client_out
    finally:
        for fd in (server_in, server_out, client_in, client_out):
            os.close(fd)


def _read_line(fd: int) -> dict[str, Any]:
    got = bytearray()
    while not got.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        assert chunk, f"the server closed its stdout after {bytes(got)!r}"
        got.extend(chunk)
    message: dict[str, Any] = json.loads(got)
    return message


@pytest.mark.parametrize("kind", ["pipe", "socket", "terminal"])
def test_sigterm_stops_a_stdio_server_whose_client_holds_stdin_open(
    tmp_path: Path, kind: str
) -> None:
    data = tmp_path / "data"
    init(data)
    with (
        (tmp_path / "stderr.log").open("w", encoding="utf-8") as errlog,
        _client_ends(kind) as (server_in, server_out, client_in, client_out),
        _server(data, server_in, server_out, errlog) as process,
    ):
        os.write(client_in, _line(initialize_request("stdio-ends")))
        assert _read_line(client_out)["result"]["protocolVersion"] == "2025-11-25"
        os.write(client_in, _line(INITIALIZED) + _line(LIST_TOOLS))
        assert {tool["name"] for tool in _read_line(client_out)["result"]["tools"]}
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a server on a {kind} still serving {DEADLINE_S} s after SIGTERM")
        assert process.returncode == 0, (tmp_path / "stderr.log").read_text()
        assert os.get_blocking(server_in) and os.get_blocking(server_out)


def _capture(call_id: int, key: str) -> dict[str, Any]:
    now_ms = int(time.time() * 1000)
    arguments = capture_args(f"Release {call_id} ships on a Tuesday.", key=key, valid_from=now_ms)
    params = {"name": "engram_memory_capture", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": params}


def test_sigterm_during_a_call_lets_the_call_finish_then_stops(tmp_path: Path) -> None:
    """The stdio server runs a call's engine work on its main thread; a SIGTERM that arrives
    while a capture waits for the store's write lock (held here, as another process would) is
    held until the capture has committed, and only then stops the server. Raised at once, it
    would cut the capture as the lock came free: rolled back, no candidate."""
    data = tmp_path / "data"
    init(data)
    with (
        (tmp_path / "stderr.log").open("w", encoding="utf-8") as errlog,
        _client_ends("pipe") as (server_in, server_out, client_in, client_out),
        _server(data, server_in, server_out, errlog, may_capture=True) as process,
    ):
        os.write(client_in, _line(initialize_request("stdio-held-stop")))
        assert _read_line(client_out)["result"]["protocolVersion"] == "2025-11-25"
        os.write(client_in, _line(INITIALIZED) + _line(_capture(2, "held-stop-000000000001")))
        answer = _read_line(client_out)
        assert answer.get("result", {}).get("structuredContent", {}).get("ok") is True, answer
        store = sqlite3.connect(data / "engram.db", isolation_level=None)
        try:
            store.execute("BEGIN IMMEDIATE")  # the second capture waits for this lock
            os.write(client_in, _line(_capture(3, "held-stop-000000000002")))
            time.sleep(1.0)  # it reads, seals, and blocks on BEGIN IMMEDIATE within ms
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert process.poll() is None, "the server stopped with a call still waiting"
        finally:
            store.execute("ROLLBACK")
            store.close()
        try:
            process.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server still ran {DEADLINE_S} s after its call finished")
        assert process.returncode == 0, (tmp_path / "stderr.log").read_text()
    store = sqlite3.connect(data / "engram.db")
    try:
        (candidates,) = store.execute("SELECT count(*) FROM candidates").fetchone()
    finally:
        store.close()
    assert candidates == 2  # the call the stop arrived in committed its candidate


def test_a_regular_file_as_stdin_is_answered_line_by_line_until_its_end(tmp_path: Path) -> None:
    """Each line is answered, and the server stops at the end of the file. (Only answers that
    cannot race the end: the SDK cancels the calls still running when stdin ends.)"""
    data = tmp_path / "data"
    init(data)
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(_line(initialize_request("stdio-file")) + b"not json\n[1, 2]\n")
    with (
        (tmp_path / "stderr.log").open("w", encoding="utf-8") as errlog,
        requests.open("rb") as stdin,
        _server(data, stdin, subprocess.PIPE, errlog) as process,
    ):
        out, _ = process.communicate(timeout=DEADLINE_S)
    assert process.returncode == 0, (tmp_path / "stderr.log").read_text()
    answers = [json.loads(line) for line in out.splitlines()]
    assert len(answers) == 3, answers
    assert [a["result"]["protocolVersion"] for a in answers if "result" in a] == ["2025-11-25"]
    assert sorted(a["error"]["code"] for a in answers if "error" in a) == [-32700, -32600]

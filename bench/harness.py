"""The benchmarks' one harness for starting servers and connecting clients.

Every benchmark that talks to a server starts and reaches it through here, so that each is a
thin module on what it measures:

- ``engram_cli`` — this environment's ``engram-memory`` console script;
- ``mint_token`` — a bearer token from a data directory's own issuer (as ``engram-memory token``);
- ``stdio_session`` — the official client over stdio to any server command (ours or a peer's);
- ``serve_in_thread`` and ``http_session`` — the embedded server behind uvicorn in this process,
  and the official client over Streamable HTTP;
- ``running_server`` — ``engram-memory serve`` as its own process (what an operator runs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx2

START_DEADLINE_S = 90.0  # a loaded machine takes seconds to open a data directory
STOP_DEADLINE_S = 30.0
LOOPBACK = "127.0.0.1"


def engram_cli() -> str:
    """The ``engram-memory`` console script beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "engram-memory"
    found = str(beside) if beside.exists() else shutil.which("engram-memory")
    if found is None:
        raise RuntimeError("the engram-memory console script is not installed in this environment")
    return found


def mint_token(
    data_dir: Path,
    *,
    principal: str,
    workspace: str,
    purpose: str,
    tools: Sequence[str] | None = None,
    confirm: Sequence[str] = (),
    port: int | None = None,
    expires_in_s: int = 86_400,
) -> str:
    """A bearer token from ``data_dir``'s own issuer (every tool unless ``tools``; ``confirm``:
    the tools a human confirms); with ``port``, for the resource the server serves on that port
    (its audience follows it)."""
    from engram_memory.embedded.host_file import load_host_config
    from engram_memory.embedded.issuer_keys import local_issuer
    from engram_memory.engine.context import TOOLS

    config = load_host_config(data_dir)
    if port is not None:
        config = config.serving_on(LOOPBACK, port)
    return local_issuer(data_dir, config).mint(
        principal=principal,
        tenant_id=config.tenant_id,
        workspace_id=workspace,
        purpose_ref=purpose,
        tools=tuple(tools) if tools is not None else TOOLS,
        confirm=tuple(confirm),
        expires_in_s=expires_in_s,
    )


@contextlib.asynccontextmanager
async def stdio_session(params: Any, errlog: Path | TextIO) -> AsyncIterator[Any]:
    """The official client over stdio to ``params`` (``mcp.StdioServerParameters``), the
    server's stderr into ``errlog`` (a file path, or an open file)."""
    from mcp import Client
    from mcp.client.stdio import stdio_client

    with contextlib.ExitStack() as files:
        log = (
            files.enter_context(errlog.open("w", encoding="utf-8"))
            if isinstance(errlog, Path)
            else errlog
        )
        async with Client(stdio_client(params, errlog=log), mode="legacy") as client:
            yield client


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serve_in_thread(data_dir: Path, **engine_options: Any) -> Iterator[tuple[str, Any]]:
    """The embedded MCP server (``open_server``) behind uvicorn on a free loopback port, in a
    background thread of this process; yields (url, server)."""
    import uvicorn

    from engram_memory.embedded.serve import open_server
    from engram_memory.mcp_surface.transports import MCP_PATH

    server = open_server(data_dir, **engine_options)
    app = server.http_app(bind_host=LOOPBACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((LOOPBACK, 0))
    port = sock.getsockname()[1]
    http = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning"))
    thread = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not http.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the embedded MCP HTTP server did not start")
            time.sleep(0.02)
        yield f"http://{LOOPBACK}:{port}{MCP_PATH}", server
    finally:
        http.should_exit = True
        thread.join(timeout=15)
        sock.close()
        server.close()


@contextlib.asynccontextmanager
async def http_session(url: str, token: str, elicitation_callback: Any = None) -> Any:
    """The official client over Streamable HTTP with ``token``; with ``elicitation_callback``
    it declares elicitation and the callback answers the server's confirmations."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http,
        Client(
            streamable_http_client(url, http_client=http), elicitation_callback=elicitation_callback
        ) as client,
    ):
        yield client


@dataclass
class ServerProcess:
    """``engram-memory serve`` running as its own process."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    data_dir: Path


@contextlib.contextmanager
def running_server(
    data_dir: Path, log_dir: Path, *, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """``engram-memory serve`` on a free loopback port (its data directory made for that
    address), its output in ``log_dir``; SIGTERM (a clean stop) on the way out. ``env``: extra
    environment variables for the server (e.g. the memory-trace diagnostic)."""
    from engram_memory.embedded.composition import init_data_dir
    from engram_memory.mcp_surface.transports import MCP_PATH

    port = free_port()
    url = f"http://{LOOPBACK}:{port}{MCP_PATH}"
    init_data_dir(data_dir, resource=url)
    command = [sys.executable, "-m", "engram_memory.embedded.cli", "serve"]
    command += ["--data-dir", str(data_dir), "--host", LOOPBACK, "--port", str(port)]
    with (log_dir / "server.out").open("wb") as out, (log_dir / "server.err").open("wb") as err:
        process = subprocess.Popen(  # noqa: S603 - this interpreter, fixed arguments
            command,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    try:
        _wait_until_serving(process, port)
        yield ServerProcess(url=url, port=port, process=process, data_dir=data_dir)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_serving(process: subprocess.Popen[bytes], port: int) -> None:
    """Until the server answers HTTP. Its socket listens before the host has opened (so that a
    port in use fails first), and a busy machine can take seconds to open it: connecting alone
    would start the clock, and the first samples, on a server still starting."""
    from engram_memory.mcp_surface.transports import WELL_KNOWN

    deadline = time.monotonic() + START_DEADLINE_S
    metadata = f"http://{LOOPBACK}:{port}{WELL_KNOWN}"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before serving")
        with contextlib.suppress(httpx2.HTTPError):
            if httpx2.get(metadata, timeout=2.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("the server did not serve in time")

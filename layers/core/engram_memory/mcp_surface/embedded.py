"""The embedded MCP server: the runtime wired from a data directory, and ``serve``."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio
import uvicorn

from ..adapters.local.clock import SystemClock
from ..adapters.local.vault import load_or_create_master_key
from ..bootstrap import EmbeddedHost, init_data_dir, open_embedded
from ..engine.context import TOOLS
from ..host.tokens import TokenIssuer, local_issuer, local_verifier
from .request_state import RequestStateSealer
from .server import EngramMcp, SurfaceRuntime
from .transports import MCP_PATH, http_app, serve_stdio

DEFAULT_PRINCIPAL = "default-agent"
DEFAULT_WORKSPACE = "default"
DEFAULT_PURPOSE = "general"
STDIO_TOKEN_ENV = "ENGRAM_TOKEN"  # noqa: S105 - the name of a variable, not a secret
REQUEST_STATE_KEY_FILE = "request-state.key"


@dataclass
class EmbeddedServer:
    surface: EngramMcp
    host: EmbeddedHost
    issuer: TokenIssuer

    def close(self) -> None:
        self.host.close()


def open_server(
    data_dir: Path, *, stdio_token: str | None = None, **engine_options: Any
) -> EmbeddedServer:
    """Wire the MCP surface over the embedded engine in ``data_dir`` (initializing it if needed).

    ``engine_options`` go to ``open_embedded`` (e.g. ``embedder``, ``semantic_mode``).
    """
    config = init_data_dir(data_dir)
    embedded = open_embedded(data_dir, **engine_options)
    runtime = SurfaceRuntime(
        engine=embedded.engine,
        verifier=local_verifier(data_dir, config),
        host=config,
        sealer=RequestStateSealer(
            load_or_create_master_key(data_dir / "keys" / REQUEST_STATE_KEY_FILE)
        ),
        clock=SystemClock(),
        stdio_token=stdio_token,
    )
    issuer = local_issuer(data_dir, config)
    return EmbeddedServer(surface=EngramMcp(runtime), host=embedded, issuer=issuer)


def default_token(server: EmbeddedServer) -> str:
    config = server.surface.runtime.host
    return server.issuer.mint(
        principal=DEFAULT_PRINCIPAL,
        tenant_id=config.tenant_id,
        workspace_id=DEFAULT_WORKSPACE,
        purpose_ref=DEFAULT_PURPOSE,
        tools=TOOLS,
        expires_in_s=config.default_token_ttl_s,
    )


def _command_path() -> str:
    """An absolute path to this ``engram-memory`` executable, so a desktop host can launch it."""
    launched = Path(sys.argv[0]) if sys.argv else None
    if launched is not None and launched.name == "engram-memory":
        return str(launched.resolve())
    return shutil.which("engram-memory") or "engram-memory"


def client_configuration(url: str, token: str, data_dir: Path) -> dict[str, Any]:
    """Ready-to-paste configurations for a desktop MCP host (HTTP or stdio) and the Inspector."""
    return {
        "mcpServers": {
            "engram-memory": {
                "type": "http",
                "url": url,
                "headers": {"Authorization": f"Bearer {token}"},
            },
            "engram-memory-stdio": {
                "command": _command_path(),
                "args": ["serve", "--stdio", "--data-dir", str(data_dir.resolve())],
                "env": {STDIO_TOKEN_ENV: token},
            },
        }
    }


def print_banner(out: TextIO, *, url: str, token: str, data_dir: Path) -> None:
    config = client_configuration(url, token, data_dir)
    print("Engram Memory is serving MCP at " + url, file=out)
    print(f"Data directory: {data_dir.resolve()}", file=out)
    print(
        "\nPaste into your MCP client configuration (token for principal "
        f"'{DEFAULT_PRINCIPAL}', workspace '{DEFAULT_WORKSPACE}', purpose '{DEFAULT_PURPOSE}', all six tools):\n",
        file=out,
    )
    print(json.dumps(config, indent=2), file=out)
    print(
        "\nMCP Inspector: npx @modelcontextprotocol/inspector, transport 'Streamable HTTP', URL "
        f"{url}, header 'Authorization: Bearer <the token above>'.",
        file=out,
    )
    print(
        "\nMint tokens for other agents with `engram-memory token --help`. Ctrl-C stops.",
        file=out,
        flush=True,
    )


def _drain_loop(server: EmbeddedServer, stop: threading.Event) -> None:
    """Completes queued key destructions and projection drops without further calls."""
    while not stop.wait(5.0):
        server.host.engine.drain_outbox()


def serve(data_dir: Path, *, bind_host: str, port: int, stdio: bool) -> None:
    import os

    stdio_token = os.environ.get(STDIO_TOKEN_ENV) if stdio else None
    server = open_server(data_dir, stdio_token=stdio_token)
    stop = threading.Event()
    drainer = threading.Thread(target=_drain_loop, args=(server, stop), daemon=True)
    drainer.start()
    try:
        if stdio:
            if not stdio_token:
                print(
                    f"{STDIO_TOKEN_ENV} is not set: every tool call will be refused (-32603). "
                    "Mint one with `engram-memory token`.",
                    file=sys.stderr,
                )
            anyio.run(serve_stdio, server.surface)
            return
        url = f"http://{bind_host}:{port}{MCP_PATH}"
        print_banner(sys.stdout, url=url, token=default_token(server), data_dir=data_dir)
        resource = server.surface.runtime.host.resource
        if resource != url:
            print(
                f"\nNote: the service's resource URI (the tokens' audience) stays {resource}; "
                f"to advertise {url} instead, run `engram-memory init --resource {url}` first.",
                file=sys.stderr,
                flush=True,
            )
        app = http_app(server.surface, bind_host=bind_host)
        uvicorn.Server(uvicorn.Config(app, host=bind_host, port=port, log_level="warning")).run()
    finally:
        stop.set()
        server.close()

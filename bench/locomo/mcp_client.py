"""``--via-mcp``: the tools through the embedded server's MCP HTTP endpoint, with the official client.

One real server (``engram_memory.mcp_surface``: ``open_server`` behind uvicorn on a free
127.0.0.1 port, in a background thread) per profile, all over the same data directory, and the
official ``mcp`` client over Streamable HTTP, one session per workspace with a token the local
issuer mints for that workspace (the trusted context comes from the token, as for any agent).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio.from_thread
from mcp import Client

from engram_memory.engine.context import TOOLS
from engram_memory.mcp_surface.catalog import TOOL_NAMES

from ..harness import http_session, serve_in_thread
from .calls import PRINCIPAL, PURPOSE


class McpClient:
    """Calls the tools over Streamable HTTP; one client session per workspace."""

    def __init__(self, url: str, server: Any, portal: Any, stack: contextlib.ExitStack) -> None:
        self._url = url
        self._server = server
        self._portal = portal
        self._stack = stack
        self._sessions: dict[str, Client] = {}

    def _session(self, workspace: str) -> Client:
        if workspace not in self._sessions:
            token = self._server.issuer.mint(
                principal=PRINCIPAL,
                tenant_id=self._server.surface.runtime.host.tenant_id,  # the host's tenant
                workspace_id=workspace,
                purpose_ref=PURPOSE,
                tools=TOOLS,
                expires_in_s=86_400,
            )
            self._sessions[workspace] = self._stack.enter_context(
                self._portal.wrap_async_context_manager(http_session(self._url, token))
            )
        return self._sessions[workspace]

    def call(self, workspace: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        client = self._session(workspace)
        result = self._portal.call(client.call_tool, TOOL_NAMES[tool], arguments)
        envelope: dict[str, Any] = result.structured_content or json.loads(result.content[0].text)
        return envelope


@contextlib.contextmanager
def open_mcp_clients(
    data_dir: Path, engine_options: dict[str, dict[str, Any]]
) -> Iterator[dict[str, McpClient]]:
    """One served engine and one ``McpClient`` per profile (``engine_options`` by profile)."""
    with contextlib.ExitStack() as stack:
        portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
        clients: dict[str, McpClient] = {}
        for profile, options in engine_options.items():
            url, server = stack.enter_context(serve_in_thread(data_dir, **options))
            clients[profile] = McpClient(url, server, portal, stack)
        yield clients

"""Our side of the governance runs: the embedded MCP server and agents with real tokens.

``served`` runs the real server (``open_server`` behind uvicorn on a loopback port:
``bench.harness.serve_in_thread``) and opens ``Agent``s: the official ``mcp`` client over
Streamable HTTP with a bearer token the data directory's issuer mints for a principal, tenant
and workspace. Each agent's client declares form elicitation and a person who approves every
question (``Human``): a withdraw or a forget goes through the same confirmation a real client's
form answers (the approval book in ``approvals.sqlite3``, the gate's single-use approval).
``admin`` runs the operator CLI (``engram-memory admin ...``) in a subprocess, beside the server,
as an operator would.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.from_thread
import mcp.types as types
from mcp import MCPError
from mcp.client.session import ClientRequestContext

from bench.governance.admission import capture_arguments
from bench.governance.canaries import Canary
from bench.harness import engram_cli, http_session, serve_in_thread

PURPOSE = "purpose:governance-benchmark"


@dataclass
class Human:
    """The person behind a client's approval form: approves every question it is shown."""

    asked: list[str] = field(default_factory=list)

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "approve"})


class Agent:
    """One principal's client with one token; ``call`` answers the envelope, or for a call the
    server refuses at the protocol level (no trusted context), ``{"ok": False, "error": {"code":
    "mcp:<code>"}}``."""

    def __init__(self, portal: Any, client: Any, human: Human) -> None:
        self._portal = portal
        self._client = client
        self.human = human

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from engram_memory.mcp_surface.catalog import TOOL_NAMES

        try:
            result = self._portal.call(self._client.call_tool, TOOL_NAMES[tool], arguments)
        except MCPError as error:
            return {"ok": False, "error": {"code": f"mcp:{error.error.code}"}}
        envelope: dict[str, Any] = result.structured_content or json.loads(result.content[0].text)
        return envelope

    def value(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        envelope = self.call(tool, arguments)
        assert envelope["ok"], envelope
        value: dict[str, Any] = envelope["output"]["value"]
        return value

    def capture(self, canary: Canary, key: str | None = None) -> str:
        arguments = canary_capture(canary, key)
        candidate_id: str = self.value("capture", arguments)["candidate_id"]
        return candidate_id

    def remember(self, canary: Canary) -> str:
        admitted = self.value(
            "request_admission",
            {
                "candidate_id": self.capture(canary),
                "idempotency_key": f"governance-admit-{canary.key}",
            },
        )
        outcome = admitted["outcome"]
        assert outcome["status"] == "accepted", (canary.key, outcome)
        record_id: str = outcome["record_id"]
        return record_id

    def search(self, query: str) -> list[dict[str, Any]]:
        envelope = self.call("search", {"query": query, "purpose_ref": PURPOSE, "limit": 50})
        if not envelope["ok"]:
            return []
        records: list[dict[str, Any]] = envelope["output"]["value"]["records"]
        return records

    def forget(self, record_id: str, key: str) -> dict[str, Any]:
        arguments = {"record_id": record_id, "idempotency_key": key, "reason_ref": "reason:bench"}
        return self.call("forget", arguments)

    def withdraw(self, candidate_id: str, key: str) -> dict[str, Any]:
        arguments = {
            "candidate_id": candidate_id,
            "idempotency_key": key,
            "reason_ref": "reason:bench",
        }
        return self.call("withdraw", arguments)


def canary_capture(canary: Canary, key: str | None = None) -> dict[str, Any]:
    """A capture of the canary's text (the admission benchmark's capture, keyed by the canary)."""
    from bench.governance.admission import Item

    arguments = capture_arguments(Item(canary.key, "canary", canary.text))
    arguments["idempotency_key"] = key or f"governance-capture-{canary.key}"
    arguments["payload"]["purpose_ref"] = PURPOSE
    return arguments


@dataclass
class Served:
    url: str
    server: Any
    data_dir: Path
    portal: Any
    stack: contextlib.ExitStack

    @property
    def tenant_id(self) -> str:
        tenant: str = self.server.surface.runtime.host.tenant_id
        return tenant

    def token(self, principal: str, workspace: str, tenant: str | None = None) -> str:
        from engram_memory.engine.context import TOOLS

        token: str = self.server.issuer.mint(
            principal=principal,
            tenant_id=tenant or self.tenant_id,
            workspace_id=workspace,
            purpose_ref=PURPOSE,
            tools=TOOLS,
            expires_in_s=3_600,
        )
        return token

    def agent(self, principal: str, workspace: str, tenant: str | None = None) -> Agent:
        human = Human()
        token = self.token(principal, workspace, tenant)
        client = self.stack.enter_context(
            self.portal.wrap_async_context_manager(http_session(self.url, token, human))
        )
        return Agent(self.portal, client, human)


@contextlib.contextmanager
def served(data_dir: Path, **options: Any) -> Iterator[Served]:
    """The embedded MCP server over ``data_dir`` (``options``: ``open_server``'s)."""
    with contextlib.ExitStack() as stack:
        portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
        url, server = stack.enter_context(serve_in_thread(data_dir, **options))
        with contextlib.ExitStack() as clients:  # closed before the server stops
            yield Served(url, server, data_dir, portal, clients)


def admin(data_dir: Path, *arguments: str) -> str:
    """``engram-memory admin ARGUMENTS --data-dir DATA_DIR``: its stdout (it must succeed)."""
    done = subprocess.run(  # noqa: S603 - this environment's own console script
        [engram_cli(), "admin", *arguments, "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"admin {' '.join(arguments)} failed: {done.stderr.strip()[-400:]}")
    return done.stdout

"""The SDK floor: a bare server on the official ``mcp`` SDK answering our tools with our payloads.

``python -m bench.hotpath.floor --payloads FILE (--stdio | --port P)`` serves, on the SDK's
low-level ``Server`` (the one ``mcp_surface`` builds on) and its stdio or Streamable HTTP
transport, the same tool list our server shows (names, descriptions, input and output schemas)
and answers every ``tools/call`` with the envelope our engine gave for that tool on the same
store (``payloads``: one search returning the most records, one get, one capture, one
admission), as our server does: ``structuredContent`` and the same object as JSON text,
serialized on each call. No token, no engine, no envelope work: what is left of our time
above it is the engine's and our surface's (``bench.hotpath.runner.split``).

The payloads are taken once per store size, before the measured sessions, by the engine in
process on a scratch copy of the seeded store (``write_payloads``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

FLOOR_NAME = "hotpath-floor"
PAYLOADS = "floor-payloads.json"


def write_payloads(store: Any, plan: Any, into: Path) -> Path:
    """Our tool list and one envelope per tool, from the engine on a copy of ``store``; the
    file the floor server reads. ``store``: a ``SeededStore``; ``plan``: the sessions' ``Plan``."""
    from bench.locomo.calls import PURPOSE, value
    from bench.locomo.clients import EngineClient
    from engram_memory.embedded.serve import open_server
    from engram_memory.mcp_surface.catalog import TOOL_NAMES, build_tools, for_purpose

    from .corpus import SEARCH_LIMIT
    from .stores import DATA, WORKSPACE

    tools = [
        for_purpose(tool, PURPOSE).model_dump(mode="json", by_alias=True, exclude_none=True)
        for tool in build_tools().values()
    ]
    with tempfile.TemporaryDirectory(prefix="hotpath-floor-") as tmp:
        data_dir = Path(tmp) / DATA
        shutil.copytree(store.data_dir, data_dir)
        server = open_server(data_dir)
        try:
            client = EngineClient(server.host.engine, tenant=server.surface.runtime.host.tenant_id)
            searches = [
                client.call(
                    WORKSPACE,
                    "search",
                    {"query": query, "purpose_ref": PURPOSE, "limit": SEARCH_LIMIT},
                )
                for query in plan.queries[:SEARCH_LIMIT]
            ]
            search = max(searches, key=lambda e: len(value(e, "search")["records"]))
            memory = plan.gets[0]
            get = client.call(
                WORKSPACE,
                "get",
                {"record_id": store.record_ids[memory.index], "purpose_ref": PURPOSE},
            )
            written = plan.writes[0]
            capture = client.call(WORKSPACE, "capture", written.capture_arguments("floor"))
            candidate = value(capture, "capture")["candidate_id"]
            admission = client.call(
                WORKSPACE,
                "request_admission",
                written.admission_arguments(candidate, "floor"),
            )
            value(get, "get")
            value(admission, "request_admission")
        finally:
            server.close()
    results = {
        TOOL_NAMES["search"]: search,
        TOOL_NAMES["get"]: get,
        TOOL_NAMES["capture"]: capture,
        TOOL_NAMES["request_admission"]: admission,
    }
    into.mkdir(parents=True, exist_ok=True)
    path = into / PAYLOADS
    path.write_text(json.dumps({"tools": tools, "results": results}), encoding="utf-8")
    return path


# -- the server (imports the SDK only: what the floor measures) ----------------------------------


def floor_server(payloads: dict[str, Any]) -> Any:
    """The low-level ``Server`` answering ``tools/list`` and ``tools/call`` from ``payloads``."""
    import mcp.types as types
    from mcp.server import Server
    from mcp.shared.exceptions import MCPError

    tools = [types.Tool.model_validate(tool) for tool in payloads["tools"]]
    results: dict[str, dict[str, Any]] = payloads["results"]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        envelope = results.get(params.name)
        if envelope is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"unknown tool {params.name}")
        return types.CallToolResult(
            content=[
                types.TextContent(
                    type="text",
                    text=json.dumps(envelope, separators=(",", ":"), ensure_ascii=False),
                )
            ],
            structured_content=envelope,
            is_error=not envelope["ok"],
        )

    return Server(FLOOR_NAME, on_list_tools=list_tools, on_call_tool=call_tool)


async def _serve_stdio(server: Any) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def _serve_http(server: Any, port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath.floor", description=__doc__)
    parser.add_argument("--payloads", type=Path, required=True, help="written by write_payloads")
    transport = parser.add_mutually_exclusive_group(required=True)
    transport.add_argument("--stdio", action="store_true")
    transport.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    server = floor_server(json.loads(args.payloads.read_text(encoding="utf-8")))
    if args.stdio:
        import anyio

        anyio.run(_serve_stdio, server)
    else:
        _serve_http(server, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())

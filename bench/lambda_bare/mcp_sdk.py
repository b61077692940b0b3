"""The bare MCP SDK beside the anchor, for ``bench.cold_imports --built``.

Run as ``app.py`` of a folder holding the MCP adapter's build folder (where the SDK is
installed: ``mcp``, Starlette, anyio, httpx, pydantic) and the anchor as ``anchor.py``, with the
built CoreLayer: the anchor's Powertools handler plus the SDK modules a stateless Streamable HTTP
server behind bearer auth imports, nothing of ours. Its init over the anchor's is the SDK's share of the adapter's
init; what the adapter takes beyond it is ours.
"""

import mcp.server
import mcp.server.auth.routes
import mcp.server.auth.settings
import mcp.server.streamable_http_manager
import mcp.server.transport_security
from anchor import handler  # type: ignore[import-not-found]  # bench/lambda_bare/app.py

__all__ = ["handler", "mcp"]

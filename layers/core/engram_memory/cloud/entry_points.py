"""The handlers of the functions whose parts the composition root wires: the MCP adapter's and
the approval page's (``functions/<name>/app.py``).

The handler gets the composition root's builder; the handler's module never imports the root, so
the root stays the one place that wires. The root imports the engine, pydantic and the settings:
that import waits for the first invocation, as the tool functions' does (``tool_handler``), so
Lambda's init imports no more than before (bench.cold_imports,
tests/integration/test_cold_imports.py). Each handler's module is imported inside its factory:
the approval function is not packaged with the MCP SDK the adapter's module imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engram_memory.cloud.approval_page import ApprovalHandler
    from engram_memory.cloud.mcp_adapter import LambdaAdapter
    from engram_memory.cloud.settings import AdapterSettings
    from engram_memory.mcp_surface.server import EngramMcp


def mcp_adapter_handler() -> LambdaAdapter:
    """The MCP adapter function's handler, made at Lambda's init (its module loads the MCP SDK
    then, on purpose); its surface is built by the first invocation."""
    from engram_memory.cloud.mcp_adapter import LambdaAdapter

    return LambdaAdapter(build=_adapter_surface)


def _adapter_surface(settings: AdapterSettings) -> EngramMcp:
    from engram_memory.cloud.composition import build_adapter

    return build_adapter(settings)


def approval_handler() -> ApprovalHandler:
    """The approval function's handler, made by its first invocation
    (``tool_handler.deferred_handler``)."""
    from engram_memory.cloud.approval_page import ApprovalHandler
    from engram_memory.cloud.composition import build_approval_page

    return ApprovalHandler(build=build_approval_page)

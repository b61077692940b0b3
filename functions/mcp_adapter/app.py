"""The MCP adapter function: the stateless MCP surface in front of the six tool functions."""

from engram_memory.cloud.entry_points import mcp_adapter_handler

handler = mcp_adapter_handler()

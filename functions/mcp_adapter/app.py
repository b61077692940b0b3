"""The MCP adapter function: the stateless MCP surface in front of the six tool functions."""

from engram_memory.cloud.mcp_adapter import LambdaAdapter

handler = LambdaAdapter()

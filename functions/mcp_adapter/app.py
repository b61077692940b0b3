"""The MCP adapter function: the stateless MCP surface in front of the six tool functions."""

from engram_memory.mcp_surface.lambda_adapter import LambdaAdapter

handler = LambdaAdapter()

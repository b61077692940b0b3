"""The `request_admission` tool function: the engine from the CoreLayer behind a thin Powertools handler."""

from engram_memory.cloud.tool_handler import tool_handler

handler = tool_handler("request_admission")

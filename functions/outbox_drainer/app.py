"""The outbox drainer: scheduled every minute, and an operator's reindex (``engram_memory.cloud.drainer``)."""

from engram_memory.cloud.tool_handler import deferred_handler

handler = deferred_handler("engram_memory.cloud.drainer:drainer_handler")

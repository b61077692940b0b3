"""URL-mode confirmations: the approval page (``engram_memory.cloud.approval_page``)."""

from engram_memory.cloud.tool_handler import deferred_handler

handler = deferred_handler("engram_memory.cloud.entry_points:approval_handler")

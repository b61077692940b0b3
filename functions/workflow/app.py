"""The Task steps of the withdraw/forget state machines (``engram_memory.cloud.workflow``)."""

from engram_memory.cloud.tool_handler import deferred_handler

handler = deferred_handler("engram_memory.cloud.workflow:WorkflowHandler")

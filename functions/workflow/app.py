"""The Task steps of the withdraw/forget state machines (``engram_memory.cloud.workflow``)."""

from engram_memory.cloud.workflow import WorkflowHandler

handler = WorkflowHandler()

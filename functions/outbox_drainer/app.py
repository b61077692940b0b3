"""The outbox drainer: scheduled every minute, and an operator's reindex (``engram_memory.cloud.drainer``)."""

from engram_memory.cloud.drainer import drainer_handler

handler = drainer_handler()

"""The outbox drainer: scheduled every minute, and an operator's reindex (``engram_memory.drainer``)."""

from engram_memory.drainer import drainer_handler

handler = drainer_handler()

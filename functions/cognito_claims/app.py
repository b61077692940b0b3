"""The user pool's pre-token-generation trigger (``engram_memory.cloud.cognito_claims``)."""

from engram_memory.cloud.tool_handler import deferred_handler

handler = deferred_handler("engram_memory.cloud.cognito_claims:claims_handler")

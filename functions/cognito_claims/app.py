"""The user pool's pre-token-generation trigger (``engram_memory.cloud.cognito_claims``)."""

from engram_memory.cloud.cognito_claims import claims_handler

handler = claims_handler()

"""The agent contract (CONTRACT.md): models, error codes, canonical JSON and digests."""

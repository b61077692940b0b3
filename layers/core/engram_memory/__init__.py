"""Engram Memory: governed memory for AI agents.

The package is layered so that dependencies point inward:

- ``contract``  — the agent contract: closed pydantic models, error codes, canonical JSON and digests.
- ``engine``    — the six use cases and the ports they need; pure Python, no I/O of its own.
- ``policy``    — admission policies (the built-in one scans for secrets and host facts).
- ``adapters``  — port implementations: ``local`` (SQLite, local vault) for the embedded default.
- ``bootstrap`` — the composition root that wires an engine from settings.
"""

CONTRACT_VERSION = "1.0.0"
PROVIDER = "sentropic.engram.memory"
CONNECTOR = "engram-memory"

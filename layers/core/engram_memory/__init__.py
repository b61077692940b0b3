"""Engram Memory: governed memory for AI agents.

The package is layered so that dependencies point inward:

- ``contract``     — the agent contract: closed pydantic models, error codes, canonical JSON, digests.
- ``engine``       — the six use cases and the ports they need; pure Python, no I/O of its own.
- ``policy``       — admission policies (the built-in one scans for secrets and host facts).
- ``adapters``     — port implementations: ``local`` (SQLite, local vault) and ``aws``
                     (DynamoDB + S3, KMS, OpenSearch).
- ``host``         — the host's configuration and bearer tokens (claims → trusted context).
- ``mcp_surface``  — the MCP server on the official SDK: tools, confirmations, HTTP and stdio.
- ``bootstrap``    — the embedded composition root; ``cli`` — the ``engram-memory`` command.
"""

CONTRACT_VERSION = "1.0.0"
PROVIDER = "sentropic.engram.memory"
CONNECTOR = "engram-memory"

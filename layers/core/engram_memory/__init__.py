"""Engram Memory: governed memory for AI agents.

One core and two sibling hosts; dependencies point inward (the import-linter contracts in
pyproject.toml hold them, docs/architecture.md draws them):

- ``contract``       — the agent contract: closed pydantic models, error codes, canonical JSON, digests.
- ``engine``         — the six use cases, the approval gate and the ports they need; no I/O of its own.
- ``policy``         — admission policies (the built-in one: secrets, host facts, the quality gate).
- ``binding``        — what a host binds a call to: its configuration, tokens and claims.
- ``adapters``       — the ports' implementations: ``local`` (SQLite, local keys) and ``aws``
                       (DynamoDB + S3, KMS, OpenSearch), and the pieces both use.
- ``mcp_surface``    — the MCP server on the official SDK: tools, approvals, HTTP and stdio.
- ``approval_page``  — the page a person approves on, served by both hosts.
- ``operator_plane`` — the operator's audited commands, run by both hosts.
- ``embedded``       — the local host: composition, command line, serving, data directory.
- ``cloud``          — the AWS host: Lambda handlers' composition, workflow, approval function.
- ``entry``          — the ``engram-memory`` command, which picks a host.
"""

CONTRACT_VERSION = "1.0.0"
PROVIDER = "sentropic.engram.memory"
CONNECTOR = "engram-memory"

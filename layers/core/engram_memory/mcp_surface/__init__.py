"""The MCP surface: the six tools on the official ``mcp`` SDK, host binding, confirmations.

The same ``Server`` object serves Streamable HTTP (protocol revisions 2026-07-28, stateless, and
2025-11-25, with the initialize handshake) and stdio; it keeps no session state of its own on the
request path, so the cloud adapter Lambda can run it unchanged. A host that keeps its questions
to humans beyond one request hands it an ``approval_channel.ApprovalChannel``; it imports no host.
"""

"""The host side of the embedded default: its configuration and its bearer tokens.

The *host* binds the trusted context of every call (CONTRACT.md §1). In the embedded default the
local operator is the host, and this package holds what that takes:

- ``config`` — ``HostConfig``, persisted as ``<data_dir>/host.json``: the service's resource URI
  (the audience of every token), the issuer name, the tenant, the allowed browser origins, the
  admission policy, the retention ceiling and the reconciliation consent.
- ``tokens`` — the local issuer key, minting and verifying bearer JWTs, and the mapping of verified
  claims to the engine's ``TrustedContext``.

Nothing here is reachable through the agent's MCP endpoint except token verification.
"""

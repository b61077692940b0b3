"""The benchmark's tool calls: who makes them (tenant, principal, purpose), the ``Client`` that
makes one, and reading its envelope. Below the runner, so the clients and every other bench that
calls as the benchmark import it without importing the runner."""

from __future__ import annotations

from typing import Any, Protocol

TENANT = "tenant-benchmark"
PRINCIPAL = "locomo-bench-agent"
PURPOSE = "purpose:retrieval-benchmark"


class Client(Protocol):
    """Calls one tool in one workspace and returns the result envelope."""

    def call(self, workspace: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]: ...


class BenchmarkError(RuntimeError):
    """A tool call failed where the benchmark needs it to succeed."""


def value(envelope: dict[str, Any], what: str) -> dict[str, Any]:
    if not envelope.get("ok"):
        code = envelope.get("error", {}).get("code", "unknown")
        raise BenchmarkError(f"{what} failed: {code}")
    result: dict[str, Any] = envelope["output"]["value"]
    return result

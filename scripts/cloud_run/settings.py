"""The gate's fixed values: where things are, the stack's names, the principal and its tools."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
EVENTS: Final = ROOT / "events"
WORKER: Final = ROOT / "scripts" / "lambda_worker.py"
REGION: Final = "us-east-1"
ACCOUNT: Final = "123456789012"
TENANT: Final = "dev"
AUDIENCE: Final = "https://memory.example.com/mcp"
APPROVAL_AUDIENCE: Final = "https://memory.example.com/approvals"
PRINCIPAL: Final = "agent-alice"
WORKSPACE: Final = "ws-research-0001"
TOOLS: Final = ("search", "get", "capture", "request_admission", "withdraw", "forget")
AUDIT_MESSAGE: Final = (
    "audit"  # engram_memory.cloud.observability.AUDIT_MESSAGE (not importable here)
)
# Errors that mean the code could not run as built (not a behaviour of the product).
BROKEN_BUILD_ERRORS: Final = frozenset(
    {
        "Runtime.ImportModuleError",
        "ImportError",
        "ModuleNotFoundError",
        "NameError",
        "AttributeError",
        "SyntaxError",
        "TypeError",
    }
)


def sample(name: str) -> Any:
    """``events/<name>``, parsed (a fresh copy on every call)."""
    return json.loads((EVENTS / name).read_text("utf-8"))

"""Every operator call, audited: who acts (``operator:<identity>``) and one audit line per
call (the tool ``admin.<operation>``, ok or the error code, never content), whatever its outcome.

The operator plane's use cases (``inspection``, ``decisions``, ``repair``) and each host's
operations (backups, key rotation, imports) run through ``audited``; only the host's operator
CLIs and the embedded console call them, never an agent through ``/mcp`` (CONTRACT.md §1, §4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.kernel import Call, Kernel
from engram_memory.engine.ports import AuditEvent, IndexUnavailable, StoreUnavailable

OPERATIONS_PURPOSE: Final = "operations"

T = TypeVar("T")


def operator_principal(operator: str) -> str:
    """The principal an operator's decisions are journaled and audited under."""
    if not operator or not operator.strip():
        raise EngramError(ErrorCode.INVALID_SCHEMA)
    return f"operator:{operator}"


def audited(
    engine: Kernel,
    scope: Scope,
    operator: str,
    operation: str,
    target: str | None,
    run: Callable[[Call], T],
) -> T:
    """Run one operation as ``operator`` and audit it (ok or the error code), never content."""
    principal = operator_principal(operator)
    ctx = TrustedContext.for_operator(scope, principal, OPERATIONS_PURPOSE)
    call = Call(
        tool=operation,
        ctx=ctx,
        now_ms=engine.clock.now_ms(),
        target=target,
    )
    code = "OK"
    try:
        return run(call)
    except EngramError as error:
        code = error.code.value
        raise
    except (StoreUnavailable, IndexUnavailable):
        code = ErrorCode.STORE_UNAVAILABLE.value
        raise EngramError(ErrorCode.STORE_UNAVAILABLE) from None
    finally:
        engine.audit.record(
            AuditEvent.of_call(
                ctx,
                at_ms=call.now_ms,
                tool=f"admin.{operation}",
                ok=code == "OK",
                code=code,
                target=call.target,
                digests=dict(call.digests),
            )
        )

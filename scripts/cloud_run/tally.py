"""What each phase of the flow cost, counted where it happens (not estimated)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest.mock import patch

from .lambdas import LambdaService
from .settings import AUDIT_MESSAGE

if TYPE_CHECKING:
    from moto.core.responses import ActionResult
    from moto.stepfunctions.responses import StepFunctionResponse


class Tally:
    """What one phase of the flow cost, counted where it happens (not estimated).

    MCP requests: the adapter events this harness sends. Function invocations: every ``Invoke``
    the Lambda service answers (the adapter's, the state machines') plus the approval page's
    requests. Executions: ``StartExecution`` calls moto's Step Functions answers (hooked in this
    process, where ``ThreadedMotoServer`` runs). Use-case runs: the audit events the functions
    log for the tool (``Engine.handle`` writes one per run; refusals are listed by code).
    Every payload seen (invocations, execution inputs, task outputs) is kept for the scan.
    """

    def __init__(self) -> None:
        self.mcp_requests = 0
        self.page_requests = 0
        self.start_executions: list[str] = []
        self.task_outputs: list[str] = []
        self.payloads: list[bytes] = []
        # Every request moto and the fake OpenSearch answered: (service.action, seconds spent
        # answering it), in the order they finished (``hook_requests``).
        self.requests: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def hook_requests(self, search: Any) -> None:
        """Time every request moto's WSGI application and ``search`` (the fake OpenSearch)
        answer, in this process: the stand-in cloud's own time, which the benchmarks subtract
        from a handler's wall time (``bench.lambda_warm --built``)."""
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication

        tally = self
        dispatch = DomainDispatcherApplication.__call__

        def timed_dispatch(app: Any, environ: dict[str, Any], start_response: Any) -> Any:
            return tally._timed(_moto_kind(environ), lambda: dispatch(app, environ, start_response))

        handle = search.handle

        def timed_search(method: str, path: str, body: bytes, authorization: str) -> Any:
            parts = path.split("?", 1)[0].split("/")
            kind = "opensearch." + next((p for p in parts if p.startswith("_")), method)
            return tally._timed(kind, lambda: handle(method, path, body, authorization))

        # moto has no hook on its dispatcher: wrapped for the rest of the process, like the two
        # Step Functions methods above
        patch.object(DomainDispatcherApplication, "__call__", timed_dispatch).start()
        search.handle = timed_search

    def _timed(self, kind: str, answer: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return answer()
        finally:
            took = time.perf_counter() - started
            with self.lock:
                self.requests.append((kind, took))

    def hook_moto(self) -> None:
        from moto.stepfunctions.responses import StepFunctionResponse

        tally = self
        start, succeed = (
            StepFunctionResponse.start_execution,
            StepFunctionResponse.send_task_success,
        )

        def start_execution(response: StepFunctionResponse) -> ActionResult:
            with tally.lock:
                tally.start_executions.append(str(response._get_param("input", if_none="{}")))
            return start(response)

        def send_task_success(response: StepFunctionResponse) -> ActionResult:
            with tally.lock:
                tally.task_outputs.append(str(response._get_param("output", if_none="")))
            return succeed(response)

        # moto offers no hook on these calls: the harness wraps the two methods it counts, for
        # the rest of the process
        patch.object(StepFunctionResponse, "start_execution", start_execution).start()
        patch.object(StepFunctionResponse, "send_task_success", send_task_success).start()

    def snapshot(self, lambdas: LambdaService, logs: Path) -> dict[str, Any]:
        return {
            "mcp": self.mcp_requests,
            "invocations": len(lambdas.invocations) + self.page_requests,
            "executions": len(self.start_executions),
            "audit": audit_events(logs),
        }


def _moto_kind(environ: dict[str, Any]) -> str:
    """``service.Action`` of a request to moto: the signing service of its Authorization header
    and its ``X-Amz-Target`` action (JSON protocols), else its HTTP method (S3)."""
    credential = str(environ.get("HTTP_AUTHORIZATION", "")).split("Credential=", 1)[-1]
    parts = credential.split(",", 1)[0].split("/")
    service = parts[3] if len(parts) > 3 else "unknown"
    target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
    return f"{service}.{target.rsplit('.', 1)[-1] if target else environ.get('REQUEST_METHOD')}"


def _audit_record(line: str) -> dict[str, Any] | None:
    """The line's audit event (Powertools JSON), or None when it is not one."""
    if '"tool"' not in line or not line.startswith("{"):
        return None
    try:
        record: dict[str, Any] = json.loads(line)
    except ValueError:
        return None
    return record if record.get("message") == AUDIT_MESSAGE else None


def audit_events(logs: Path) -> dict[str, list[dict[str, Any]]]:
    """Every audit line each function logged so far (Powertools JSON, one per line)."""
    events: dict[str, list[dict[str, Any]]] = {}
    for log in sorted(logs.glob("*.log")):
        events[log.stem] = []
        for line in log.read_text("utf-8", errors="replace").splitlines():
            record = _audit_record(line)
            if record is not None:
                events[log.stem].append({"function": log.stem, **record})
    return events


def tally_between(before: dict[str, Any], after: dict[str, Any], tool: str) -> str:
    """One phase's counts as a line of text."""
    runs = [
        event
        for function, events in after["audit"].items()
        for event in events[len(before["audit"].get(function, [])) :]
        if event.get("tool") == tool
    ]
    codes: dict[str, int] = {}
    for event in runs:
        key = f"{event['function']}:{event.get('code')}"
        codes[key] = codes.get(key, 0) + 1
    return (
        f"{after['mcp'] - before['mcp']} MCP request(s), "
        f"{after['invocations'] - before['invocations']} function invocation(s), "
        f"{after['executions'] - before['executions']} StartExecution call(s), "
        f"{len(runs)} {tool} audit event(s) "
        f"({', '.join(f'{k} x{v}' for k, v in sorted(codes.items()))})"
    )

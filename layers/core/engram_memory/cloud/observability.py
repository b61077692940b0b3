"""Powertools observability of the cloud functions, kept in one neutral module.

The three Powertools singletons are created on first use (``get_logger``, ``get_metrics``,
``get_tracer``), never when this module is imported, and are shared by every caller in the
process. They are configured by the usual Powertools environment variables:

- ``POWERTOOLS_SERVICE_NAME`` (default ``engram-memory``) — the ``service`` key and dimension;
- ``POWERTOOLS_METRICS_NAMESPACE`` (default ``EngramMemory``) — the CloudWatch namespace;
- ``POWERTOOLS_LOG_LEVEL``, ``POWERTOOLS_TRACE_DISABLED``, ``POWERTOOLS_METRICS_DISABLED``;
- ``ENGRAM_TENANT_ID`` — the stack's tenant: the ``tenant`` dimension of every metric (the cold
  start metric included), the ``tenant`` key of every log line and the ``tenant`` annotation of
  every trace, so two tenant stacks in one account never write the same series and each stack's
  alarms and dashboard select only their own (``tenant = <TenantId>``).

``PowertoolsAuditSink`` is the cloud ``AuditSink``: one structured log line per tool call holding
exactly the ``AuditEvent`` fields (ids, outcome code, target id, digests, an ``INVALID_SCHEMA``'s
violation) and one metric per outcome. Neither a log line nor a metric nor a trace annotation
written here ever carries payload content: the audit event has none by construction, and the
free-form values a caller controls are reduced — the tool name of a refused call to ``unknown``
unless it is one of the six tools, a violation's field names to ``(a name not shown)`` unless
they are plain identifiers (``contract.errors``).

Metrics (all ``Count``, each emitted at once as its own EMF document, so their dimension sets
never mix):

Every metric also carries the ``tenant`` dimension (above).

- ``ToolCalls`` — dimensions ``service``, ``tool``, ``code`` (``OK`` or the contract code);
- ``GateFailed`` — dimensions ``service``, ``tool``: a confirmation gate failed;
- ``AdmissionOutcome`` — dimensions ``service``, ``status``: one per answered admission request;
- ``ProjectionLagMs`` (Milliseconds) — dimensions ``service``, ``workflow``: from a withdraw/forget
  commit to the end of its projection invalidation (the state machine's ``finish_tail``).
- ``OutboxOldestAgeSeconds`` (Seconds), ``OutboxPending`` and ``OutboxDrained`` (Count) —
  dimension ``service``: emitted by each run of the scheduled outbox drainer (``drainer.py``);
  the age is that of the oldest item still pending after the run (0 when none is).
- ``StoreFaults`` — dimensions ``service``, ``code`` (``STORE_UNAVAILABLE`` or
  ``JOURNAL_CORRUPT``): one per tool call answering either code (the audit sink), one series per
  code for the stack's alarms;
- ``AwsAccessDenied`` — AWS refused a call of the function's role for want of permission
  (``adapters.aws.denials``; the OpenSearch index's 403s too), emitted twice: dimension
  ``service`` alone (the tenant's one series, which the alarm reads) and with ``aws_service``
  (the IAM prefix, one of ``AWS_SERVICES`` or ``other``: the dashboard's breakdown). Each comes
  with one ERROR log line (message ``aws access denied``) naming the AWS service, the operation,
  the error code, the HTTP status and AWS's request id (to find the call in CloudTrail), never
  the error's message, which names the role and the resource.

``instrumented`` wraps every Lambda handler of the stack (tools, adapter, workflow, approval).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from engram_memory.contract.errors import ErrorCode

if TYPE_CHECKING:
    from aws_lambda_powertools import Logger, Metrics, Tracer

    from engram_memory.adapters.aws.denials import Denial
    from engram_memory.engine.ports import AuditEvent

__all__ = [
    "ACCESS_DENIED_MESSAGE",
    "ADMISSION_STATUSES",
    "AUDIT_MESSAGE",
    "AWS_SERVICES",
    "DEFAULT_NAMESPACE",
    "DEFAULT_SERVICE",
    "STORE_FAULT_CODES",
    "TENANT_DIMENSION",
    "PowertoolsAuditSink",
    "count_admission_outcome",
    "get_logger",
    "get_metrics",
    "get_tracer",
    "instrumented",
    "record_access_denied",
    "record_outbox_state",
    "record_projection_lag",
]

DEFAULT_SERVICE: Final = "engram-memory"
DEFAULT_NAMESPACE: Final = "EngramMemory"
AUDIT_MESSAGE: Final = "audit"
TENANT_DIMENSION: Final = "tenant"
ADMISSION_STATUSES: Final = frozenset(
    {"accepted", "rejected", "pending_adjudication", "duplicate_exact"}
)
ACCESS_DENIED_MESSAGE: Final = "aws access denied"
# The IAM prefixes of what the stack's functions call: the bounded values of ``aws_service``.
AWS_SERVICES: Final = frozenset(
    {"dynamodb", "kms", "s3", "secretsmanager", "states", "lambda", "es", "aoss", "logs", "sts"}
)
# The envelope codes that mean the stack's own store is failing: ``StoreFaults``.
STORE_FAULT_CODES: Final = frozenset(
    {ErrorCode.STORE_UNAVAILABLE.value, ErrorCode.JOURNAL_CORRUPT.value}
)
_OPERATION: Final = re.compile(r"[A-Za-z][A-Za-z0-9 _-]{0,63}")
_TOKEN: Final = re.compile(r"[A-Za-z0-9/+=-]{1,128}")  # an error code, a request id
# X-Ray records the AWS calls (botocore) and the HTTP calls to OpenSearch (opensearch-py's
# requests connection): operation, URL and status only, never request or response bodies.
_TRACED_MODULES: Final = ("botocore", "requests")

_lock = threading.Lock()
_singletons: dict[str, Any] = {}


def _service() -> str:
    return os.environ.get("POWERTOOLS_SERVICE_NAME") or DEFAULT_SERVICE


def _namespace() -> str:
    return os.environ.get("POWERTOOLS_METRICS_NAMESPACE") or DEFAULT_NAMESPACE


def _tenant() -> str:
    # A function outside a tenant stack (a test, a tool run by hand) still gets a dimension value,
    # never a series shared with a real tenant's.
    return os.environ.get("ENGRAM_TENANT_ID") or "unset"


def get_logger() -> Logger:
    """The process's Powertools ``Logger`` (structured JSON on stdout), its lines keyed by the
    tenant the environment names now, as the metrics are (``_emit``): a logger made before
    ``ENGRAM_TENANT_ID`` was set (a tool run by hand, a test) does not keep "unset"."""
    with _lock:
        if "logger" not in _singletons:
            from aws_lambda_powertools import Logger

            _singletons["logger"] = Logger(service=_service())
        shared: Logger = _singletons["logger"]
        tenant = _tenant()
        if _singletons.get("logger_tenant") != tenant:
            shared.append_keys(**{TENANT_DIMENSION: tenant})
            _singletons["logger_tenant"] = tenant
        return shared


def get_metrics() -> Metrics:
    """The process's Powertools ``Metrics`` (EMF), namespace from ``POWERTOOLS_METRICS_NAMESPACE``.

    Every metric of this module is a single metric emitted at once (``single_metric``), so a
    handler's ``log_metrics`` flush has nothing else to publish unless the handler adds some.
    """
    with _lock:
        if "metrics" not in _singletons:
            from aws_lambda_powertools import Metrics

            metrics = Metrics(namespace=_namespace(), service=_service())
            metrics.set_default_dimensions(**{TENANT_DIMENSION: _tenant()})
            _singletons["metrics"] = metrics
        shared: Metrics = _singletons["metrics"]
        return shared


def get_tracer() -> Tracer:
    """The process's Powertools ``Tracer`` (X-Ray; disabled outside Lambda and under SAM local).

    Use it with ``capture_response=False`` wherever a return value could hold plaintext.
    """
    with _lock:
        if "tracer" not in _singletons:
            from aws_lambda_powertools import Tracer

            _singletons["tracer"] = Tracer(service=_service(), patch_modules=_TRACED_MODULES)
        tracer: Tracer = _singletons["tracer"]
        return tracer


def instrumented(handler: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``handler`` as a Powertools Lambda handler: Lambda context in every log line (never the
    event), an X-Ray segment (never the response), the cold-start metric, a metrics flush."""
    # The metrics are single metrics, emitted as they happen: the decorator's final flush is
    # expected to find nothing left to publish. One process-wide filter for that one message
    # (catch_warnings per call is not thread-safe).
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    logger, tracer, metrics = get_logger(), get_tracer(), get_metrics()

    def annotated(event: Any, context: Any) -> Any:
        # Inside the logger's wrapper: clear_state drops appended keys before each invocation.
        tenant = {TENANT_DIMENSION: _tenant()}
        logger.append_keys(**tenant)
        metrics.set_default_dimensions(**tenant)
        tracer.put_annotation(TENANT_DIMENSION, tenant[TENANT_DIMENSION])
        return handler(event, context)

    wrapped = metrics.log_metrics(capture_cold_start_metric=True)(annotated)
    wrapped = tracer.capture_lambda_handler(capture_response=False)(wrapped)
    wrapped = logger.inject_lambda_context(log_event=False, clear_state=True)(wrapped)

    @functools.wraps(handler)
    def entry(event: Any, context: Any) -> Any:
        return wrapped(event, context)

    return entry


def _emit(
    name: str, unit: str, value: float, dimensions: dict[str, str], namespace: str | None = None
) -> None:
    """One metric, emitted at once as its own EMF document."""
    from aws_lambda_powertools.metrics import MetricUnit, single_metric

    with single_metric(
        name=name,
        unit=MetricUnit(unit),
        value=value,
        namespace=namespace or get_metrics().namespace,
        default_dimensions={"service": _service(), TENANT_DIMENSION: _tenant(), **dimensions},
    ):
        pass


def record_projection_lag(workflow: str, lag_ms: int) -> None:
    """Emit ``ProjectionLagMs``: from a transition's commit to its projections being dropped."""
    label = workflow if workflow in ("withdraw", "forget") else "unknown"
    _emit("ProjectionLagMs", "Milliseconds", max(0, lag_ms), {"workflow": label})


def record_outbox_state(*, oldest_age_s: float, pending: int, drained: int) -> None:
    """Emit the outbox drainer's metrics (see the module docstring)."""
    _emit("OutboxOldestAgeSeconds", "Seconds", max(0.0, oldest_age_s), {})
    _emit("OutboxPending", "Count", max(0, pending), {})
    _emit("OutboxDrained", "Count", max(0, drained), {})


def _count(name: str, dimensions: dict[str, str], namespace: str | None = None) -> None:
    _emit(name, "Count", 1, dimensions, namespace)


def _tool_label(tool: str) -> str:
    from engram_memory.engine.context import TOOLS  # the contract's models: not at init

    return tool if tool in TOOLS else "unknown"


def count_admission_outcome(status: str) -> None:
    """Emit ``AdmissionOutcome`` for one answered ``request_admission`` (status from the output)."""
    _count("AdmissionOutcome", {"status": status if status in ADMISSION_STATUSES else "unknown"})


def record_access_denied(denial: Denial) -> None:
    """Log and count one call AWS refused for want of permission (see the module docstring)."""
    service = denial.service if denial.service in AWS_SERVICES else "other"
    operation = denial.operation if _OPERATION.fullmatch(denial.operation) else "unknown"
    code = denial.code if _TOKEN.fullmatch(denial.code) else "unknown"
    request_id = denial.request_id
    if request_id is not None and not _TOKEN.fullmatch(request_id):
        request_id = None
    get_logger().error(
        ACCESS_DENIED_MESSAGE,
        extra={
            "aws_service": service,
            "operation": operation,
            "error_code": code,
            "http_status": denial.status,
            "request_id": request_id,
        },
    )
    _count("AwsAccessDenied", {})
    _count("AwsAccessDenied", {"aws_service": service})


class PowertoolsAuditSink:
    """The cloud ``AuditSink``: one structured log line and one metric per outcome, no content.

    The log line (message ``audit``, level INFO) holds ``audit_id``, ``at`` (RFC 3339, from
    ``at_ms``), ``tenant_id``, ``workspace_id``, ``principal``, ``agent_id``, ``session_id``,
    ``tool``, ``ok``, ``code``, ``target``, ``digests`` and, for an ``INVALID_SCHEMA``,
    ``violation`` (the field and the rule, never a value) — the ``AuditEvent`` and nothing else
    (besides the keys Powertools adds: level, timestamp, service, Lambda context; and the stack's
    ``tenant``).
    """

    def __init__(self, logger: Logger | None = None, *, namespace: str | None = None) -> None:
        self._logger = logger
        self._namespace = namespace

    def record(self, event: AuditEvent) -> None:
        line = event.as_line()
        line["tool"] = _tool_label(event.tool)
        logger = self._logger if self._logger is not None else get_logger()
        logger.info(AUDIT_MESSAGE, extra=line)
        tool = _tool_label(event.tool)
        self._count("ToolCalls", {"tool": tool, "code": event.code})
        if event.code == ErrorCode.GATE_FAILED.value:
            self._count("GateFailed", {"tool": tool})
        if event.code in STORE_FAULT_CODES:
            self._count("StoreFaults", {"code": event.code})

    def _count(self, name: str, dimensions: dict[str, str]) -> None:
        _count(name, dimensions, self._namespace)


if TYPE_CHECKING:
    from engram_memory.engine.ports import AuditSink

    def _conforms(sink: PowertoolsAuditSink) -> AuditSink:
        # Static check only: the class satisfies the engine's port structurally.
        return sink

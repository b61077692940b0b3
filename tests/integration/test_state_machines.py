"""The withdraw and forget state machines, executed: moto runs the ASL of ``infra/statemachines``.

moto's Step Functions interpreter runs each execution in its own thread; its Lambda tasks reach
``functions/workflow/app.py`` in-process (moto cannot run a Lambda without Docker), the tool
functions start and follow the executions through ``WorkflowRuns``, and the approval page
answers the parked task token. Everything else — DynamoDB, KMS, S3, Step Functions — is moto.

The machines are the template's definitions with only ``${WorkflowStepFunctionArn}`` substituted,
except in the timeout test, which shortens the 300 s approval wait to 2 s.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from approval_testing import answer, approval_page, outcome
from aws_testing import TABLE, FakeLambdaContext, signed
from test_mcp_adapter_lambda import adapter_over, modern_call, remembered_then_forget
from test_tool_handlers import (
    Cloud,
    capture_event,
    cloud_on_moto,
    event,
    human_approval,
    load_app,
    remember,
    value_of,
)

from engram_memory.cloud.parked_approvals import ParkedApprovalBook
from engram_memory.cloud.proofs import KmsMacKey
from engram_memory.cloud.workflow_runs import WorkflowRuns
from engram_memory.engine.context import TOOLS

ROOT = Path(__file__).resolve().parents[2]
MACHINES = ROOT / "infra" / "statemachines"
WORKFLOW_ARN = "arn:aws:lambda:us-east-1:123456789012:function:engram-dev-workflow"
APPROVAL_BASE = "https://memory.example.com"
PRINCIPAL = "agent-alice"  # the sample events' principal


class RealClock:
    """Wall-clock time (moto's executions run in real time), shiftable per test."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


class InProcessLambda:
    """The Lambda service as moto's interpreter sees it: ``Invoke`` runs the workflow handler.

    A raised exception becomes a function error whose ``errorType`` is the class name, which is
    what the machines' Retry and Catch match on (as the Python runtime reports it).
    """

    def __init__(self, handler: Callable[[Any, Any], Any]) -> None:
        self.handler = handler
        self.steps: list[str] = []
        self.lock = threading.Lock()

    def invoke(self, *, FunctionName: str, Payload: bytes = b"{}", **_: Any) -> dict[str, Any]:
        assert FunctionName == WORKFLOW_ARN
        payload = json.loads(Payload)
        with self.lock:
            self.steps.append(str(payload.get("step")))
        try:
            result = self.handler(payload, FakeLambdaContext(remaining_ms=60_000))
        except Exception as exc:  # the Lambda runtime's error shape
            body = {"errorType": type(exc).__name__, "errorMessage": str(exc)}
            return {"StatusCode": 200, "FunctionError": "Unhandled", "Payload": _body(body)}
        return {"StatusCode": 200, "Payload": _body(result)}


def _body(value: Any) -> io.BytesIO:
    return io.BytesIO(json.dumps(value).encode("utf-8"))


@dataclass
class Stack:
    cloud: Cloud
    clock: RealClock
    sfn: Any
    machines: dict[str, str]
    lam: InProcessLambda
    tools: dict[str, Any]
    approval: Any

    def invoke(self, tool: str, ev: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = self.tools[tool].handler(
            signed(ev, self.cloud.env, self.cloud.clients["kms"]),
            FakeLambdaContext(remaining_ms=20_000),
        )
        json.dumps(answer)
        return answer

    def executions(self, tool: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.sfn.list_executions(stateMachineArn=self.machines[tool])[
            "executions"
        ]
        return found

    def wait_done(self, tool: str, timeout_s: float = 30.0) -> dict[str, Any]:
        """The one execution of ``tool``, once it has ended."""
        until = time.monotonic() + timeout_s
        while True:
            (execution,) = self.executions(tool)
            described: dict[str, Any] = self.sfn.describe_execution(
                executionArn=execution["executionArn"]
            )
            if described["status"] != "RUNNING" or time.monotonic() > until:
                return described
            time.sleep(0.1)

    def parked_approval_id(self) -> str:
        """The approval id the (one) forget run parked."""
        (execution,) = self.executions("forget")
        approvals = ParkedApprovalBook(self.cloud.clients["dynamodb"], TABLE)
        parked = approvals.for_execution(execution["name"])
        assert parked is not None
        return parked.approval_id

    def answer_page(self, url: str, approve: bool, sub: str = PRINCIPAL) -> dict[str, Any]:
        """``sub``, signed in, opens ``url`` and presses Approve or Decline."""
        approval_id = url.rsplit("/", 1)[1]
        return answer(self.approval, approval_id, "approve" if approve else "decline", sub=sub)


def _definition(tool: str, approval_wait_s: int) -> str:
    text = (MACHINES / f"{tool}.asl.json").read_text(encoding="utf-8")
    text = text.replace("${WorkflowStepFunctionArn}", WORKFLOW_ARN)
    definition = json.loads(text)
    definition["States"]["AwaitApproval"]["TimeoutSeconds"] = approval_wait_s
    return json.dumps(definition)


@pytest.fixture
def stack_factory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Stack]]:
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    with cloud_on_moto(monkeypatch, execute_state_machines=True) as cloud:
        original = lambda_eval_utils.boto_client_for  # type: ignore[attr-defined]  # moto imports it there without re-exporting it

        def build(approval_wait_s: int = 300, approval_base: str = APPROVAL_BASE) -> Stack:
            clock = RealClock()
            engine = cloud.engine(clock=clock)
            dynamodb = cloud.clients["dynamodb"]
            sfn = cloud.session.client("stepfunctions")
            approvals = ParkedApprovalBook(dynamodb, TABLE)
            machines = {
                tool: sfn.create_state_machine(
                    name=f"engram-dev-{tool}",
                    definition=_definition(tool, approval_wait_s),
                    roleArn="arn:aws:iam::123456789012:role/engram-dev-workflow-machine",
                    type="STANDARD",
                )["stateMachineArn"]
                for tool in ("withdraw", "forget")
            }
            workflow = load_app("workflow")
            workflow.handler.loaded().engine = engine
            workflow.handler.loaded().approvals = approvals
            lam = InProcessLambda(workflow.handler)
            tools = {tool: load_app(tool) for tool in TOOLS}
            for tool, app in tools.items():
                app.handler.engine = engine
                if tool in machines:
                    app.handler.use_runs(
                        WorkflowRuns(
                            sfn=sfn,
                            approvals=approvals,
                            state_machine_arn=machines[tool],
                            approval_base_url=approval_base,
                            poll_interval_s=0.05,
                        )
                    )
            approval = approval_page(
                approvals,
                sfn,
                clients=cloud.clients,
                data_key_arn=cloud.env["ENGRAM_DATA_KEY_ARN"],
                now_ms=clock.now_ms,
                proof_key=KmsMacKey(
                    cloud.clients["kms"], cloud.env["ENGRAM_APPROVAL_PROOF_KEY_ARN"]
                ),
            )
            return Stack(cloud, clock, sfn, machines, lam, tools, approval)

        stacks: list[Stack] = []

        def routed(region: str, service: str, state_credentials: Any = None) -> Any:
            if service == "lambda" and stacks:
                return stacks[-1].lam
            return original(region, service, state_credentials)

        def factory(**kwargs: Any) -> Stack:
            stacks.append(build(**kwargs))
            return stacks[-1]

        with mock.patch.object(lambda_eval_utils, "boto_client_for", routed):
            yield factory


@pytest.fixture
def stack(stack_factory: Callable[..., Stack]) -> Stack:
    return stack_factory()


def carried_approval(
    answer: dict[str, Any], *, approved_ago_ms: int, now_ms: int
) -> dict[str, Any]:
    """The approval the MCP adapter obtains from the human (form mode) for this request."""
    approved_at = now_ms - approved_ago_ms
    return human_approval(answer, issued_at_ms=approved_at - 1_000, approved_at_ms=approved_at)


def _record(stack: Stack, text: str) -> str:
    return remember(stack.invoke, text, "key-" + uuid.uuid4().hex[:12])[1]


# --------------------------------------------------------------------------------------------


def test_url_mode_approval_runs_the_forget_to_complete(stack: Stack) -> None:
    record_id = _record(stack, "The nightly backup runs at 02:00 UTC from the replica.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-url-000001")

    asked = stack.invoke("forget", forget)

    # the first call starts the run and answers with this run's approval page
    needed = asked["confirmation_required"]
    assert needed["tool"] == "forget" and needed["target"] == record_id
    assert needed["approval_url"] == f"{APPROVAL_BASE}/approvals/{needed['approval_id']}"
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True  # nothing yet
    assert stack.answer_page(needed["approval_url"], approve=True)["statusCode"] == 200

    done = stack.wait_done("forget")
    retried = value_of(
        "forget", stack.invoke("forget", {**forget, "audit_id": event("get")["audit_id"]})
    )

    assert done["status"] == "SUCCEEDED", done
    output = json.loads(done["output"])
    assert output["commit"]["result"]["envelope"]["ok"] is True
    assert output["tail"]["result"] == {"projections": "complete", "keys": "complete"}
    # the run committed it; the retry is the first success the agent sees: no replay for it
    assert retried["replayed"] is False
    assert retried["receipt"]["to_state"] == "tombstoned"
    assert retried["projection_invalidation"] == "complete"
    assert stack.invoke("get", event("get", record_id=record_id))["error"]["code"] == "NOT_FOUND"
    again = value_of("forget", stack.invoke("forget", forget))
    assert again["replayed"] is True and again["receipt"] == retried["receipt"]
    assert stack.lam.steps == ["await_approval", "commit_transition", "finish_tail"]


def test_form_mode_approval_carried_by_the_adapter_commits_in_the_run(stack: Stack) -> None:
    captured = value_of(
        "capture",
        stack.invoke("capture", capture_event("Draft: rotate the signing keys.", "c" * 16)),
    )
    withdraw = event("withdraw", candidate_id=captured["candidate_id"], idempotency_key="w" * 16)
    asked = stack.invoke("withdraw", withdraw)
    approval = carried_approval(asked, approved_ago_ms=0, now_ms=stack.clock.now_ms())

    answered = value_of("withdraw", stack.invoke("withdraw", {**withdraw, "approval": approval}))

    assert answered["replayed"] is False  # this call brought the approval that committed it
    assert answered["receipt"]["to_state"] == "withdrawn"
    done = stack.wait_done("withdraw")
    assert done["status"] == "SUCCEEDED"
    assert json.loads(done["output"])["tail"]["result"] == {
        "projections": "complete",
        "keys": "complete",
    }
    assert value_of("withdraw", stack.invoke("withdraw", withdraw))["key_destruction"] == "complete"


def test_a_declined_approval_ends_the_run_and_the_call_answers_gate_failed(stack: Stack) -> None:
    record_id = _record(stack, "Deploys freeze on Fridays after 15:00.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-declined-1")
    url = stack.invoke("forget", forget)["confirmation_required"]["approval_url"]

    assert stack.answer_page(url, approve=False)["statusCode"] == 200
    done = stack.wait_done("forget")

    assert done["status"] == "SUCCEEDED"  # a human decision, not a failed execution
    assert json.loads(done["output"])["outcome"] == "not_approved"
    assert stack.invoke("forget", forget)["error"]["code"] == "gate_failed"
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True
    assert "commit_transition" not in stack.lam.steps


def test_an_approval_that_never_comes_times_out_to_gate_failed(
    stack_factory: Callable[..., Stack],
) -> None:
    # long enough for the execution to park its token on a loaded machine before it times out
    stack = stack_factory(approval_wait_s=6)
    record_id = _record(stack, "The on-call rotation changes on Mondays.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-timeout-1")
    assert "confirmation_required" in stack.invoke("forget", forget)

    done = stack.wait_done("forget")

    assert done["status"] == "SUCCEEDED"
    output = json.loads(done["output"])
    assert output["outcome"] == "not_approved"
    assert output["error"]["Error"] == "States.Timeout"
    assert stack.invoke("forget", forget)["error"]["code"] == "gate_failed"
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True
    # a human who answers after the run stopped waiting is told so, and nothing happens
    url = f"{APPROVAL_BASE}/approvals/{stack.parked_approval_id()}"
    assert stack.answer_page(url, approve=True)["statusCode"] == 410
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True


def test_a_form_approval_after_the_wait_timed_out_is_gate_failed(
    stack_factory: Callable[..., Stack],
) -> None:
    stack = stack_factory(approval_wait_s=1)
    record_id = _record(stack, "Release notes are drafted by the release captain.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-too-late-01")
    asked = stack.invoke("forget", forget)
    assert stack.wait_done("forget")["status"] == "SUCCEEDED"  # not_approved: nobody answered
    approval = carried_approval(asked, approved_ago_ms=0, now_ms=stack.clock.now_ms())

    answered = stack.invoke("forget", {**forget, "approval": approval})

    assert answered["error"]["code"] == "gate_failed"
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True


def test_an_execution_started_past_the_30_s_window_is_gate_failed(stack: Stack) -> None:
    record_id = _record(stack, "Staging certificates are renewed by the cert bot.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-late-0001")
    asked = stack.invoke("forget", forget)
    stale = carried_approval(asked, approved_ago_ms=31_000, now_ms=stack.clock.now_ms())

    answered = stack.invoke("forget", {**forget, "approval": stale})

    assert answered["error"]["code"] == "gate_failed"
    done = stack.wait_done("forget")
    assert json.loads(done["output"])["error"]["Error"] == "ApprovalWindowExpired"
    # the commit step's window check refused it before the use case ran; no tail step
    assert stack.lam.steps == ["await_approval", "commit_transition"]
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True


def test_a_retried_call_never_starts_a_second_run(stack: Stack) -> None:
    record_id = _record(stack, "Feature flags are cleaned up every quarter.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-retry-0001")

    first = stack.invoke("forget", forget)["confirmation_required"]
    again = stack.invoke("forget", {**forget, "audit_id": event("get")["audit_id"]})[
        "confirmation_required"
    ]

    assert again["approval_id"] == first["approval_id"]  # the same run, the same page
    assert len(stack.executions("forget")) == 1
    stack.answer_page(first["approval_url"], approve=True)
    stack.wait_done("forget")

    # two racing retries after the commit: both read the one committed receipt
    results: list[dict[str, Any]] = []
    racers = [
        threading.Thread(target=lambda: results.append(stack.invoke("forget", forget)))
        for _ in range(2)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert [value_of("forget", r)["receipt"]["cursor"] for r in results] == [
        results[0]["output"]["value"]["receipt"]["cursor"]
    ] * 2
    assert len(stack.executions("forget")) == 1
    assert stack.lam.steps.count("commit_transition") == 1


def test_the_same_key_for_other_arguments_is_a_digest_conflict(stack: Stack) -> None:
    first = _record(stack, "Use the EU region for customer data.")
    second = _record(stack, "Keep audit logs for seven years.")
    stack.invoke("forget", event("forget", record_id=first, idempotency_key="forget-conflict1"))

    answered = stack.invoke(
        "forget", event("forget", record_id=second, idempotency_key="forget-conflict1")
    )

    assert answered["error"]["code"] == "DIGEST_CONFLICT"
    assert len(stack.executions("forget")) == 1


def test_only_the_principal_may_answer_the_page(stack: Stack) -> None:
    record_id = _record(stack, "Backups are encrypted with the vault key.")
    url = stack.invoke("forget", event("forget", record_id=record_id))["confirmation_required"][
        "approval_url"
    ]

    refused = stack.answer_page(url, approve=True, sub="agent-mallory")
    assert refused["statusCode"] == 403 and outcome(refused) == "forbidden"
    assert (
        stack.sfn.describe_execution(executionArn=stack.executions("forget")[0]["executionArn"])[
            "status"
        ]
        == "RUNNING"
    )


# --------------------------------------------------------------------------------------------
# Through the MCP adapter: the confirmation as the agent's client sees it
# --------------------------------------------------------------------------------------------


def test_a_2025_11_25_client_gets_a_url_elicitation_and_its_retry_the_receipt(
    stack: Stack,
) -> None:
    adapter = adapter_over(stack.cloud, stack.tools, clock=stack.clock)
    record_id, forget = remembered_then_forget(
        adapter, "The VPN config lives in the ops repo.", "url-a"
    )

    asked = adapter.call("forget", forget)

    error = asked["error"]
    assert error["code"] == -32042, asked  # URL elicitation required
    (elicitation,) = error["data"]["elicitations"]
    assert elicitation["mode"] == "url"
    assert elicitation["url"].startswith(f"{APPROVAL_BASE}/approvals/apr_")
    assert elicitation["elicitationId"] == elicitation["url"].rsplit("/", 1)[1]
    assert "forget" in elicitation["message"] and record_id in elicitation["message"]
    assert stack.answer_page(elicitation["url"], approve=True)["statusCode"] == 200
    stack.wait_done("forget")

    done = adapter.call("forget", forget)["result"]["structuredContent"]

    assert done["ok"] is True, done
    assert done["output"]["value"]["receipt"]["to_state"] == "tombstoned"
    assert done["output"]["value"]["projection_invalidation"] == "complete"
    gone = adapter.call("get", {"record_id": record_id, "purpose_ref": "purpose:general"})
    assert gone["result"]["structuredContent"]["error"]["code"] == "NOT_FOUND"


def test_a_2026_07_28_client_that_opens_urls_gets_the_page_as_input_required(
    stack: Stack,
) -> None:
    adapter = adapter_over(stack.cloud, stack.tools, clock=stack.clock)
    _, forget = remembered_then_forget(adapter, "Rotate the webhook secret yearly.", "url-b")
    both: dict[str, Any] = {"form": {}, "url": {}}

    asked = modern_call(adapter, "forget", forget, elicitation=both)

    request = asked["inputRequests"]["engram_confirmation"]
    assert request["method"] == "elicitation/create"
    assert request["params"]["mode"] == "url"
    url = request["params"]["url"]
    stack.answer_page(url, approve=True)
    stack.wait_done("forget")
    accepted = {"engram_confirmation": {"action": "accept"}}  # the user opened the page
    done = modern_call(adapter, "forget", forget, elicitation=both, inputResponses=accepted)
    assert done["structuredContent"]["ok"] is True, done
    assert done["structuredContent"]["output"]["value"]["receipt"]["to_state"] == "tombstoned"


def test_a_form_only_client_confirms_in_a_round_trip_and_the_run_commits(stack: Stack) -> None:
    adapter = adapter_over(stack.cloud, stack.tools, clock=stack.clock)
    _, forget = remembered_then_forget(adapter, "Archive the 2024 incident reports.", "form-c")

    asked = modern_call(adapter, "forget", forget)
    assert asked["inputRequests"]["engram_confirmation"]["params"].get("mode", "form") == "form"
    approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
    done = modern_call(
        adapter, "forget", forget, inputResponses=approve, requestState=asked["requestState"]
    )

    value = done["structuredContent"]["output"]["value"]
    assert value["receipt"]["to_state"] == "tombstoned" and value["replayed"] is False
    assert stack.wait_done("forget")["status"] == "SUCCEEDED"
    assert stack.lam.steps.count("commit_transition") == 1
    # one invocation of the tool function per MCP request, one execution for the operation
    forget_calls = [c for c in adapter.lam.calls if c["payload"]["tool"] == "forget"]
    assert len(forget_calls) == 2
    assert "approval" not in forget_calls[0]["payload"]
    assert forget_calls[1]["payload"]["approval"]["operation_digest"]
    assert len(stack.executions("forget")) == 1


def test_url_and_form_mode_report_the_first_success_alike(stack: Stack) -> None:
    adapter = adapter_over(stack.cloud, stack.tools, clock=stack.clock)
    _, by_form = remembered_then_forget(adapter, "The on-call rota lives in the wiki.", "same-f")
    asked = modern_call(adapter, "forget", by_form)
    assert "requestState" in asked, asked
    approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
    form = modern_call(
        adapter, "forget", by_form, inputResponses=approve, requestState=asked["requestState"]
    )["structuredContent"]["output"]["value"]

    _, by_url = remembered_then_forget(adapter, "Staging resets every Monday.", "same-u")
    url = adapter.call("forget", by_url)["error"]["data"]["elicitations"][0]["url"]
    stack.answer_page(url, approve=True)
    # the retry waits (bounded by its deadline) for the run's commit
    page = adapter.call("forget", by_url)["result"]["structuredContent"]["output"]["value"]

    assert form["replayed"] is page["replayed"] is False
    for forget in (by_form, by_url):  # and every later answer is a replay
        later = adapter.call("forget", forget)["result"]["structuredContent"]["output"]["value"]
        assert later["replayed"] is True


# --------------------------------------------------------------------------------------------
# What one forget costs, counted (issue 10's note prints these with ``pytest -s``)
# --------------------------------------------------------------------------------------------


class Counted:
    """Wraps a callable and counts its calls (and, for ``Engine.handle``, those with an approval)."""

    def __init__(self, wrapped: Callable[..., Any]) -> None:
        self.wrapped = wrapped
        self.calls = 0
        self.with_approval = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if (len(args) > 3 and args[3] is not None) or kwargs.get("approval") is not None:
            self.with_approval += 1
        return self.wrapped(*args, **kwargs)


@pytest.mark.parametrize("mode", ["form", "url"])
def test_a_forget_costs_one_invocation_per_request_and_one_use_case_run_to_commit(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    adapter = adapter_over(stack.cloud, stack.tools, clock=stack.clock)
    _, forget = remembered_then_forget(adapter, f"Counted forget in {mode} mode.", f"count{mode}")
    engine = stack.tools["forget"].handler.engine
    handle, starts = Counted(engine.handle), Counted(stack.sfn.start_execution)
    monkeypatch.setattr(engine, "handle", handle)
    monkeypatch.setattr(stack.sfn, "start_execution", starts)
    requests = Counted(adapter.handler)
    adapter.handler = requests  # type: ignore[assignment]
    page = Counted(stack.approval._entry)  # every invocation of the approval function
    monkeypatch.setattr(stack.approval, "_entry", page)
    adapter.lam.calls.clear()
    stack.lam.steps.clear()

    if mode == "form":  # a 2026-07-28 client without URL mode: a form round trip
        asked = modern_call(adapter, "forget", forget)
        approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
        done = modern_call(
            adapter, "forget", forget, inputResponses=approve, requestState=asked["requestState"]
        )["structuredContent"]
    else:  # a 2025-11-25 client: -32042, the human answers on the page, the client retries
        url = adapter.call("forget", forget)["error"]["data"]["elicitations"][0]["url"]
        assert stack.answer_page(url, approve=True)["statusCode"] == 200
        stack.wait_done("forget")
        done = adapter.call("forget", forget)["result"]["structuredContent"]
    assert stack.wait_done("forget")["status"] == "SUCCEEDED"

    counts = {
        "MCP requests": requests.calls,
        "forget function invocations": len(adapter.lam.calls),
        "approval function invocations": page.calls,
        "StartExecution calls": starts.calls,
        "executions": len(stack.executions("forget")),
        "workflow step invocations": len(stack.lam.steps),
        "Engine.handle runs": handle.calls,
        "Engine.handle runs with an approval (commits)": handle.with_approval,
    }
    print(f"\n{mode}-mode forget: " + json.dumps(counts))
    assert done["ok"] is True and done["output"]["value"]["replayed"] is False
    assert counts == {
        "MCP requests": 2,
        "forget function invocations": 2,  # one per MCP request
        # the signed-in person opens the page (its CSRF token) and presses Approve
        "approval function invocations": 2 if mode == "url" else 0,
        "StartExecution calls": 1,
        "executions": 1,
        "workflow step invocations": 3,  # await_approval, commit_transition, finish_tail
        "Engine.handle runs": 3,  # one per request (up to the gate), one to commit
        "Engine.handle runs with an approval (commits)": 1,
    }
    assert stack.lam.steps == ["await_approval", "commit_transition", "finish_tail"]


def test_a_new_request_is_announced_once_without_the_memorys_text(stack: Stack) -> None:
    """Whatever the agent's client can show, the stack's approval topic tells the people
    subscribed to it (e-mail, chat) that a request waits: the operation, who asks, the page;
    never the memory's text. A retried call (the same run) announces nothing again."""
    from engram_memory.cloud.parked_approvals import ApprovalTopic

    sns, sqs = stack.cloud.session.client("sns"), stack.cloud.session.client("sqs")
    topic = sns.create_topic(Name="engram-dev-approval-requests")["TopicArn"]
    queue = sqs.create_queue(QueueName="approver-inbox")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn["Attributes"]["QueueArn"])
    stack.tools["forget"].handler.runs.topic = ApprovalTopic(sns, topic)
    text = "The vault recovery phrase lives in the red binder."
    record_id = _record(stack, text)
    forget = event("forget", record_id=record_id, idempotency_key="forget-announce-01")

    needed = stack.invoke("forget", forget)["confirmation_required"]
    stack.invoke("forget", {**forget, "audit_id": event("get")["audit_id"]})  # the agent retries

    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    (notice,) = [json.loads(m["Body"]) for m in messages]
    assert notice["Subject"] == "Engram Memory: approve a forget?"
    body = notice["Message"]
    assert needed["approval_url"] in body and PRINCIPAL in body and record_id in body
    assert "red binder" not in body and "recovery phrase" not in body


def test_a_decline_in_the_clients_form_ends_the_run_at_once(stack: Stack) -> None:
    """The adapter hands the function a decline of the form (signed, with the call's
    arguments): the function spends the question and ends the run (``ApprovalDeclined``)
    instead of leaving it to wait out its 300 s; the retry is gate_failed, nothing forgotten."""
    record_id = _record(stack, "Badge readers are re-keyed after every office move.")
    forget = event("forget", record_id=record_id, idempotency_key="forget-form-decline")
    asked = stack.invoke("forget", forget)
    approval = carried_approval(asked, approved_ago_ms=0, now_ms=stack.clock.now_ms())

    declined = stack.invoke("forget", {**forget, "approval": approval, "declined": True})
    done = stack.wait_done("forget", timeout_s=20.0)

    assert declined["error"]["code"] == "gate_failed"
    assert done["status"] == "SUCCEEDED"  # ended now, not after the 300 s wait
    assert json.loads(done["output"])["outcome"] == "not_approved"
    assert stack.invoke("get", event("get", record_id=record_id))["ok"] is True
    assert "commit_transition" not in stack.lam.steps

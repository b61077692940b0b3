"""The workflow steps, the approval page and the outbox drainer, invoked like the state machine,
the HTTP API or the EventBridge schedule would.

moto does not run the ASL: the steps are called in the machine's order with the
``events/workflow_*.json`` events, ``SendTaskSuccess``/``SendTaskFailure`` go to a recording
fake, and the execution-name idempotency runs against moto's Step Functions with the real ASL.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from approval_testing import (
    PROOF_KEY,
    PageContext,
    answer,
    approval_page,
    outcome,
    page_event,
    session_of,
)
from aws_testing import BUCKET, REGION, TABLE, FakeLambdaContext, MemoryLexicalIndex, moto_aws
from test_tool_handlers import EVENTS, ROOT, load_app

from engram_memory.adapters.aws.dynamo_store import create_bucket, create_tables
from engram_memory.adapters.aws.kms_vault import create_key_table
from engram_memory.cloud.approval_page import ApprovalHandler
from engram_memory.cloud.composition import build_engine
from engram_memory.cloud.drainer import DrainerHandler
from engram_memory.cloud.parked_approvals import (
    ApprovalWindowExpired,
    GateFailed,
    ParkedApprovalBook,
    WorkflowRequest,
    execution_name,
    start_confirmed_execution,
)
from engram_memory.cloud.proofs import FixedMacKey, invocation_mac
from engram_memory.cloud.settings import HostBinding
from engram_memory.cloud.tool_handler import DeferredHandler, deferred_handler
from engram_memory.cloud.tool_invocation import ToolInvocation
from engram_memory.cloud.workflow import WorkflowHandler
from engram_memory.engine.context import Scope, TrustedContext
from engram_memory.engine.gate import ConfirmationNeeded
from engram_memory.engine.ports import (
    ChangeSet,
    IndexUnavailable,
    LedgerEntry,
    OutboxItem,
    ProjectionChange,
)
from engram_memory.engine.service import Engine, new_audit_id

from engram_testing import FakeClock, handled, sha

KEY_TABLE = "engram-keys"
TENANT = "dev"
INVOCATION_KEY = FixedMacKey(b"invocation-key-for-tests-0123456789abcdef")
INVOCATION_KEY_ARN = "arn:aws:kms:us-east-1:123456789012:key/00000000-0000-0000-0000-0000000000bb"


def adapter_signed(invocation: dict[str, Any]) -> dict[str, Any]:
    """The invocation as the adapter sends it: with its MAC (``cloud.proofs``)."""
    event = ToolInvocation.model_validate(invocation).to_event()
    event.pop("proof", None)
    return {**event, "proof": invocation_mac(INVOCATION_KEY, event)}


def load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


@dataclass
class FakeSfn:
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def send_task_success(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("SendTaskSuccess", kwargs))
        return {}

    def send_task_failure(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(("SendTaskFailure", kwargs))
        return {}


@dataclass
class World:
    engine: Engine
    clock: FakeClock
    dynamodb: Any
    workflow: Any
    approval: Any
    sfn: FakeSfn
    drainer: Any
    index: MemoryLexicalIndex


def _context() -> FakeLambdaContext:
    return FakeLambdaContext.of("engram-dev-workflow", remaining_ms=60_000)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    with moto_aws():
        session = boto3.session.Session(region_name=REGION)
        dynamodb, s3 = session.client("dynamodb"), session.client("s3")
        kms, secrets = session.client("kms"), session.client("secretsmanager")
        create_tables(dynamodb, TABLE)
        create_key_table(dynamodb, KEY_TABLE)
        create_bucket(s3, BUCKET, REGION)
        key_arn = kms.create_key()["KeyMetadata"]["Arn"]
        secret = secrets.create_secret(Name="cursor", SecretString="c" * 64)
        env = {
            "AWS_REGION": REGION,
            "ENGRAM_TABLE": TABLE,
            "ENGRAM_OPENSEARCH_ENDPOINT": "https://search-engram-dev.us-east-1.es.amazonaws.com",
            "ENGRAM_KEY_TABLE": KEY_TABLE,
            "ENGRAM_BLOB_BUCKET": BUCKET,
            "ENGRAM_DATA_KEY_ARN": key_arn,
            "ENGRAM_TENANT_ID": TENANT,
            "ENGRAM_CURSOR_SECRET_ARN": secret["ARN"],
            "ENGRAM_INVOCATION_KEY_ARN": INVOCATION_KEY_ARN,
            "ENGRAM_APPROVAL_PROOF_KEY_ARN": INVOCATION_KEY_ARN,
        }
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        clock = FakeClock()
        index = MemoryLexicalIndex()
        engine = build_engine(
            env,
            dynamodb_client=dynamodb,
            s3_client=s3,
            kms_client=kms,
            secrets_client=secrets,
            lexical_index=index,
            clock=clock,
        )
        store = ParkedApprovalBook(dynamodb, TABLE)
        workflow, sfn = load_app("workflow"), FakeSfn()
        workflow.handler.loaded().engine = engine
        workflow.handler.loaded().approvals = store
        workflow.handler.loaded().invocation_key = INVOCATION_KEY
        workflow.handler.loaded().proof_key = PROOF_KEY
        approval = approval_page(
            store,
            sfn,
            clients={"dynamodb": dynamodb, "s3": s3, "kms": kms},
            data_key_arn=key_arn,
            now_ms=clock.now_ms,
        )
        drainer = load_app("outbox_drainer")
        drainer.handler.loaded().engine = engine
        yield World(engine, clock, dynamodb, workflow, approval, sfn, drainer, index)


def pending_candidate(world: World, text: str = "Draft note captured by mistake.") -> str:
    sample = json.loads((EVENTS / "capture.json").read_text(encoding="utf-8"))
    sample["audit_id"] = new_audit_id()
    payload = copy.deepcopy(sample["arguments"]["payload"])
    payload["components"][0]["text"] = text
    payload["citations"][0]["content_digest"] = sha(text)
    sample["arguments"].update(
        idempotency_key=sha(text)[-16:],
        payload=payload,
        evidence={**sample["arguments"]["evidence"], "evidence_digest": sha("evidence:" + text)},
    )
    invocation = ToolInvocation.model_validate(sample)
    ctx = invocation.trusted_context(HostBinding(TENANT))
    envelope = handled(world.engine, "capture", invocation.arguments, ctx)
    assert envelope["ok"] is True, envelope
    candidate: str = envelope["output"]["value"]["candidate_id"]
    return candidate


def withdraw_events(world: World) -> dict[str, dict[str, Any]]:
    """The three step events for withdrawing a fresh pending candidate."""
    candidate_id = pending_candidate(world)
    base = load("workflow_await_approval")
    request = base["request"]
    request["invocation"]["audit_id"] = new_audit_id()
    request["invocation"]["arguments"]["candidate_id"] = candidate_id
    request["target"] = candidate_id
    # The operation digest the tool function computed: the engine's own, via a pending round.
    invocation = WorkflowRequest.model_validate(request).invocation
    pending = world.engine.handle(
        "withdraw", invocation.arguments, invocation.trusted_context(HostBinding(TENANT))
    )
    assert isinstance(pending, ConfirmationNeeded)
    request["operation_digest"] = pending.request.operation_digest
    request["invocation"] = adapter_signed(request["invocation"])
    steps = {}
    for step in ("await_approval", "commit_transition", "finish_tail"):
        steps[step] = {**load(f"workflow_{step}"), "request": request}
    steps["await_approval"]["execution_name"] = execution_name("withdraw", "ledger-" + candidate_id)
    return steps


def post(world: World, approval_id: str, approve: bool) -> dict[str, Any]:
    """The principal, signed in, presses Approve or Decline on the page."""
    return answer(
        world.approval, approval_id, "approve" if approve else "decline", sub="agent-alice"
    )


def approve(world: World, steps: dict[str, dict[str, Any]]) -> dict[str, Any]:
    parked = world.workflow.handler(steps["await_approval"], _context())
    signed_in = [session_of(world.approval, "agent-alice")]
    page = world.approval(page_event(parked["approval_id"], cookies=signed_in), PageContext())
    assert page["statusCode"] == 200 and "withdraw" in page["body"]
    # withdraw in the cloud: the candidate's digest and capture time, never its text
    assert "Draft note" not in page["body"]
    assert "Its text is not shown here" in page["body"] and "Captured" in page["body"]
    world.clock.advance(5_000)
    assert post(world, parked["approval_id"], True)["statusCode"] == 200
    name, call = world.sfn.calls[-1]
    assert name == "SendTaskSuccess" and call["taskToken"] == steps["await_approval"]["task_token"]
    approval: dict[str, Any] = json.loads(call["output"])
    return approval


def test_a_withdraw_runs_through_the_steps(world: World) -> None:
    steps = withdraw_events(world)
    approval = approve(world, steps)
    assert approval["approval"]["approved_at_ms"] == world.clock.now_ms()
    assert approval["channel"] == "page" and approval["approver"] == "agent-alice"

    handler, ctx = world.workflow.handler, _context()
    world.clock.advance(2_000)
    committed = handler({**steps["commit_transition"], "approval": approval}, ctx)
    envelope = committed["envelope"]
    assert envelope["ok"] is True, envelope
    assert envelope["output"]["value"]["receipt"]["to_state"] == "withdrawn"
    assert committed["committed_at_ms"] == world.clock.now_ms()
    commit = {"commit": committed}
    assert handler({**steps["finish_tail"], **commit}, ctx) == {
        "projections": "complete",
        "keys": "complete",
    }
    assert world.engine.store.outbox_pending(10) == []
    assert _journaled_why(world, steps) == "agent-alice on the approval page"


def _journaled_why(world: World, steps: dict[str, dict[str, Any]]) -> str:
    """Who approved the run's commit, as the candidate's history shows it (issue 38, item 2),
    checking it also names the agent and its reason_ref."""
    from engram_memory.operator_plane.inspection import record_history

    request = steps["commit_transition"]["request"]
    scope = Scope(TENANT, "ws-research-0001")
    step = record_history(world.engine, scope, request["target"], "ops-ana")[-1]
    reason = request["invocation"]["arguments"]["reason_ref"]
    assert (step["operation"], step["reason"]) == ("withdraw", reason)
    assert step["actor"] == request["invocation"]["context"]["principal"]
    approver: str = step["approved_by"]
    return approver


def _refused(world: World, steps: dict[str, dict[str, Any]], answer: Any) -> None:
    """Completing the wait with ``answer`` commits nothing: the run ends NotApproved."""
    with pytest.raises(GateFailed):
        world.workflow.handler({**steps["commit_transition"], "approval": answer}, _context())
    candidate = steps["commit_transition"]["request"]["target"]
    scope = Scope(TENANT, "ws-research-0001")
    row = world.engine.store.candidate_get(scope, candidate)
    assert row is not None and row.state == "pending"  # nothing committed


def test_only_the_pages_proof_completes_the_wait(world: World) -> None:
    """A stolen task token with a forged ``SendTaskSuccess`` (the bare approval, or a proof
    made with another key), a proof for another operation or another approval, and a form
    answer nobody attested all end the run without a commit; the page's own proof commits."""
    steps = withdraw_events(world)
    proof = approve(world, steps)
    world.clock.advance(1_000)
    forged_key = FixedMacKey(b"a key the attacker made up for itself-0123")
    other_intent = {**proof["approval"], "operation_digest": "sha256:" + "e" * 64}
    other_approval = {**proof["approval"], "approval_id": "apr_" + "e" * 32}

    _refused(world, steps, proof["approval"])  # the former output: an approval, no proof
    _refused(world, steps, {**proof, "mac": invocation_mac(forged_key, proof)})
    _refused(world, steps, {**proof, "approval": other_intent})
    _refused(world, steps, {**proof, "approval": other_approval})
    _refused(world, steps, {**proof, "approver": "someone-else"})
    _refused(world, steps, {**proof, "channel": "form"})  # a page proof is no form attestation
    _refused(world, steps, {"approve": True})
    _refused(world, steps, ["not", "a", "proof"])  # any JSON completes a task token
    _refused(world, steps, "approved")

    committed = world.workflow.handler(
        {**steps["commit_transition"], "approval": proof}, _context()
    )
    assert committed["envelope"]["ok"] is True


def test_a_call_the_adapter_did_not_sign_never_commits_in_a_run(world: World) -> None:
    """Someone who may start executions starts one with a context of their choosing: even
    with a person's proof for that operation, the commit step refuses the unsigned call."""
    steps = withdraw_events(world)
    proof = approve(world, steps)
    request = steps["commit_transition"]["request"]
    forged = {**request, "invocation": {**request["invocation"], "proof": None}}
    with pytest.raises(GateFailed):
        world.workflow.handler(
            {**steps["commit_transition"], "request": forged, "approval": proof}, _context()
        )


def test_a_host_that_requires_the_page_refuses_form_answers_in_the_run(world: World) -> None:
    from engram_memory.cloud.proofs import attest_form, form_proof
    from engram_memory.engine.gate import Approval

    steps = withdraw_events(world)
    proof = approve(world, steps)
    approval = Approval.model_validate(proof["approval"])
    attested = form_proof(approval, attest_form(INVOCATION_KEY, approval)).model_dump(mode="json")
    handler = world.workflow.handler.loaded()
    handler.settings = handler.settings.model_copy(update={"approval_page_required": True})
    _refused(world, steps, attested)
    handler.settings = handler.settings.model_copy(update={"approval_page_required": False})
    committed = world.workflow.handler(
        {**steps["commit_transition"], "approval": attested}, _context()
    )
    assert committed["envelope"]["ok"] is True
    assert _journaled_why(world, steps) == "form answered by the client"


def test_a_declined_approval_fails_the_task(world: World) -> None:
    steps = withdraw_events(world)
    parked = world.workflow.handler(steps["await_approval"], _context())
    assert post(world, parked["approval_id"], False)["statusCode"] == 200
    name, call = world.sfn.calls[-1]
    assert name == "SendTaskFailure" and call["error"] == "ApprovalDeclined"


def test_a_late_approval_expires_the_window(world: World) -> None:
    steps = withdraw_events(world)
    approval = approve(world, steps)
    world.clock.advance(30_001)
    with pytest.raises(ApprovalWindowExpired):
        world.workflow.handler({**steps["commit_transition"], "approval": approval}, _context())


def test_an_approval_is_answered_once(world: World) -> None:
    steps = withdraw_events(world)
    approval_id = approve(world, steps)["approval"]["approval_id"]
    assert outcome(post(world, approval_id, True)) == "answered"
    assert outcome(post(world, approval_id, False)) == "answered"
    assert outcome(post(world, "apr_" + "f" * 32, True)) == "not_found"
    assert len(world.sfn.calls) == 1


def test_the_same_ledger_key_starts_one_execution(world: World) -> None:
    sfn = boto3.client("stepfunctions", region_name=REGION)
    definition = (ROOT / "infra/statemachines/withdraw.asl.json").read_text(encoding="utf-8")
    definition = definition.replace(
        "${WorkflowStepFunctionArn}",
        "arn:aws:lambda:us-east-1:123456789012:function:engram-dev-workflow",
    )
    arn = sfn.create_state_machine(
        name="engram-dev-withdraw",
        definition=definition,
        roleArn="arn:aws:iam::123456789012:role/engram-dev-withdraw",
    )["stateMachineArn"]
    request = WorkflowRequest.model_validate(load("workflow_await_approval")["request"])
    key = "dev#ws-research-0001#agent-alice#withdraw-2026-12-02-0001"

    first = start_confirmed_execution(sfn, arn, ledger_key=key, request=request)
    again = start_confirmed_execution(sfn, arn, ledger_key=key, request=request)

    assert first == again
    executions = sfn.list_executions(stateMachineArn=arn)["executions"]
    assert [e["name"] for e in executions] == [execution_name("withdraw", key)]
    assert len(executions[0]["name"]) <= 80


def test_a_bearer_token_no_longer_answers_a_confirmation(world: World) -> None:
    # the former API: an approval-audience (or the agent's) JWT and {"approve": true}. Only a
    # person signed in at the page, with its form's CSRF token, answers now.
    steps = withdraw_events(world)
    parked = world.workflow.handler(steps["await_approval"], _context())
    event = load("approval_post")
    event["pathParameters"]["approvalId"] = parked["approval_id"]
    event["requestContext"]["authorizer"] = {"jwt": {"claims": {"sub": "agent-alice"}}}
    event["headers"] = {"content-type": "application/json", "authorization": "Bearer x.y.z"}
    event["body"] = json.dumps({"approve": True})

    refused = world.approval(event, PageContext())

    assert refused["statusCode"] == 401 and outcome(refused) == "sign_in"
    assert world.sfn.calls == []  # the task token is untouched ...
    assert post(world, parked["approval_id"], True)["statusCode"] == 200  # ... for the person


def test_the_invalidation_step_reports_the_projection_lag(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = withdraw_events(world)
    committed_at = world.clock.now_ms()
    world.clock.advance(1_500)
    capsys.readouterr()

    world.workflow.handler(
        {**steps["finish_tail"], "commit": {"committed_at_ms": committed_at}},
        _context(),
    )

    documents = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    lags = [d for d in documents if "ProjectionLagMs" in d]
    assert len(lags) == 1, documents
    (definition,) = lags[0]["_aws"]["CloudWatchMetrics"]
    assert definition["Metrics"] == [{"Name": "ProjectionLagMs", "Unit": "Milliseconds"}]
    assert lags[0]["ProjectionLagMs"] == [1500.0]
    assert lags[0]["workflow"] == "withdraw"
    assert lags[0]["tenant"] == TENANT  # the stack's series only (the dashboard selects it)
    assert definition["Dimensions"] == [["service", "tenant", "workflow"]]


# --------------------------------------------------------------------------------------------
# The outbox: the workflow's drain is the scope's own; the scheduled drainer; reindex
# --------------------------------------------------------------------------------------------

SAMPLE_SCOPE = Scope(TENANT, "ws-research-0001")  # the scope of the events/ samples


def sample_context() -> TrustedContext:
    sample = load("capture")
    sample["audit_id"] = new_audit_id()
    return ToolInvocation.model_validate(sample).trusted_context(HostBinding(TENANT))


def admitted_record(world: World, text: str) -> str:
    candidate_id = pending_candidate(world, text)
    envelope = handled(
        world.engine,
        "request_admission",
        {"candidate_id": candidate_id, "idempotency_key": sha(text)[-20:]},
        sample_context(),
    )
    assert envelope["ok"], envelope
    record_id: str = envelope["output"]["value"]["outcome"]["record_id"]
    return record_id


def search_ids(world: World, query: str) -> list[str]:
    envelope = handled(
        world.engine, "search", {"query": query, "purpose_ref": "purpose:general"}, sample_context()
    )
    assert envelope["ok"], envelope
    return [p["record"]["record_id"] for p in envelope["output"]["value"]["records"]]


def queue_other_scopes_items(world: World, count: int) -> None:
    """``count`` key destructions of another workspace, queued ahead of (sorting before) any
    projection item: more than the first page of the global outbox."""
    other = Scope(TENANT, "ws-other-0001")
    for batch in range(0, count, 25):
        items = tuple(
            OutboxItem(f"destroy_key:aaa-{i:05d}", "destroy_key", other, f"aaa-{i:05d}")
            for i in range(batch, min(batch + 25, count))
        )
        world.engine.store.commit(
            ChangeSet(
                scope=other,
                expected_head=world.engine.store.head(other),
                ledger=LedgerEntry("operator", f"seed-{batch:05d}", "seed", None, "h", b"{}", 0),
                outbox=items,
            )
        )


def test_the_invalidation_step_checks_its_own_scope_not_the_first_page_of_the_queue(
    world: World,
) -> None:
    queue_other_scopes_items(world, 120)
    record_id = admitted_record(world, "The billing cron runs at midnight UTC.")
    own = world.engine.deferred_projections(SAMPLE_SCOPE, record_id, "drop_projection", 0)
    world.engine.store.commit(
        ChangeSet(
            scope=SAMPLE_SCOPE,
            expected_head=world.engine.store.head(SAMPLE_SCOPE),
            ledger=LedgerEntry("operator", "seed-own-drop", "seed", None, "h", b"{}", 0),
            outbox=tuple(own),
        )
    )
    step = load("workflow_finish_tail")
    world.index.available = False
    with pytest.raises(IndexUnavailable):  # the Step Functions Retry catches it
        world.workflow.handler(step, _context())
    world.index.available = True
    assert world.workflow.handler(step, _context())["projections"] == "complete"
    assert not world.index.contains(SAMPLE_SCOPE, record_id)
    # the other workspace's queue is the drainer's business, not this execution's
    assert len(world.engine.store.outbox_pending(200)) == 120


def test_the_drainer_runs_what_the_commit_path_left_and_reports_the_outbox_age(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    world.index.writable = False  # the admission's upsert fails after its commit
    record_id = admitted_record(world, "The VPN gateway lives in eu-west-1.")
    world.clock.advance(90_000)
    schedule = load("outbox_drainer")
    capsys.readouterr()
    stuck = world.drainer.handler(schedule, _context())
    assert stuck == {"drained": 0, "pending": 1, "oldest_age_s": 90.0}
    documents = [
        json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")
    ]
    ages = [d["OutboxOldestAgeSeconds"] for d in documents if "OutboxOldestAgeSeconds" in d]
    assert ages == [[90.0]], documents

    world.index.writable = True
    assert world.drainer.handler(schedule, _context()) == {
        "drained": 1,
        "pending": 0,
        "oldest_age_s": 0.0,
    }
    assert search_ids(world, "VPN gateway") == [record_id]


def test_the_drainer_reindexes_a_workspace_for_an_operator(world: World) -> None:
    record_id = admitted_record(world, "The staging deploy needs the blue flag.")
    world.index.apply(SAMPLE_SCOPE, ProjectionChange(delete_record_id=record_id))  # index lost
    assert search_ids(world, "staging deploy") == []
    report = world.drainer.handler(load("outbox_drainer_reindex"), _context())
    assert report == {"operation": "reindex", "indexed": 1, "dropped": 0, "pending_upserts": 0}
    assert search_ids(world, "staging deploy") == [record_id]


@pytest.mark.parametrize(
    ("function", "kind"),
    [
        ("workflow", WorkflowHandler),
        ("outbox_drainer", DrainerHandler),
        ("approval", ApprovalHandler),
    ],
)
def test_a_deferred_function_makes_its_handler_once_at_the_first_call(
    function: str, kind: type
) -> None:
    handler = load_app(function).handler
    assert isinstance(handler, DeferredHandler)
    made = handler.loaded()
    assert isinstance(made, kind) and handler.loaded() is made  # the warm container keeps it


@pytest.mark.parametrize("target", ["engram_memory.cloud.workflow", ":WorkflowHandler"])
def test_a_deferred_handler_names_a_module_and_its_factory(target: str) -> None:
    with pytest.raises(ValueError, match="'<module>:<factory>'"):
        deferred_handler(target)

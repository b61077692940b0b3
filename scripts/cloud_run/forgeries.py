"""What someone who is neither the approval page nor the MCP adapter can do with the stack's own
APIs, on the built functions: nothing commits (``cloud/proofs.py``).

- a direct invoke of a tool function (anyone with ``lambda:InvokeFunction``), with a well-formed
  context of their choosing: -32603, nothing captured;
- a forged ``SendTaskSuccess`` with the task token read from the table (anyone who may read the
  table or the execution history): the run ends without a commit (``NotApproved``, the commit
  step's ``GateFailed``), the record stays;
- a proof replayed from an earlier run's history, and the same proof rewritten for this run's
  operation: the run ends without a commit, the record stays.

These calls are the intruder's (the harness's own key): they are not the stack's principals, so
the IAM step leaves them out; what is judged is what the stack did with them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from .approval import page_link
from .harness import Harness
from .mcp import admit, call, capture, structured
from .settings import sample

GENERAL = "purpose:general"


def forgeries(h: Harness) -> None:
    direct_invoke(h)
    proof = earlier_proof(h)
    cases: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("a forged SendTaskSuccess (the bare approval)", lambda parked: bare_approval(parked)),
    ]
    if proof is not None:
        cases += [
            ("a proof replayed from an earlier run", lambda parked: json.dumps(proof)),
            ("an earlier proof rewritten for this operation", lambda p: rewritten(proof, p)),
        ]
    for n, (what, output) in enumerate(cases):
        completed_by_someone_else(h, n, what, output)


def direct_invoke(h: Harness) -> None:
    """The sample capture event, as the adapter never signed it, straight to the function."""
    event = sample("capture.json")
    answer = h.worker("CaptureFunction").invoke(event).get("result") or {}
    code = (answer.get("protocol_error") or {}).get("code")
    h.report.check(
        code == -32603 and "ok" not in answer,
        f"forgery: a direct invoke of a tool function (no adapter signature) -> {code}",
    )


def earlier_proof(h: Harness) -> dict[str, Any] | None:
    """The output a person's approval completed an earlier forget run with (its history is
    readable to anyone with ``states:GetExecutionHistory``)."""
    machine = h.stack.refs["ForgetStateMachine"]
    for execution in h.sfn.list_executions(stateMachineArn=machine)["executions"]:
        if execution["status"] != "SUCCEEDED":
            continue
        events = h.sfn.get_execution_history(executionArn=execution["executionArn"])["events"]
        for event in events:
            output = (event.get("taskSucceededEventDetails") or {}).get("output")
            if output and '"mac"' in output:
                found: dict[str, Any] = json.loads(output)
                return found
    h.report.check(False, "forgery: no earlier forget run's proof in any execution history")
    return None


def bare_approval(parked: dict[str, Any]) -> str:
    """What the page sent before proofs: the approval's fields, approved now."""
    fields = ("approval_id", "tool", "target", "operation_digest", "principal", "tenant_id")
    approval = {name: parked[name]["S"] for name in (*fields, "workspace_id")}
    approval["issued_at_ms"] = int(parked["issued_at_ms"]["N"])
    approval["approved_at_ms"] = int(time.time() * 1000)
    return json.dumps(approval)


def rewritten(proof: dict[str, Any], parked: dict[str, Any]) -> str:
    """An earlier proof, its approval rewritten to this run's id and operation (its MAC kept)."""
    approval = {
        **proof["approval"],
        "approval_id": parked["approval_id"]["S"],
        "operation_digest": parked["operation_digest"]["S"],
        "target": parked["target"]["S"],
        "approved_at_ms": int(time.time() * 1000),
    }
    return json.dumps({**proof, "approval": approval})


def completed_by_someone_else(
    h: Harness, n: int, what: str, output: Callable[[dict[str, Any]], str]
) -> None:
    """A forget asked for, its wait completed by ``output`` with the task token from the table:
    the run ends without a commit and the record is still there."""
    record_id = _record(h, n)
    if record_id is None:
        return
    forget = {
        "record_id": record_id,
        "idempotency_key": f"cloud-check-forged-{n:04d}",
        "reason_ref": "reason:obsolete",
    }
    approval_id = page_link(h, call(h, "forget", forget))
    if approval_id is None:
        return
    dynamodb = h.session.client("dynamodb", endpoint_url=h.moto_url)
    table = h.stack.refs["EngramTable"]
    key = {"pk": {"S": f"APPROVAL_TOKEN#{approval_id}"}, "sk": {"S": "APPROVAL_TOKEN"}}
    parked = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]
    h.sfn.send_task_success(taskToken=parked["task_token"]["S"], output=output(parked))
    ended = _ended(h, parked["execution_name"]["S"])
    result = json.loads(ended.get("output") or "{}")
    refused = str((result.get("error") or {}).get("Error", ""))
    still = structured(call(h, "get", {"record_id": record_id, "purpose_ref": GENERAL}))
    h.report.check(
        "commit" not in result and refused == "GateFailed" and still.get("ok") is True,
        f"forgery: {what} -> run {ended['status']} ({refused or 'no refusal'}), "
        f"record still there: {still.get('ok')}",
    )


DRILL_TEXTS = (
    "The lab's freezer alarm pages the on-call biologist after ten minutes.",
    "Invoices above five thousand euros need two signatures from finance.",
    "The staging cluster is rebuilt from scratch every Sunday night.",
)


def _record(h: Harness, n: int) -> str | None:
    """A record made for drill ``n`` (distinct texts: the near-duplicate gate admits each)."""
    text = DRILL_TEXTS[n]
    candidate_id = capture(h, text, f"cloud-check-capture-forged-{n}")
    admitted = None if candidate_id is None else admit(h, candidate_id, f"cloud-check-admit-f{n}")
    return admitted[0] if admitted and admitted[0] else None


def _ended(h: Harness, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """The forget run ``name`` once it has ended (NotApproved is a Pass state: SUCCEEDED, its
    output holding the refusal and no commit)."""
    arn = h.stack.refs["ForgetStateMachine"]
    machine = arn.split(":stateMachine:", 1)
    execution = f"{machine[0]}:execution:{machine[1]}:{name}"
    until = time.monotonic() + timeout_s
    while True:
        described: dict[str, Any] = h.sfn.describe_execution(executionArn=execution)
        if described["status"] != "RUNNING" or time.monotonic() > until:
            return described
        time.sleep(0.2)

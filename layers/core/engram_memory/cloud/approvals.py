"""The confirmation workflow of the cloud: Step Functions task tokens and approval records.

A confirmation-gated tool (withdraw, forget) starts a Standard execution whose first Task
(``await_approval``) parks its task token in the canonical table (``ApprovalStore``); the
approval page answers it with ``SendTaskSuccess`` carrying an ``ApprovalRecord``, which the
state machine hands to ``commit_transition``, which gives the engine that approval; the
engine's gate (``engine.gate.check_approval``) checks it as it checks every other approval.

Parked token — pk ``APPROVAL_TOKEN#<approval_id>``, sk ``APPROVAL_TOKEN``: ``task_token`` S
(removed once used), ``execution_name``, ``workflow``, ``tool``, ``target``,
``operation_digest``, ``principal``, ``tenant_id``, ``workspace_id``, ``reason_ref`` S,
``issued_at_ms`` N, ``ttl`` N (epoch s, at most 300 s after issue; DynamoDB's TTL sweep is
lazy, so reads check the expiry themselves), ``used_at_ms`` N once answered,
``reported_at_ms`` N once the commit was first reported to the agent; ``agent_id`` and
``session_id`` S when the host stated them (shown on the approval page). The token is
consumed with one conditional ``UpdateItem`` (the approval function may not ``DeleteItem``):
the answer is single use, and the marker left behind lets a replay be told from an unknown id.

Execution pointer — pk ``APPROVAL_EXEC#<execution_name>``, sk ``APPROVAL_EXEC``: ``approval_id`` S,
``ttl`` N. Written in the same transaction as the parked token, so the tool function that started
the execution finds the approval page of its own run (``for_execution``) without a scan.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from ..engine.gate import APPROVAL_TTL_MS, within_windows
from ..engine.ports import (
    StoreUnavailable,
)
from .wire import InvocationApproval, ToolInvocation

__all__ = [
    "APPROVAL_TOKEN_TTL_S",
    "ENDED_WAIT_ERRORS",
    "EXECUTION_NAME_PATTERN",
    "ApprovalRecord",
    "ApprovalStore",
    "ApprovalWindowExpired",
    "GateFailed",
    "ParkedApproval",
    "WorkflowRequest",
    "execution_name",
    "start_confirmed_execution",
]

APPROVAL_TOKEN_TTL_S: Final = APPROVAL_TTL_MS // 1000
# What Step Functions answers for a task token nobody waits on any more (the wait timed out, or
# the run ended).
ENDED_WAIT_ERRORS: Final = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})
EXECUTION_NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
APPROVAL_ID_PATTERN: Final = r"^apr_[0-9a-f]{32}$"
_TOKEN_SK: Final = "APPROVAL_TOKEN"  # noqa: S105 - a sort key, not a secret
_POINTER_SK: Final = "APPROVAL_EXEC"
_MAX_TEXT: Final = 1_024


class ApprovalWindowExpired(Exception):
    """The approval is older than 300 s, or the mutation would start > 30 s after it.

    The class name is the Step Functions error: the machine ends in ``NotApproved``.
    """


class GateFailed(Exception):
    """The engine's gate refused the approval (``gate_failed``): ``NotApproved``."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Text = Annotated[StrictStr, Field(min_length=1, max_length=_MAX_TEXT)]


class WorkflowRequest(_Closed):
    """The execution input's ``request``: the tool call, as the tool function validated it.

    A pure function of the ledger entry (no "now"), so a retried start carries the same input.
    """

    invocation: ToolInvocation = Field(description="The tool call and its trusted context.")
    target: Text | None = Field(description="The candidate or record the operation changes.")
    operation_digest: Annotated[StrictStr, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
    reason_ref: Text | None = Field(default=None, description="The reason, by reference.")


# The approval the state machine delivers is the one a tool invocation carries; whether it binds
# this operation, in time, is the engine's gate's decision.
ApprovalRecord = InvocationApproval


def within_window(record: InvocationApproval, now_ms: int) -> bool:
    """The contract's windows for a delivered approval (``engine.gate.within_windows``)."""
    return within_windows(record.issued_at_ms, record.approved_at_ms, now_ms)


@dataclass(frozen=True, slots=True)
class ParkedApproval:
    """A parked task token and what the approval page may show (no content)."""

    approval_id: str
    task_token: str | None  # None once used
    execution_name: str
    workflow: str
    tool: str
    target: str | None
    operation_digest: str
    principal: str
    tenant_id: str
    workspace_id: str
    reason_ref: str | None
    issued_at_ms: int
    used: bool
    # who asks, for the page (added with the sign-in page; absent on items parked before it)
    agent_id: str | None = None
    session_id: str | None = None

    def expired(self, now_ms: int) -> bool:
        return now_ms - self.issued_at_ms > APPROVAL_TTL_MS

    def record(self, approved_at_ms: int) -> ApprovalRecord:
        return ApprovalRecord(
            approval_id=self.approval_id,
            tool=self.tool,
            target=self.target,
            operation_digest=self.operation_digest,
            principal=self.principal,
            tenant_id=self.tenant_id,
            workspace_id=self.workspace_id,
            issued_at_ms=self.issued_at_ms,
            approved_at_ms=approved_at_ms,
        )


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _opt(item: dict[str, Any], name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


class ApprovalStore:
    """Task tokens parked in the canonical table, each answerable once (see the module doc)."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self._db = dynamodb
        self._table = table_name

    @staticmethod
    def new_approval_id() -> str:
        return "apr_" + secrets.token_hex(16)

    def _key(self, approval_id: str) -> dict[str, Any]:
        return {"pk": _s(f"APPROVAL_TOKEN#{approval_id}"), "sk": _s(_TOKEN_SK)}

    def park(
        self,
        *,
        approval_id: str,
        task_token: str,
        execution_name: str,
        workflow: str,
        request: WorkflowRequest,
        issued_at_ms: int,
    ) -> str:
        """Park the token; the approval id of the execution (the existing one on a retry)."""
        ctx = request.invocation.context
        item: dict[str, Any] = {
            **self._key(approval_id),
            "approval_id": _s(approval_id),
            "task_token": _s(task_token),
            "execution_name": _s(execution_name),
            "workflow": _s(workflow),
            "tool": _s(request.invocation.tool),
            "operation_digest": _s(request.operation_digest),
            "principal": _s(ctx.principal),
            "tenant_id": _s(ctx.tenant_id),
            "workspace_id": _s(ctx.workspace_id),
            "issued_at_ms": _n(issued_at_ms),
            "ttl": _n(issued_at_ms // 1000 + APPROVAL_TOKEN_TTL_S),
        }
        if request.target is not None:
            item["target"] = _s(request.target)
        if request.reason_ref is not None:
            item["reason_ref"] = _s(request.reason_ref)
        for name in ("agent_id", "session_id"):
            stated = getattr(ctx, name)
            if stated is not None:
                item[name] = _s(stated)
        pointer = {
            **self._pointer_key(execution_name),
            "approval_id": _s(approval_id),
            "ttl": item["ttl"],
        }
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._db.transact_write_items(
                TransactItems=[
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": item,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": pointer,
                            "ConditionExpression": "attribute_not_exists(pk)",
                        }
                    },
                ]
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise StoreUnavailable("could not park the task token") from exc
            # A retried await_approval step: the execution already has its approval; hand it
            # the new task token unless the human has answered already.
            existing = self.for_execution(execution_name)
            if existing is None:
                raise StoreUnavailable("could not park the task token") from exc
            self._refresh_token(existing.approval_id, task_token)
            return existing.approval_id
        except BotoCoreError as exc:
            raise StoreUnavailable("could not park the task token") from exc
        return approval_id

    def _refresh_token(self, approval_id: str, task_token: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._db.update_item(
                TableName=self._table,
                Key=self._key(approval_id),
                UpdateExpression="SET task_token = :token",
                ConditionExpression="attribute_exists(pk) AND attribute_not_exists(used_at_ms)",
                ExpressionAttributeValues={":token": _s(task_token)},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return  # answered meanwhile: the answer went to the earlier token
            raise StoreUnavailable("could not park the task token") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable("could not park the task token") from exc

    def _pointer_key(self, execution_name: str) -> dict[str, Any]:
        return {"pk": _s(f"APPROVAL_EXEC#{execution_name}"), "sk": _s(_POINTER_SK)}

    def for_execution(self, execution_name: str) -> ParkedApproval | None:
        """The approval parked by ``execution_name``'s run, or ``None`` before it is parked."""
        pointer = self._read(self._pointer_key(execution_name))
        return None if pointer is None else self.get(str(pointer["approval_id"]["S"]))

    def get(self, approval_id: str) -> ParkedApproval | None:
        """The parked approval, used or not; ``None`` when unknown (or swept by TTL)."""
        item = self._read(self._key(approval_id))
        return None if item is None else self._parse(item)

    def _read(self, key: dict[str, Any]) -> dict[str, Any] | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._db.get_item(TableName=self._table, Key=key, ConsistentRead=True)
        except (BotoCoreError, ClientError) as exc:
            raise StoreUnavailable("could not read the parked approval") from exc
        item: dict[str, Any] | None = response.get("Item")
        return item

    def take(self, approval_id: str, now_ms: int) -> ParkedApproval | None:
        """Consume the token (conditional, single use); ``None`` when unknown or already used."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._db.update_item(
                TableName=self._table,
                Key=self._key(approval_id),
                UpdateExpression="SET used_at_ms = :now REMOVE task_token",
                ConditionExpression="attribute_exists(task_token) AND attribute_not_exists(used_at_ms)",
                ExpressionAttributeValues={":now": _n(now_ms)},
                ReturnValues="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return None
            raise StoreUnavailable("could not consume the parked approval") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable("could not consume the parked approval") from exc
        return self._parse(response["Attributes"])

    def first_report(self, approval_id: str, now_ms: int) -> bool:
        """Mark the commit of this approval's run as reported to the agent; True the first time.

        The first success the agent sees says ``replayed: false`` whichever way the human
        answered (in the client, or on the page before the agent's retry); every later one is
        a replay. One conditional ``UpdateItem``; an unknown id is never a first report.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._db.update_item(
                TableName=self._table,
                Key=self._key(approval_id),
                UpdateExpression="SET reported_at_ms = :now",
                ConditionExpression="attribute_exists(pk) AND attribute_not_exists(reported_at_ms)",
                ExpressionAttributeValues={":now": _n(now_ms)},
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise StoreUnavailable("could not mark the report") from exc
        except BotoCoreError as exc:
            raise StoreUnavailable("could not mark the report") from exc
        return True

    @staticmethod
    def _parse(item: dict[str, Any]) -> ParkedApproval:
        return ParkedApproval(
            approval_id=str(item["approval_id"]["S"]),
            task_token=_opt(item, "task_token"),
            execution_name=str(item["execution_name"]["S"]),
            workflow=str(item["workflow"]["S"]),
            tool=str(item["tool"]["S"]),
            target=_opt(item, "target"),
            operation_digest=str(item["operation_digest"]["S"]),
            principal=str(item["principal"]["S"]),
            tenant_id=str(item["tenant_id"]["S"]),
            workspace_id=str(item["workspace_id"]["S"]),
            reason_ref=_opt(item, "reason_ref"),
            issued_at_ms=int(item["issued_at_ms"]["N"]),
            used="used_at_ms" in item,
            agent_id=_opt(item, "agent_id"),
            session_id=_opt(item, "session_id"),
        )


def execution_name(workflow: str, ledger_key: str) -> str:
    """``<workflow>-`` + SHA-256 hex of the ledger key: deterministic, ≤ 80 allowed characters."""
    name = f"{workflow}-{hashlib.sha256(ledger_key.encode('utf-8')).hexdigest()}"
    if not EXECUTION_NAME_PATTERN.match(name):
        raise ValueError("the workflow name must be a short [A-Za-z0-9_-] word")
    return name


def start_confirmed_execution(
    sfn_client: Any,
    state_machine_arn: str,
    *,
    ledger_key: str,
    request: WorkflowRequest,
    workflow: Literal["withdraw", "forget"] | None = None,
) -> str:
    """Start (or find) the execution of ``ledger_key``; return its ARN.

    The name is derived from the ledger key, so a retried call cannot start a second run:
    ``ExecutionAlreadyExists`` means it was started already (the existing run is returned).
    """
    from botocore.exceptions import ClientError

    name = execution_name(workflow or request.invocation.tool, ledger_key)
    payload = '{"request":' + request.model_dump_json() + "}"
    try:
        response = sfn_client.start_execution(
            stateMachineArn=state_machine_arn, name=name, input=payload
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
            raise
        machine = state_machine_arn.split(":stateMachine:", 1)
        return f"{machine[0]}:execution:{machine[1]}:{name}"
    return str(response["executionArn"])

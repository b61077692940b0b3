"""The cloud's approval book: questions parked as Step Functions task tokens, and their records.

A confirmation-gated tool (withdraw, forget) starts a Standard execution whose first Task
(``await_approval``) parks its task token in the canonical table (``ParkedApprovalBook``); the
approval page (or the tool function, in form mode) answers it with ``SendTaskSuccess`` carrying
the ``engine.gate.Approval`` as JSON, which the state machine hands to ``commit_transition``,
which gives the engine that approval; the engine's gate (``engine.gate.check_approval``) checks
it as it checks every other approval.

Parked token — pk ``APPROVAL_TOKEN#<approval_id>``, sk ``APPROVAL_TOKEN``: ``to_item`` of the
``ParkedApproval`` (the open ``Approval``'s fields — ``approval_id``, ``tool``, ``target``,
``operation_digest``, ``principal``, ``tenant_id``, ``workspace_id`` S, ``issued_at_ms`` N — and
``task_token`` (removed once used), ``execution_name``, ``workflow``, ``reason_ref``, ``approver``
S), ``ttl`` N (epoch s, at most 300 s after issue; DynamoDB's TTL sweep is
lazy, so reads check the expiry themselves), ``used_at_ms`` N once answered,
``reported_at_ms`` N once the commit was first reported to the agent. The token is
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
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from engram_memory.adapters.aws.calls import CONDITION_FAILED, error_code, unless_refused
from engram_memory.cloud.tool_invocation import ToolInvocation
from engram_memory.engine.gate import APPROVAL_TTL_MS, Approval
from engram_memory.engine.ports import StoreUnavailable

__all__ = [
    "APPROVAL_TOKEN_TTL_S",
    "ENDED_WAIT_ERRORS",
    "EXECUTION_NAME_PATTERN",
    "ApprovalTopic",
    "ApprovalWindowExpired",
    "GateFailed",
    "ParkedApproval",
    "ParkedApprovalBook",
    "WorkflowRequest",
    "approval_notice",
    "execution_name",
    "from_item",
    "start_confirmed_execution",
    "to_item",
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


class ParkedApproval(Approval):
    """A parked task token: the open ``Approval`` of an execution and what the page may show.

    Its DynamoDB item is ``to_item`` of it (plus the key, ``ttl`` and ``used_at_ms``); the
    approval the human gives is ``approved(at)`` — the binding alone, never the token.
    """

    task_token: StrictStr | None = None  # None once used
    execution_name: StrictStr
    workflow: StrictStr
    reason_ref: StrictStr | None = None
    used: bool = False
    # who asks, for the page (absent on items parked before the sign-in page)
    agent_id: StrictStr | None = None
    session_id: StrictStr | None = None
    # who may answer on the page: the approver the agent's token names (absent: the principal)
    approver: StrictStr | None = None


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def to_item(approval: Approval) -> dict[str, Any]:
    """The DynamoDB attributes of ``approval``'s fields (``None`` left out; ``used`` is the
    presence of ``used_at_ms``, written when the token is taken)."""
    values = approval.model_dump(exclude_none=True, exclude={"used"})
    return {name: _n(v) if isinstance(v, int) else _s(v) for name, v in values.items()}


def from_item(item: Mapping[str, Any]) -> ParkedApproval:
    """The parked approval an item holds (``to_item``'s inverse)."""
    fields = {
        name: int(value["N"]) if "N" in value else str(value["S"])
        for name, value in item.items()
        if name in ParkedApproval.model_fields
    }
    return ParkedApproval.model_validate({**fields, "used": "used_at_ms" in item})


class ParkedApprovalBook:
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
        parked = ParkedApproval(
            approval_id=approval_id,
            tool=request.invocation.tool,
            target=request.target,
            operation_digest=request.operation_digest,
            principal=ctx.principal,
            tenant_id=ctx.tenant_id,
            workspace_id=ctx.workspace_id,
            issued_at_ms=issued_at_ms,
            task_token=task_token,
            execution_name=execution_name,
            workflow=workflow,
            reason_ref=request.reason_ref,
            agent_id=ctx.agent_id,
            session_id=ctx.session_id,
            approver=ctx.approver,
        )
        if self._put_new(parked):
            return approval_id
        # A retried await_approval step: the execution already has its approval; hand it the
        # new task token unless the human has answered already.
        existing = self.for_execution(execution_name)
        if existing is None:
            raise StoreUnavailable("could not park the task token")
        self._update(
            existing.approval_id,
            "SET task_token = :token",
            "attribute_exists(pk) AND attribute_not_exists(used_at_ms)",
            {":token": _s(task_token)},
            failure="could not park the task token",
        )  # answered meanwhile (False): the answer went to the earlier token
        return existing.approval_id

    def _put_new(self, parked: ParkedApproval) -> bool:
        """Write the parked token and its execution pointer in one transaction; False when the
        execution has parked one already."""
        ttl = _n(parked.issued_at_ms // 1000 + APPROVAL_TOKEN_TTL_S)
        item = {**self._key(parked.approval_id), **to_item(parked), "ttl": ttl}
        pointer = {
            **self._pointer_key(parked.execution_name),
            "approval_id": _s(parked.approval_id),
            "ttl": ttl,
        }
        from botocore.exceptions import BotoCoreError, ClientError

        new = "attribute_not_exists(pk)"
        try:
            self._db.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": self._table, "Item": item, "ConditionExpression": new}},
                    {
                        "Put": {
                            "TableName": self._table,
                            "Item": pointer,
                            "ConditionExpression": new,
                        }
                    },
                ]
            )
        except ClientError as exc:
            if error_code(exc) != "TransactionCanceledException":
                raise StoreUnavailable("could not park the task token") from exc
            return False
        except BotoCoreError as exc:
            raise StoreUnavailable("could not park the task token") from exc
        return True

    def _update(
        self,
        approval_id: str,
        update: str,
        condition: str,
        values: dict[str, Any],
        *,
        failure: str,
        old: bool = False,
    ) -> dict[str, Any] | None:
        """One conditional ``UpdateItem`` of a parked token: None when the condition does not
        hold, else the item's old attributes (``old``) or {}; ``StoreUnavailable(failure)``."""
        response = unless_refused(
            lambda: self._db.update_item(
                TableName=self._table,
                Key=self._key(approval_id),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                **({"ReturnValues": "ALL_OLD"} if old else {}),
            ),
            CONDITION_FAILED,
            failure,
        )
        if response is None:
            return None
        attributes: dict[str, Any] = response.get("Attributes", {}) if old else {}
        return attributes

    def _stamp_once(
        self, approval_id: str, field: str, now_ms: int, requires: str, remove: str = ""
    ) -> dict[str, Any] | None:
        """Set ``field`` to ``now_ms`` if it is unset and ``requires`` holds (and remove the
        attribute ``remove``): None when it was set already; else the item's old attributes."""
        return self._update(
            approval_id,
            f"SET {field} = :now" + (f" REMOVE {remove}" if remove else ""),
            f"{requires} AND attribute_not_exists({field})",
            {":now": _n(now_ms)},
            failure=f"could not set {field} of the parked approval",
            old=True,
        )

    def _pointer_key(self, execution_name: str) -> dict[str, Any]:
        return {"pk": _s(f"APPROVAL_EXEC#{execution_name}"), "sk": _s(_POINTER_SK)}

    def for_execution(self, execution_name: str) -> ParkedApproval | None:
        """The approval parked by ``execution_name``'s run, or ``None`` before it is parked."""
        pointer = self._read(self._pointer_key(execution_name))
        return None if pointer is None else self.get(str(pointer["approval_id"]["S"]))

    def get(self, approval_id: str) -> ParkedApproval | None:
        """The parked approval, used or not; ``None`` when unknown (or swept by TTL)."""
        item = self._read(self._key(approval_id))
        return None if item is None else from_item(item)

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
        taken = self._stamp_once(
            approval_id, "used_at_ms", now_ms, "attribute_exists(task_token)", "task_token"
        )
        return None if taken is None else from_item(taken)

    def first_report(self, approval_id: str, now_ms: int) -> bool:
        """Mark the commit of this approval's run as reported to the agent; True the first time.

        The first success the agent sees says ``replayed: false`` whichever way the human
        answered (in the client, or on the page before the agent's retry); every later one is
        a replay. One conditional ``UpdateItem``; an unknown id is never a first report.
        """
        marked = self._stamp_once(approval_id, "reported_at_ms", now_ms, "attribute_exists(pk)")
        return marked is not None


def approval_notice(parked: ParkedApproval, url: str) -> tuple[str, str]:
    """The subject and text announcing a waiting approval (the stack's approval topic): the
    operation, who asks, the target's id and the page — never the memory's text or anything
    the agent wrote (its reason is a reference; the page shows what a person must see)."""
    from engram_memory.contract.types import format_instant

    what = {"withdraw": "withdraw a pending memory", "forget": "forget a memory"}
    asks = parked.principal + (f" (agent {parked.agent_id})" if parked.agent_id else "")
    lines = [
        f"An agent asks to {what.get(parked.tool, parked.tool)}.",
        "",
        f"Who asks:   {asks}",
        f"Workspace:  {parked.workspace_id} (tenant {parked.tenant_id})",
        f"Target:     {parked.target or '-'}",
        f"Expires:    {format_instant(parked.expires_at_ms)}",
        "",
        f"Approve or decline: {url}",
        "Sign in as the person who may answer for this agent; nothing changes until you do.",
    ]
    return f"Engram Memory: approve a {parked.tool}?", "\n".join(lines)


class ApprovalTopic:
    """The SNS topic a waiting approval is announced on (``approval_notice``)."""

    def __init__(self, sns: Any, topic_arn: str) -> None:
        self._sns = sns
        self.topic_arn = topic_arn

    def announce(self, parked: ParkedApproval, url: str) -> bool:
        """Publish the notice; False (nothing raised) when SNS refuses or cannot be reached:
        the request waits on its page all the same."""
        from botocore.exceptions import BotoCoreError, ClientError

        subject, text = approval_notice(parked, url)
        try:
            self._sns.publish(TopicArn=self.topic_arn, Subject=subject, Message=text)
        except (BotoCoreError, ClientError):
            return False
        return True


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
        if error_code(exc) != "ExecutionAlreadyExists":
            raise
        machine = state_machine_arn.split(":stateMachine:", 1)
        return f"{machine[0]}:execution:{machine[1]}:{name}"
    return str(response["executionArn"])

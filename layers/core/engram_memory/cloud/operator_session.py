"""Opening a deployed stack for the operator: what it is, who the operator is, the engine over it.

- ``resolve_stack`` reads what the stack is from CloudFormation: the outputs (tables, bucket,
  data key, cursor secret, operator audit log group) and the ``TenantId`` parameter
  (``describe_stacks``), and the outbox drainer's function name (``list_stack_resources``);
- ``operator_identity`` is the caller's ARN (``sts:GetCallerIdentity``): every operation is
  audited as ``operator:<arn>``, whatever its outcome, never with content, into the stack's
  operator audit log group (``CloudWatchAuditSink``);
- ``open_stack`` builds the engine exactly as the functions do (``composition.build_engine``)
  from an environment made of those values, with two differences that are the operator's seat:
  the audit goes to CloudWatch Logs (the CLI has no Lambda log stream), and the OpenSearch
  projection is never written from here (``DrainerIndex``): the domain's fine-grained access
  control maps only the functions' roles, so every projection change an operation makes stays
  in the outbox, in the same transaction as the change, and the outbox drainer function applies
  it (``OperatorSession.finish`` invokes it at once; its schedule would within a minute).

Below the seat (``cloud.operator``) and the operations it hands a session to
(``cloud.stack_backup``, ``cloud.smoke``), so they import it without importing the seat.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from engram_memory.cloud.composition import AwsClients, build_engine
from engram_memory.cloud.settings import ConfigurationError
from engram_memory.contract.errors import EngramError, ErrorCode
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import AuditEvent, IndexHit, IndexUnreachable, ProjectionChange
from engram_memory.engine.service import Engine

if TYPE_CHECKING:
    from boto3.session import Session

__all__ = [
    "CloudWatchAuditSink",
    "DrainerIndex",
    "OperatorSession",
    "StackError",
    "StackResources",
    "lambda_invoker",
    "open_stack",
    "operator_identity",
    "resolve_stack",
]

# The outputs of template.yaml the operator's plane reads (a stack deployed before they existed
# answers StackError: update it with `sam deploy`).
REQUIRED_OUTPUTS: Final = (
    "EngramTableName",
    "EngramKeyTableName",
    "EngramBlobBucketName",
    "EngramDataKeyArn",
    "CursorSecretArn",
    "OperatorAuditLogGroupName",
    # the functions' engine configuration names it (the operator itself never calls OpenSearch)
    "OpenSearchEndpoint",
)
DRAINER_RESOURCE: Final = "OutboxDrainerFunction"


class StackError(RuntimeError):
    """The stack cannot be operated: not found, not an Engram Memory stack, or an output
    missing. The message says which and what to do; it never holds a credential."""


@dataclass(frozen=True, slots=True)
class StackResources:
    """What a deployed stack is, as CloudFormation describes it."""

    stack_name: str
    region: str
    tenant_id: str
    table: str
    key_table: str
    blob_bucket: str
    data_key_arn: str
    cursor_secret_arn: str
    audit_log_group: str
    drainer_function: str
    opensearch_endpoint: str

    def environment(self) -> dict[str, str]:
        """The variables ``build_engine`` reads, as the template sets them for the functions."""
        return {
            "AWS_REGION": self.region,
            "ENGRAM_TENANT_ID": self.tenant_id,
            "ENGRAM_TABLE": self.table,
            "ENGRAM_KEY_TABLE": self.key_table,
            "ENGRAM_BLOB_BUCKET": self.blob_bucket,
            "ENGRAM_DATA_KEY_ARN": self.data_key_arn,
            "ENGRAM_CURSOR_SECRET_ARN": self.cursor_secret_arn,
            "ENGRAM_OPENSEARCH_ENDPOINT": self.opensearch_endpoint,
        }


def resolve_stack(clients: AwsClients, stack_name: str) -> StackResources:
    """The stack's resources from ``describe_stacks`` and ``list_stack_resources``."""
    from botocore.exceptions import BotoCoreError, ClientError

    cloudformation = clients.client("cloudformation")
    try:
        stacks = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
        resources = cloudformation.list_stack_resources(StackName=stack_name)
    except ClientError as exc:
        raise StackError(
            f"stack {stack_name!r} not found in {clients.session().region_name}"
            f" ({exc.response.get('Error', {}).get('Code', 'error')})"
        ) from None
    except BotoCoreError as exc:
        raise StackError(f"CloudFormation is unreachable: {type(exc).__name__}") from None
    if not stacks:
        raise StackError(f"stack {stack_name!r} not found in {clients.session().region_name}")
    stack = stacks[0]
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
    parameters = {
        p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])
    }
    missing = [name for name in REQUIRED_OUTPUTS if not outputs.get(name)]
    if missing:
        raise StackError(
            f"stack {stack_name!r} has no output {', '.join(missing)}: not an Engram Memory"
            " stack, or deployed before the operator's plane (update it with `sam deploy`)"
        )
    tenant_id = parameters.get("TenantId", "")
    if not tenant_id:
        raise StackError(f"stack {stack_name!r} has no TenantId parameter")
    drainer = next(
        (
            summary.get("PhysicalResourceId", "")
            for summary in resources.get("StackResourceSummaries", [])
            if summary.get("LogicalResourceId") == DRAINER_RESOURCE
        ),
        "",
    )
    return StackResources(
        stack_name=stack_name,
        region=str(clients.session().region_name),
        tenant_id=tenant_id,
        table=outputs["EngramTableName"],
        key_table=outputs["EngramKeyTableName"],
        blob_bucket=outputs["EngramBlobBucketName"],
        data_key_arn=outputs["EngramDataKeyArn"],
        cursor_secret_arn=outputs["CursorSecretArn"],
        audit_log_group=outputs["OperatorAuditLogGroupName"],
        # the template names the function so; a stack without it has no drainer to invoke
        drainer_function=drainer or f"engram-{tenant_id}-outbox-drainer",
        opensearch_endpoint=outputs["OpenSearchEndpoint"],
    )


def operator_identity(clients: AwsClients) -> str:
    """The caller's ARN (``sts:GetCallerIdentity``): the operator every audit line names."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        arn = clients.client("sts").get_caller_identity()["Arn"]
    except (BotoCoreError, ClientError) as exc:
        raise StackError(f"no AWS identity to act as ({type(exc).__name__})") from None
    return str(arn)


class CloudWatchAuditSink:
    """The operator's audit lines in the stack's operator audit log group: one JSON object per
    operation, exactly the ``AuditEvent`` fields (ids, outcome code, target id, digests), one
    log stream per CLI run. A line that cannot be written fails the command loudly."""

    def __init__(self, logs: Any, group: str, *, stream: str | None = None) -> None:
        self.logs = logs
        self.group = group
        self.stream = stream or (
            f"operator/{time.strftime('%Y/%m/%d', time.gmtime())}/{secrets.token_hex(8)}"
        )
        self._created = False
        self._lock = threading.Lock()

    def record(self, event: AuditEvent) -> None:
        line = {
            "message": "audit",
            "audit_id": event.audit_id,
            "at_ms": event.at_ms,
            "tenant_id": event.tenant_id,
            "workspace_id": event.workspace_id,
            "principal": event.principal,
            "tool": event.tool,
            "ok": event.ok,
            "code": event.code,
            "target": event.target,
            "digests": dict(event.digests),
        }
        with self._lock:
            if not self._created:
                self.logs.create_log_stream(logGroupName=self.group, logStreamName=self.stream)
                self._created = True
            self.logs.put_log_events(
                logGroupName=self.group,
                logStreamName=self.stream,
                logEvents=[
                    {
                        "timestamp": event.at_ms,
                        "message": json.dumps(line, sort_keys=True, separators=(",", ":")),
                    }
                ],
            )


class DrainerIndex:
    """The OpenSearch projection as the operator's engine sees it: never reachable from here.

    Every projection change an operation makes is written to the outbox in the operation's own
    transaction; ``apply`` refusing leaves it there for the outbox drainer function, whose role
    OpenSearch maps (the operator's is not). ``status`` reports the index as not checked. It
    refuses with ``IndexUnreachable``: an admission from this seat (an import) finds no
    neighbours for the near-duplicate rule (``admission.neighbours``), where an agent's would wait
    for an index that is down.
    """

    name = "lexical"
    maintained_by_store = False
    scoring_formula_ref = "opensearch:bm25f"

    @staticmethod
    def _unreachable() -> IndexUnreachable:
        return IndexUnreachable("the operator does not write the OpenSearch projection")

    def search(self, scope: Scope, terms: Sequence[str], depth: int) -> list[IndexHit]:
        raise self._unreachable()

    def apply(self, scope: Scope, change: ProjectionChange) -> None:
        raise self._unreachable()

    def contains(self, scope: Scope, record_id: str) -> bool:
        raise self._unreachable()


DrainerInvoker = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass
class OperatorSession:
    """One CLI run against a stack: its resources, the operator, the engine, the drainer."""

    resources: StackResources
    operator: str
    engine: Engine
    session: Any
    invoke_drainer: DrainerInvoker
    kms: Any = None
    dynamodb: Any = None
    s3: Any = None
    notes: list[str] = field(default_factory=list)

    def scope(self, workspace_id: str) -> Scope:
        return Scope(self.resources.tenant_id, workspace_id)

    def finish(self) -> None:
        """Ask the drainer to apply what the operation left in the outbox (projection upserts
        and drops) now rather than at its next scheduled run."""
        try:
            self.invoke_drainer({})
        except Exception as exc:  # the schedule does it within a minute anyway
            self.notes.append(
                f"the outbox drainer could not be invoked ({type(exc).__name__}); its schedule"
                " applies the pending projection changes within a minute"
            )


def lambda_invoker(clients: AwsClients, function_name: str) -> DrainerInvoker:
    """Invoke the stack's outbox drainer with an event, waiting for its answer."""

    def invoke(event: Mapping[str, Any]) -> Mapping[str, Any]:
        client = clients.client("lambda", read_timeout_s=300, retries=False)
        response = client.invoke(
            FunctionName=function_name,
            InvocationType="RequestResponse",
            Payload=json.dumps(dict(event)).encode("utf-8"),
        )
        if response.get("FunctionError"):
            raise EngramError(ErrorCode.STORE_UNAVAILABLE)
        answer = json.loads(response["Payload"].read() or b"{}")
        return answer if isinstance(answer, dict) else {}

    return invoke


def open_stack(
    stack_name: str,
    *,
    session: Session | None = None,
    region: str | None = None,
    invoke_drainer: DrainerInvoker | None = None,
    engine_overrides: Mapping[str, Any] | None = None,
) -> OperatorSession:
    """Resolve ``stack_name``, find who the operator is, and build the engine over the stack.

    ``engine_overrides`` are passed to ``build_engine`` (tests: a clock); ``invoke_drainer``
    replaces the Lambda invocation of the drainer (tests run its handler in process).
    """
    import boto3

    if session is None:
        session = boto3.session.Session(region_name=region) if region else boto3.session.Session()
    if not session.region_name:
        raise StackError("no AWS region: pass --region or set AWS_REGION")
    clients = AwsClients.of(session)
    resources = resolve_stack(clients, stack_name)
    operator = operator_identity(clients)
    dynamodb = clients.client("dynamodb")
    kms = clients.client("kms")
    s3 = clients.client("s3")
    audit = CloudWatchAuditSink(clients.client("logs"), resources.audit_log_group)
    try:
        engine = build_engine(
            resources.environment(),
            session=session,
            dynamodb_client=dynamodb,
            kms_client=kms,
            s3_client=s3,
            lexical_index=DrainerIndex(),
            audit=audit,
            **dict(engine_overrides or {}),
        )
    except ConfigurationError as exc:
        raise StackError(str(exc)) from None
    return OperatorSession(
        resources=resources,
        operator=operator,
        engine=engine,
        session=session,
        invoke_drainer=invoke_drainer or lambda_invoker(clients, resources.drainer_function),
        kms=kms,
        dynamodb=dynamodb,
        s3=s3,
    )

"""What a function emits when AWS refuses its call or its store fails (issue 34, item 5).

A session the composition root makes (a function's) reports every call AWS refuses for want of
permission, whichever client made it, as one ERROR log line and the ``AwsAccessDenied`` metric
(the tenant's series and the per-service one), never with the refusal's message; the operator's
session reports nothing; any other error is not a refusal; a failing report never changes the
call's outcome. The OpenSearch index reports its 403s, of a request or of a bulk item. The audit
sink counts ``StoreFaults`` per code for STORE_UNAVAILABLE and JOURNAL_CORRUPT only. Faults come
from moto's dispatcher answering with the service's real error (``alarm_testing``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from alarm_testing import ROLE, denying, emf_documents
from aws_testing import REGION, TENANT, moto_aws
from botocore.exceptions import ClientError
from opensearchpy import Connection, OpenSearch
from test_tool_handlers import output

from engram_memory.adapters.aws.denials import Denial, denial_of, watch_denials
from engram_memory.adapters.aws.opensearch_index import OpenSearchLexicalIndex
from engram_memory.cloud.composition import AwsClients
from engram_memory.cloud.observability import ACCESS_DENIED_MESSAGE, PowertoolsAuditSink
from engram_memory.engine.context import Scope
from engram_memory.engine.ports import AuditEvent, IndexUnavailable, ProjectionChange, ProjectionDoc

__all__ = ["output"]  # the fixture, from the tool handlers' tests

Lines = Callable[[], list[dict[str, Any]]]


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("ENGRAM_TENANT_ID", TENANT)
    with moto_aws():
        yield


def function_clients() -> AwsClients:
    """Clients as a function's composition root makes them: from a session it makes itself."""
    return AwsClients(lambda: boto3.session.Session(region_name=REGION))


def denials(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("message") == ACCESS_DENIED_MESSAGE]


def test_a_function_session_reports_each_refused_call_once_without_its_message(
    aws: None, output: Lines
) -> None:
    kms = function_clients().client("kms")
    with denying("kms"), pytest.raises(ClientError, match="AccessDeniedException"):
        kms.list_keys()
    lines = output()

    (logged,) = denials(lines)
    assert logged["level"] == "ERROR" and logged["tenant"] == TENANT
    assert {k: logged[k] for k in ("aws_service", "operation", "error_code", "http_status")} == {
        "aws_service": "kms",
        "operation": "ListKeys",
        "error_code": "AccessDeniedException",
        "http_status": 400,
    }
    assert logged["request_id"] == "req-1"  # to find the call in CloudTrail
    text = json.dumps(lines)
    assert ROLE not in text and "not authorized" not in text  # the message names role, resource
    documents = emf_documents(lines, "AwsAccessDenied")
    assert [d["_aws"]["CloudWatchMetrics"][0]["Dimensions"] for d in documents] == [
        [["service", "tenant"]],  # the tenant's series: the alarm's
        [["service", "tenant", "aws_service"]],  # per service: the dashboard's
    ]
    assert all(d["tenant"] == TENANT and d["AwsAccessDenied"] == [1.0] for d in documents)
    assert documents[1]["aws_service"] == "kms"


def test_every_client_of_the_session_reports_with_its_iam_prefix(aws: None, output: Lines) -> None:
    clients = function_clients()
    with denying("sfn", "secrets-manager", "s3"):
        for name, call in (
            ("stepfunctions", "list_state_machines"),
            ("secretsmanager", "list_secrets"),
            ("s3", "list_buckets"),
        ):
            with pytest.raises(ClientError):
                getattr(clients.client(name), call)()
    assert [d["aws_service"] for d in denials(output())] == ["states", "secretsmanager", "s3"]


def test_the_operators_session_reports_nothing(aws: None, output: Lines) -> None:
    operator = AwsClients.of(boto3.session.Session(region_name=REGION))
    with denying("kms"), pytest.raises(ClientError):
        operator.client("kms").list_keys()
    assert output() == []  # its command prints its own answer: no EMF document in it


def test_a_call_that_succeeds_or_fails_otherwise_is_no_refusal(aws: None, output: Lines) -> None:
    kms = function_clients().client("kms")
    kms.list_keys()
    with pytest.raises(ClientError, match="NotFoundException"):
        kms.describe_key(KeyId="alias/none")
    assert output() == []


@pytest.mark.parametrize(
    ("code", "status", "denied"),
    [
        ("AccessDenied", 403, True),
        ("AccessDeniedException", 400, True),
        ("UnauthorizedOperation", 403, True),
        ("KMSAccessDeniedException", 400, True),
        ("403", 403, True),  # an S3 HEAD has no body: the status is the code
        ("InvalidAccessKeyId", 403, False),  # credentials, not permissions
        ("ExpiredToken", 403, False),
        ("ThrottlingException", 400, False),
        ("403", 400, False),
    ],
)
def test_only_permission_errors_are_refusals(code: str, status: int, denied: bool) -> None:
    parsed = {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"RequestId": "r"}}
    found = denial_of("s3", "HeadObject", status, parsed)
    assert (found == Denial("s3", "HeadObject", code, status, "r")) if denied else found is None
    assert denial_of("s3", "HeadObject", 200, {"ResponseMetadata": {}}) is None


def test_a_failing_report_never_changes_the_calls_outcome(aws: None) -> None:
    def broken(denial: Denial) -> None:
        raise RuntimeError("telemetry down")

    kms = watch_denials(boto3.session.Session(region_name=REGION), broken).client("kms")
    with denying("kms"), pytest.raises(ClientError, match="AccessDeniedException"):
        kms.list_keys()
    assert kms.list_keys()["Keys"] == []


class RefusingCluster(Connection):
    """An OpenSearch domain whose fine-grained access control maps no role to the caller."""

    bulk_item_status = 0  # 0: refuse the request itself; else answer bulk items so

    def perform_request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if self.bulk_item_status and url.endswith("/_bulk"):
            error = {"type": "security_exception", "reason": "no permissions"}
            item = {"index": {"status": self.bulk_item_status, "error": error}}
            raw = json.dumps({"errors": True, "items": [item]})
            return 200, {"content-type": "application/json"}, raw
        body = {
            "error": {
                "root_cause": [{"type": "security_exception", "reason": "no permissions"}],
                "type": "security_exception",
                "reason": f"no permissions for [indices:data/read/search] and User [name={ROLE}]",
            },
            "status": 403,
        }
        self._raise_error(403, json.dumps(body), "application/json")  # raises
        return None  # never reached


def refusing_index(reported: list[Denial], bulk_item_status: int = 0) -> OpenSearchLexicalIndex:
    client = OpenSearch(
        hosts=[{"host": "search-engram.example", "port": 443}],
        connection_class=RefusingCluster,
        max_retries=0,
    )
    connection = client.transport.get_connection()
    assert isinstance(connection, RefusingCluster)
    connection.bulk_item_status = bulk_item_status
    return OpenSearchLexicalIndex(client=client, ensure_on_write=False, on_denied=reported.append)


SCOPE = Scope(TENANT, "ws-1")


def test_an_opensearch_403_is_reported_with_its_error_type_never_its_reason() -> None:
    reported: list[Denial] = []
    with pytest.raises(IndexUnavailable):
        refusing_index(reported).search(SCOPE, ["retry"], 5)
    assert reported == [Denial("es", "search", "security_exception", 403, None)]


def test_a_failing_report_never_replaces_the_indexs_own_failure() -> None:
    index = refusing_index([])

    def broken(denial: Denial) -> None:
        raise RuntimeError("telemetry down")

    index._on_denied = broken
    with pytest.raises(IndexUnavailable):
        index.search(SCOPE, ["retry"], 5)


def test_a_bulk_item_refused_by_opensearch_is_reported_once() -> None:
    reported: list[Denial] = []
    upsert = ProjectionChange(upsert=ProjectionDoc("mem_1", {"primary": "retry budget"}))
    with pytest.raises(IndexUnavailable):
        refusing_index(reported, bulk_item_status=403).bulk_apply([(SCOPE, upsert)])
    assert reported == [Denial("es", "bulk", "security_exception", 403, None)]
    with pytest.raises(IndexUnavailable):  # another item failure is no refusal
        refusing_index(reported, bulk_item_status=429).bulk_apply([(SCOPE, upsert)])
    assert len(reported) == 1


@pytest.mark.parametrize(
    ("code", "counted"),
    [
        ("STORE_UNAVAILABLE", True),
        ("JOURNAL_CORRUPT", True),
        ("OK", False),
        ("RANKING_UNAVAILABLE", False),
        ("NOT_FOUND", False),
    ],
)
def test_the_audit_sink_counts_store_faults_per_code(
    aws: None, output: Lines, code: str, counted: bool
) -> None:
    PowertoolsAuditSink().record(
        AuditEvent(
            audit_id="aud_1",
            at_ms=0,
            tenant_id=TENANT,
            workspace_id="ws-1",
            principal="agent-alice",
            agent_id=None,
            session_id=None,
            tool="get",
            ok=code == "OK",
            code=code,
        )
    )
    faults = emf_documents(output(), "StoreFaults")
    assert [(d["code"], d["tenant"]) for d in faults] == ([(code, TENANT)] if counted else [])
    if counted:
        (directive,) = faults[0]["_aws"]["CloudWatchMetrics"]
        assert directive["Dimensions"] == [["service", "tenant", "code"]]


def test_a_logger_made_before_the_tenant_was_set_logs_the_tenant_set_since(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The logger is made once a process; its lines carry the tenant the environment names when
    they are written, as the metrics do, not the "unset" of a logger made before (a test or a
    tool that ran first in the same process)."""
    from engram_memory.cloud.observability import get_logger

    monkeypatch.delenv("ENGRAM_TENANT_ID", raising=False)
    logger = get_logger()  # the process's one logger, made by whichever test came first
    handler: Any = logger.registered_handler
    monkeypatch.setattr(handler, "stream", sys.stdout)
    capsys.readouterr()
    logger.info("before the tenant")
    monkeypatch.setenv("ENGRAM_TENANT_ID", TENANT)
    get_logger().info("after it")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert [(line["message"], line["tenant"]) for line in lines] == [
        ("before the tenant", "unset"),
        ("after it", TENANT),
    ]

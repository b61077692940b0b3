"""The OpenSearch security custom resource (``functions/opensearch_security/app.py``), driven like
CloudFormation drives it, against a local domain stand-in on loopback.

The stand-in is an HTTPS server on 127.0.0.1 (a throw-away self-signed certificate the handler is
told to trust) that records every request and re-computes its SigV4 signature with botocore from
what arrived — method, path, the signed headers and the body — so a request passes only if it was
signed for service ``es`` in the region, over exactly the bytes the domain received.
CloudFormation's ``ResponseURL`` is a plain HTTP server on 127.0.0.1 recording the answer's PUT.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

import pytest
from aws_testing import FakeLambdaContext
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from engram_memory.cloud import opensearch_security
from engram_memory.cloud.opensearch_security import AUDIT_CONFIG, SecurityConfigResource
from scripts.cloud_run import self_signed

from engram_testing import QuietHandler

ROOT: Final = Path(__file__).resolve().parents[2]
REGION: Final = "us-east-1"
ACCESS_KEY: Final = "AKIDCUSTOMRESOURCE01"
SECRET_KEY: Final = "custom-resource-secret-key-never-in-a-reason"
SESSION_TOKEN: Final = "custom-resource-session-token-never-in-a-reason"
INDEX: Final = "engram-dev-records"
READER_ROLE: Final = "engram-dev-records_reader"  # named after the index: stacks sharing a domain
WRITER_ROLE: Final = "engram-dev-records_writer"  # never overwrite each other's roles
SECURITY_MANAGER: Final = "arn:aws:iam::123456789012:role/platform-opensearch-security-manager"
READERS: Final = ["arn:aws:iam::123456789012:role/engram-dev-SearchFunctionRole-AAA"]
WRITERS: Final = [
    "arn:aws:iam::123456789012:role/engram-dev-RequestAdmissionFunctionRole-BBB",
    "arn:aws:iam::123456789012:role/engram-dev-ForgetFunctionRole-CCC",
    "arn:aws:iam::123456789012:role/engram-dev-WorkflowStepFunctionRole-DDD",
    "arn:aws:iam::123456789012:role/engram-dev-OutboxDrainerFunctionRole-EEE",
]
SECURITY_API: Final = "/_plugins/_security/api"
EXPECTED_PATHS: Final = [
    f"{SECURITY_API}/roles/{READER_ROLE}",
    f"{SECURITY_API}/roles/{WRITER_ROLE}",
    f"{SECURITY_API}/rolesmapping/{READER_ROLE}",
    f"{SECURITY_API}/rolesmapping/{WRITER_ROLE}",
    f"{SECURITY_API}/audit/config",
]


# --------------------------------------------------------------------------------------------
# The loopback servers
# --------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Domain:
    """The domain stand-in: records requests, keeps the last body PUT per path, answers the
    scripted statuses (per path, consumed in order; 200 when none is left)."""

    requests: list[Recorded] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    scripted: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, recorded: Recorded) -> int:
        with self.lock:
            self.requests.append(recorded)
            statuses = self.scripted.get(recorded.path) or []
            status = statuses.pop(0) if statuses else 200
            if status == 200 and recorded.method == "PUT":
                self.state[recorded.path] = recorded.json()
            elif recorded.method == "DELETE":
                status = status if recorded.path in self.state or status != 200 else 404
                self.state.pop(recorded.path, None)
            return status


def _recording_handler(on_request: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_PUT(self) -> None:
            self.record("PUT")

        def do_DELETE(self) -> None:
            self.record("DELETE")

        def record(self, method: str) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            recorded = Recorded(method, self.path, headers, self.body())
            status = on_request(recorded)
            data = json.dumps({"status": "OK" if status < 300 else "ERROR"}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@dataclass
class Loopback:
    domain: Domain
    endpoint: str
    response_url: str
    answers: list[Recorded]
    trust: ssl.SSLContext


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[Loopback]:
    domain = Domain()
    cert, key = self_signed(tmp_path)  # the cloud gate's throw-away CA, for 127.0.0.1
    https = ThreadingHTTPServer(("127.0.0.1", 0), _recording_handler(domain.answer))
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    https.socket = server_context.wrap_socket(https.socket, server_side=True)
    answers: list[Recorded] = []

    def record_answer(recorded: Recorded) -> int:
        answers.append(recorded)
        return 200

    plain = ThreadingHTTPServer(("127.0.0.1", 0), _recording_handler(record_answer))
    for server in (https, plain):
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        yield Loopback(
            domain,
            f"https://127.0.0.1:{https.server_address[1]}",
            f"http://127.0.0.1:{plain.server_address[1]}/cfn-response?X-Amz-Signature=presigned",
            answers,
            trust,
        )
    finally:
        for server in (https, plain):
            server.shutdown()
            server.server_close()


# --------------------------------------------------------------------------------------------
# Driving the handler
# --------------------------------------------------------------------------------------------


def lambda_context(remaining_ms: int = 120_000) -> FakeLambdaContext:
    """The custom resource's function, with the time CloudFormation leaves it."""
    return FakeLambdaContext.of(
        "engram-dev-opensearch-security", remaining_ms=remaining_ms, memory_limit_in_mb=256
    )


def event(
    loopback: Loopback,
    request_type: str,
    *,
    endpoint: str | None = None,
    readers: list[str] = READERS,
    writers: list[str] = WRITERS,
    physical_id: str | None = None,
    shared: bool = False,
) -> dict[str, Any]:
    sample: dict[str, Any] = json.loads(
        (ROOT / "events" / "opensearch_security_create.json").read_text("utf-8")
    )
    sample["RequestType"] = request_type
    sample["ResponseURL"] = loopback.response_url
    sample["ResourceProperties"].update(
        Endpoint=endpoint or loopback.endpoint,
        Index=INDEX,
        ReaderRoleArns=readers,
        WriterRoleArns=writers,
    )
    if shared:
        sample["ResourceProperties"].update(SharedDomain="true", SecurityRoleArn=SECURITY_MANAGER)
    if physical_id is not None:
        sample["PhysicalResourceId"] = physical_id
    return sample


def resource(
    loopback: Loopback, signed_as: list[str | None] | None = None, **kwargs: Any
) -> SecurityConfigResource:
    """The handler, with the credentials it signs with; ``signed_as`` collects the role each
    run asked for (None: the function's own, the domain's master user)."""
    credentials = Credentials(ACCESS_KEY, SECRET_KEY, SESSION_TOKEN)

    def credentials_of(role_arn: str | None) -> tuple[Credentials, str]:
        if signed_as is not None:
            signed_as.append(role_arn)
        return credentials, REGION

    return SecurityConfigResource(
        credentials=credentials_of,
        ssl_context=loopback.trust,
        sleep=lambda _s: None,
        **kwargs,
    )


def cloudformation_answer(loopback: Loopback) -> dict[str, Any]:
    (answer,) = loopback.answers
    assert answer.method == "PUT"
    assert answer.path.startswith("/cfn-response?X-Amz-Signature=")
    assert answer.headers.get("content-type", "") == ""
    decoded: dict[str, Any] = answer.json()
    return decoded


def signature_is_valid(recorded: Recorded, endpoint: str) -> bool:
    """Re-sign what arrived (the headers it signed, its body) and compare the signatures."""
    authorization = recorded.headers["authorization"]
    algorithm, _, fields = authorization.partition(" ")
    parts = dict(item.strip().split("=", 1) for item in fields.split(","))
    credential_scope = parts["Credential"].split("/")
    assert algorithm == "AWS4-HMAC-SHA256"
    assert credential_scope[0] == ACCESS_KEY
    assert credential_scope[2:] == [REGION, "es", "aws4_request"]
    signed = parts["SignedHeaders"].split(";")
    assert {"host", "x-amz-date", "x-amz-security-token"} <= set(signed)
    request = AWSRequest(
        method=recorded.method,
        url=endpoint + recorded.path,
        data=recorded.body,
        headers={name: recorded.headers[name] for name in signed},
    )
    request.context["timestamp"] = recorded.headers["x-amz-date"]
    signer = SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY, SESSION_TOKEN), "es", REGION)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return bool(expected == parts["Signature"])


# --------------------------------------------------------------------------------------------
# Create, Update, Delete
# --------------------------------------------------------------------------------------------


def test_create_maps_the_roles_and_enables_audit_logs_with_signed_requests(
    loopback: Loopback,
) -> None:
    outcome = resource(loopback)(event(loopback, "Create"), lambda_context())

    assert outcome["Status"] == "SUCCESS" and outcome["Answered"] is True
    assert [r.path for r in loopback.domain.requests] == EXPECTED_PATHS
    for recorded in loopback.domain.requests:
        assert recorded.method == "PUT"
        assert recorded.headers["content-type"] == "application/json"
        assert recorded.headers["x-amz-security-token"] == SESSION_TOKEN
        assert signature_is_valid(recorded, loopback.endpoint), recorded.path
    state = loopback.domain.state
    reader = state[f"{SECURITY_API}/roles/{READER_ROLE}"]
    assert reader["cluster_permissions"] == []
    ((reader_grant),) = reader["index_permissions"]
    assert reader_grant["index_patterns"] == [INDEX]
    assert not [a for a in reader_grant["allowed_actions"] if "write" in a or "admin" in a]
    writer = state[f"{SECURITY_API}/roles/{WRITER_ROLE}"]
    assert writer["cluster_permissions"] == ["indices:data/write/bulk"]
    ((writer_grant),) = writer["index_permissions"]
    assert writer_grant["index_patterns"] == [INDEX]
    assert set(reader_grant["allowed_actions"]) < set(writer_grant["allowed_actions"])
    for action in writer_grant["allowed_actions"]:  # document actions, and two index admin ones
        assert action.startswith(("indices:data/read/", "indices:data/write/")) or action in {
            "indices:admin/create",
            "indices:admin/refresh*",
        }, action
    assert state[f"{SECURITY_API}/rolesmapping/{READER_ROLE}"]["backend_roles"] == READERS
    assert state[f"{SECURITY_API}/rolesmapping/{WRITER_ROLE}"]["backend_roles"] == WRITERS
    assert state[f"{SECURITY_API}/audit/config"] == json.loads(json.dumps(AUDIT_CONFIG))

    answer = cloudformation_answer(loopback)
    sample = event(loopback, "Create")
    assert answer["Status"] == "SUCCESS"
    assert answer["PhysicalResourceId"] == "engram-opensearch-security:127.0.0.1/engram-dev-records"
    for key in ("StackId", "RequestId", "LogicalResourceId"):
        assert answer[key] == sample[key]
    assert answer["Data"]["AuditLogs"] == "enabled"


def test_the_audit_configuration_records_failures_and_config_changes_but_no_content(
    loopback: Loopback,
) -> None:
    resource(loopback)(event(loopback, "Create"), lambda_context())
    config = loopback.domain.state[f"{SECURITY_API}/audit/config"]
    audit, compliance = config["audit"], config["compliance"]
    assert config["enabled"] is True
    assert audit["enable_rest"] is True and audit["enable_transport"] is True
    for layer in ("disabled_rest_categories", "disabled_transport_categories"):
        disabled = set(audit[layer])
        assert not disabled & {"FAILED_LOGIN", "MISSING_PRIVILEGES", "BAD_HEADERS"}, layer
        assert not disabled & {"SSL_EXCEPTION", "OPENSEARCH_SECURITY_INDEX_ATTEMPT"}, layer
    # the index holds memory text: nothing of a request's body or a document reaches the log
    assert audit["log_request_body"] is False
    assert audit["exclude_sensitive_headers"] is True
    assert compliance["read_metadata_only"] is True
    assert compliance["write_metadata_only"] is True
    assert compliance["write_log_diffs"] is False
    assert compliance["read_watched_fields"] == {}
    assert compliance["write_watched_indices"] == []
    assert compliance["enabled"] is True and compliance["internal_config"] is True


def test_update_applies_the_same_configuration_again(loopback: Loopback) -> None:
    handler = resource(loopback)
    handler(event(loopback, "Create"), lambda_context())
    after_create = json.loads(json.dumps(loopback.domain.state))
    bodies = [r.body for r in loopback.domain.requests]
    loopback.answers.clear()

    outcome = handler(
        event(
            loopback,
            "Update",
            physical_id="engram-opensearch-security:127.0.0.1/engram-dev-records",
        ),
        lambda_context(),
    )

    assert outcome["Status"] == "SUCCESS"
    assert [r.body for r in loopback.domain.requests[len(bodies) :]] == bodies
    assert loopback.domain.state == after_create
    # the same physical id: CloudFormation sees an update, not a replacement
    assert cloudformation_answer(loopback)["PhysicalResourceId"] == (
        "engram-opensearch-security:127.0.0.1/engram-dev-records"
    )


def test_an_update_without_a_role_removes_it_from_the_mapping(loopback: Loopback) -> None:
    handler = resource(loopback)
    handler(event(loopback, "Create"), lambda_context())
    handler(event(loopback, "Update", writers=WRITERS[:2]), lambda_context())
    mapping = loopback.domain.state[f"{SECURITY_API}/rolesmapping/{WRITER_ROLE}"]
    assert mapping["backend_roles"] == WRITERS[:2]


def test_a_shared_domain_gets_the_stacks_roles_signed_as_its_security_manager(
    loopback: Loopback,
) -> None:
    """A domain other stacks share: roles and mappings named after this stack's index, signed
    as the role the domain's owner mapped to security_manager, and no audit configuration
    (the owner's, for every tenant)."""
    signed_as: list[str | None] = []
    outcome = resource(loopback, signed_as)(
        event(loopback, "Create", shared=True), lambda_context()
    )
    assert outcome["Status"] == "SUCCESS"
    assert signed_as == [SECURITY_MANAGER]
    assert [r.path for r in loopback.domain.requests] == EXPECTED_PATHS[:4]
    writer = loopback.domain.state[f"{SECURITY_API}/roles/{WRITER_ROLE}"]
    (permission,) = writer["index_permissions"]
    assert permission["index_patterns"] == [INDEX]  # no pattern that reaches another tenant


def test_another_stack_on_the_shared_domain_keeps_its_own_roles(loopback: Loopback) -> None:
    handler = resource(loopback)
    handler(event(loopback, "Create", shared=True), lambda_context())
    other = event(loopback, "Create", shared=True)
    other["ResourceProperties"]["Index"] = "engram-other-records"
    other["ResourceProperties"]["ReaderRoleArns"] = ["arn:aws:iam::123456789012:role/other-search"]
    other["ResourceProperties"]["WriterRoleArns"] = ["arn:aws:iam::123456789012:role/other-write"]
    handler(other, lambda_context())
    mine = loopback.domain.state[f"{SECURITY_API}/rolesmapping/{READER_ROLE}"]
    theirs = loopback.domain.state[f"{SECURITY_API}/rolesmapping/engram-other-records_reader"]
    assert mine["backend_roles"] == READERS
    assert theirs["backend_roles"] == ["arn:aws:iam::123456789012:role/other-search"]


def test_deleting_a_stack_on_a_shared_domain_removes_its_roles_and_mappings(
    loopback: Loopback,
) -> None:
    handler = resource(loopback)
    handler(event(loopback, "Create", shared=True), lambda_context())
    loopback.answers.clear()
    outcome = handler(event(loopback, "Delete", shared=True), lambda_context())
    assert outcome["Status"] == "SUCCESS"
    deletes = [r.path for r in loopback.domain.requests if r.method == "DELETE"]
    assert sorted(deletes) == sorted(EXPECTED_PATHS[:4])
    assert not [p for p in loopback.domain.state if "engram-dev-records" in p]
    loopback.answers.clear()
    again = handler(event(loopback, "Delete", shared=True), lambda_context())
    assert again["Status"] == "SUCCESS"  # already gone (404) is removed


def test_a_shared_domain_without_a_security_role_is_refused(loopback: Loopback) -> None:
    refused = event(loopback, "Create", shared=True)
    del refused["ResourceProperties"]["SecurityRoleArn"]
    outcome = resource(loopback)(refused, lambda_context())
    assert outcome["Status"] == "FAILED"
    assert "SecurityRoleArn" in outcome["Reason"]
    assert loopback.domain.requests == []


def test_delete_leaves_the_domain_alone_and_answers_success(loopback: Loopback) -> None:
    outcome = resource(loopback)(
        event(loopback, "Delete", physical_id="engram-opensearch-security:old-domain"),
        lambda_context(),
    )
    assert outcome["Status"] == "SUCCESS"
    assert loopback.domain.requests == []
    answer = cloudformation_answer(loopback)
    assert answer["Status"] == "SUCCESS"
    assert answer["PhysicalResourceId"] == "engram-opensearch-security:old-domain"


# --------------------------------------------------------------------------------------------
# Failures: always answered, never with a secret
# --------------------------------------------------------------------------------------------


def assert_no_secret(text: str, loopback: Loopback) -> None:
    for secret in (SECRET_KEY, SESSION_TOKEN, "X-Amz-Signature", loopback.response_url):
        assert secret not in text


def test_a_refused_step_fails_the_resource_naming_the_step(loopback: Loopback) -> None:
    path = f"{SECURITY_API}/rolesmapping/{READER_ROLE}"
    loopback.domain.scripted[path] = [403]

    outcome = resource(loopback)(event(loopback, "Create"), lambda_context())

    assert outcome["Status"] == "FAILED"
    assert [r.path for r in loopback.domain.requests] == EXPECTED_PATHS[:3]  # stops there
    answer = cloudformation_answer(loopback)
    assert answer["Status"] == "FAILED"
    assert answer["Reason"].startswith(f"PUT {path} answered HTTP 403")
    assert lambda_context().log_stream_name in answer["Reason"]
    assert_no_secret(json.dumps(answer), loopback)


def test_throttling_and_unavailability_are_retried(loopback: Loopback) -> None:
    loopback.domain.scripted[f"{SECURITY_API}/roles/{READER_ROLE}"] = [503, 429]
    loopback.domain.scripted[f"{SECURITY_API}/audit/config"] = [502]

    outcome = resource(loopback)(event(loopback, "Create"), lambda_context())

    assert outcome["Status"] == "SUCCESS"
    assert len(loopback.domain.requests) == len(EXPECTED_PATHS) + 3
    assert cloudformation_answer(loopback)["Status"] == "SUCCESS"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_an_unreachable_domain_fails_by_the_deadline_and_still_answers(
    loopback: Loopback,
) -> None:
    unreachable = f"https://127.0.0.1:{_closed_port()}"
    # 15 s of the Lambda's time are kept for the answer: 16 s leave one second of retries
    outcome = resource(loopback)(
        event(loopback, "Create", endpoint=unreachable), lambda_context(16_000)
    )
    assert outcome["Status"] == "FAILED"
    answer = cloudformation_answer(loopback)
    assert answer["Status"] == "FAILED"
    assert "failed until the deadline (ConnectionRefusedError)" in answer["Reason"]
    assert_no_secret(json.dumps(answer), loopback)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"Endpoint": "http://127.0.0.1:9"}, "Endpoint must be https://"),
        ({"Index": "Engram Records"}, "Index must be an OpenSearch index name"),
        ({"ReaderRoleArns": []}, "ReaderRoleArns must be a non-empty list"),
        ({"WriterRoleArns": ["arn:aws:iam::123:user/x"]}, "WriterRoleArns[0] is not an IAM role"),
        ({"WriterRoleArns": READERS}, "a role is listed as both reader and writer"),
    ],
)
def test_malformed_properties_fail_before_any_request(
    loopback: Loopback, change: dict[str, Any], reason: str
) -> None:
    sample = event(loopback, "Create")
    sample["ResourceProperties"].update(change)
    outcome = resource(loopback)(sample, lambda_context())
    assert outcome["Status"] == "FAILED"
    assert loopback.domain.requests == []
    assert cloudformation_answer(loopback)["Reason"].startswith(reason)


def test_an_unknown_request_type_is_answered_failed(loopback: Loopback) -> None:
    outcome = resource(loopback)(event(loopback, "Rename"), lambda_context())
    assert outcome["Status"] == "FAILED"
    assert loopback.domain.requests == []
    assert cloudformation_answer(loopback)["Status"] == "FAILED"


def test_an_unexpected_error_is_answered_with_its_type_only(loopback: Loopback) -> None:
    def broken(_role_arn: str | None) -> Any:
        raise RuntimeError(f"credential provider said {SECRET_KEY}")

    handler = SecurityConfigResource(credentials=broken, sleep=lambda _s: None)
    outcome = handler(event(loopback, "Create"), lambda_context())
    assert outcome["Status"] == "FAILED"
    answer = cloudformation_answer(loopback)
    assert answer["Reason"].startswith("unexpected RuntimeError")
    assert_no_secret(json.dumps(answer), loopback)


def test_a_lost_answer_is_retried_then_reported_without_raising(loopback: Loopback) -> None:
    sample = event(loopback, "Delete", physical_id="engram-opensearch-security:x")
    sample["ResponseURL"] = f"http://127.0.0.1:{_closed_port()}/cfn-response"
    outcome = resource(loopback)(sample, lambda_context())
    assert outcome == {"Status": "SUCCESS", "Reason": "", "Answered": False}


def test_the_function_folder_is_a_thin_handler_over_the_core_module() -> None:
    path = ROOT / "functions" / "opensearch_security" / "app.py"
    spec = importlib.util.spec_from_file_location("opensearch_security_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.handler, SecurityConfigResource)
    assert len(path.read_text("utf-8").splitlines()) <= 8
    assert opensearch_security.REVISION


def test_on_a_shared_domain_it_signs_with_the_assumed_roles_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default credentials: the function's own, or for a shared domain those STS hands out
    for the owner's security manager (moto's STS)."""
    from moto import mock_aws

    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        own, region = opensearch_security._default_credentials(None)
        assumed, _ = opensearch_security._default_credentials(SECURITY_MANAGER)
    assert region == REGION
    frozen = assumed.get_frozen_credentials()
    assert frozen.access_key != own.get_frozen_credentials().access_key and frozen.token

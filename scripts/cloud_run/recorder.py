"""Every AWS call the run makes, as the services receive it: who signed it, which operation, with
which parameters.

AWS decides a request by its signer's policies and the request itself, so that is what is
recorded, at the receiving end: moto's WSGI dispatcher (DynamoDB, KMS, S3, Secrets Manager, Step
Functions, CloudWatch Logs, CloudFormation, ...), the harness's Lambda service (``Invoke``) and
the fake OpenSearch domain (``es:ESHttp*``). Each worker signs with its own access key
(``settings.access_key``), so a request names the function, hence the role, that made it; the
harness's own set-up calls sign with another key and are not recorded.

A ``Call`` keeps the operation's parameters as sent (the JSON body of the JSON protocols, the
form of the query protocols, the bucket/key/query of S3, the method/path of OpenSearch) and, for
KMS, the key the answer names (a ``Decrypt`` need not name its key: the ciphertext does). The
``iam`` module turns each into the authorization requests AWS would evaluate.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch
from urllib.parse import parse_qs, unquote

from .settings import principal_of_key


@dataclass(frozen=True)
class Call:
    """One request a principal of the stack made to an AWS service."""

    principal: str  # the template's logical id of the function or state machine, or "Operator"
    service: str  # the signing name: dynamodb, kms, s3, secretsmanager, states, logs, es, ...
    operation: str  # the API operation: PutItem, Decrypt, GetObject, Invoke, ESHttpPut, ...
    params: dict[str, Any] = field(default_factory=dict)
    answer: dict[str, Any] = field(default_factory=dict)
    status: int = 200

    def as_json(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "service": self.service,
            "operation": self.operation,
            "params": self.params,
            "answer": self.answer,
            "status": self.status,
        }


def access_key_in(authorization: str) -> str:
    """The access key id of a SigV4 ``Authorization`` header ('' when unsigned)."""
    credential = authorization.split("Credential=", 1)[-1] if "Credential=" in authorization else ""
    return credential.split("/", 1)[0]


def signing_service(authorization: str) -> str:
    parts = authorization.split("Credential=", 1)[-1].split(",", 1)[0].split("/")
    return parts[3] if len(parts) > 3 else ""


class CallRecorder:
    """The calls of the run, in the order the services answered them."""

    def __init__(self, journal: Path | None = None) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.journal = journal
        # the principal whose request moto is answering on this thread (fault injection reads it)
        self.current = threading.local()

    def add(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)
            if self.journal is not None:
                with self.journal.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(call.as_json(), sort_keys=True) + "\n")

    def since(self, mark: int) -> list[Call]:
        with self.lock:
            return list(self.calls[mark:])

    # -- moto ------------------------------------------------------------------------------------

    def hook_moto(self) -> Callable[[], None]:
        """Record every signed request moto's dispatcher answers (in this process, where
        ``ThreadedMotoServer`` runs), until the returned callable unhooks it."""
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication

        recorder = self
        dispatch = DomainDispatcherApplication.__call__

        def recorded(app: Any, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            authorization = str(environ.get("HTTP_AUTHORIZATION", ""))
            principal = principal_of_key(access_key_in(authorization))
            if principal is None:
                return dispatch(app, environ, start_response)  # type: ignore[no-any-return]
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            environ["wsgi.input"] = io.BytesIO(body)
            recorder.current.principal = principal
            status: list[int] = []

            def start(status_line: str, headers: Any, *args: Any) -> Any:
                status.append(int(status_line.split(" ", 1)[0]))
                return start_response(status_line, headers, *args)

            try:
                answered = b"".join(dispatch(app, environ, start))
            finally:
                recorder.current.principal = None
            service = signing_service(authorization)
            operation, params = parse_request(service, environ, body)
            recorder.add(
                Call(
                    principal,
                    service,
                    operation,
                    params,
                    answer_of(service, answered),
                    status[0] if status else 0,
                )
            )
            return [answered]

        # moto has no hook on its dispatcher: wrapped while the harness lives (a benchmark
        # starts several harnesses in one process)
        patcher = patch.object(DomainDispatcherApplication, "__call__", recorded)
        patcher.start()
        return patcher.stop

    # -- the harness's own services --------------------------------------------------------------

    def lambda_invoke(self, authorization: str, function: str, event: Any) -> None:
        """An ``Invoke`` the Lambda service answered; the state machines' tasks sign as Step
        Functions, and the workflow step's ``workflow`` names the machine."""
        principal = principal_of_key(access_key_in(authorization))
        if principal == "StepFunctions" and isinstance(event, dict):
            principal = f"{str(event.get('workflow', '')).title()}StateMachine"
        if principal is not None:
            self.add(Call(principal, "lambda", "Invoke", {"FunctionName": function}))

    def runner(self, principal: str, function: str) -> Callable[[], None]:
        """What Lambda does with the function's role on each invocation (its logs, its traces),
        recorded as one ``lambda:Run`` of the function (``iam.lambda_runtime``)."""

        def ran() -> None:
            self.add(Call(principal, "lambda", "Run", {"FunctionName": function}))

        return ran

    def opensearch(self, method: str, path: str, authorization: str, status: int) -> None:
        principal = principal_of_key(access_key_in(authorization))
        if principal is not None:
            operation = "ESHttp" + method.title()
            self.add(Call(principal, "es", operation, {"path": path}, status=status))

    def wrap_opensearch(
        self, handle: Callable[[str, str, bytes, str], tuple[int, Any]]
    ) -> Callable[[str, str, bytes, str], tuple[int, Any]]:
        recorder = self

        def recorded(
            method: str, path: str, body: bytes, authorization: str = ""
        ) -> tuple[int, Any]:
            status, answer = handle(method, path, body, authorization)
            recorder.opensearch(method, path, authorization, status)
            return status, answer

        return recorded


# -- the wire, parsed -------------------------------------------------------------------------------


def parse_request(service: str, environ: dict[str, Any], body: bytes) -> tuple[str, dict[str, Any]]:
    """The operation and its parameters, by the service's protocol."""
    target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
    if target:  # JSON protocols: DynamoDB, KMS, Secrets Manager, Step Functions, Logs, ...
        return target.rsplit(".", 1)[-1], json.loads(body or b"{}")
    if service == "s3":
        return s3_operation(environ, body)
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    if "Action" in form:  # query protocols: STS, CloudFormation, SNS, CloudWatch (query)
        return form.pop("Action"), form
    return str(environ.get("REQUEST_METHOD")), {"path": environ.get("PATH_INFO", "")}


def s3_operation(environ: dict[str, Any], body: bytes) -> tuple[str, dict[str, Any]]:
    """S3's REST API (path style, as botocore addresses an IP endpoint)."""
    method = str(environ.get("REQUEST_METHOD"))
    path = unquote(str(environ.get("PATH_INFO", "")))
    bucket, _, key = path.lstrip("/").partition("/")
    query = {k: v[0] for k, v in parse_qs(str(environ.get("QUERY_STRING", ""))).items()}
    params: dict[str, Any] = {"Bucket": bucket, **({"Key": key} if key else {}), "query": query}
    if key:
        if method == "PUT" and environ.get("HTTP_X_AMZ_COPY_SOURCE"):
            params["CopySource"] = unquote(str(environ["HTTP_X_AMZ_COPY_SOURCE"]))
            return "CopyObject", params
        by_method = {
            "GET": "GetObject",
            "HEAD": "HeadObject",
            "PUT": "PutObject",
            "DELETE": "DeleteObject",
        }
        return by_method.get(method, method), params
    if method == "POST" and "delete" in query:
        params["Keys"] = list(_deleted_keys(body))
        return "DeleteObjects", params
    if method == "GET" and query.get("list-type") == "2":
        return "ListObjectsV2", params
    if method == "GET" and not query:
        return "ListObjects", params
    if method == "HEAD":
        return "HeadBucket", params
    return f"{method} bucket?{'&'.join(sorted(query))}", params


def _deleted_keys(body: bytes) -> Iterator[str]:
    import xml.etree.ElementTree as ET  # moto's request, built by botocore

    root = ET.fromstring(body)  # noqa: S314
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == "Key" and element.text:
            yield element.text


def answer_of(service: str, answered: bytes) -> dict[str, Any]:
    """What the recording keeps of an answer: the key a KMS answer names."""
    if service != "kms":
        return {}
    try:
        data = json.loads(answered or b"{}")
    except ValueError:
        return {}
    return {"KeyId": data["KeyId"]} if isinstance(data, dict) and "KeyId" in data else {}

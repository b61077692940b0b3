"""Every function of the template, run from the ``sam build`` output, against moto out of process.

The harness (this process, the tool venv) holds everything that is not the product:

- **moto** as a server (``ThreadedMotoServer``) for DynamoDB, S3, KMS, Secrets Manager and Step
  Functions; moto runs the real ASL of ``infra/statemachines`` (``execute_state_machine``). The
  resources are the template's: tables with the template's key schema, the KMS key, generated
  secrets, the two state machines with the template's ``DefinitionSubstitutions``.
- **the Lambda service**: an HTTP endpoint speaking Lambda's ``Invoke`` API. The adapter's boto3
  client reaches it through ``AWS_ENDPOINT_URL_LAMBDA``; moto's Step Functions interpreter reaches
  it for its Lambda tasks. Each invocation goes to the function's **worker**: a
  ``python3.12 -I -S scripts/lambda_worker.py`` process whose ``sys.path`` is only
  ``.aws-sam/build/<Function>``, the built layer's ``python/`` and a runtime boto3 directory.
- **the identity provider**: an Ed25519 issuer whose OIDC discovery document and JWKS are served
  over HTTPS (a throw-away CA the workers trust through ``SSL_CERT_FILE``/``REQUESTS_CA_BUNDLE``);
  the adapter finds the JWKS through the discovery document, as it does in AWS.
- **OpenSearch**: a fake that answers the subset of the REST API the index adapter sends (signed,
  gzip-compressed requests from opensearch-py, over HTTPS): create index, index/get/delete a
  document, ``_bulk``, ``_search`` (term filters, ``match`` clauses by field boost, a plain
  term-count score; not BM25), ``_refresh``. Any other request is answered 400 and counted as a
  failure, so a request shape the fake does not know cannot pass unnoticed. Real OpenSearch is
  exercised only by the live test (``ENGRAM_OPENSEARCH_URL``).

Each function's environment is the template's (``Globals`` and its own), with every intrinsic
resolved against these resources; a ``Ref`` the harness cannot resolve fails the gate. Then:

1. **smoke**: every ``AWS::Serverless::Function`` needs ``events/<folder>.json`` or
   ``events/<folder>_*.json`` (``folder`` = its ``CodeUri``); each sample is invoked; the handler
   must import and answer, and every module it loaded outside the standard library must come from
   its build folder, the layer or the runtime directory;
2. **flow**: the adapter receives API Gateway HTTP API v2 events and drives initialize,
   tools/list, capture, request_admission, search, get, withdraw (form mode, 2026-07-28, the
   withdraw state machine runs) and forget (URL mode, 2025-11-25: the approval page is the built
   approval function, the forget state machine runs), then search and get see the record gone.

Output: ``  ok   ...`` / ``  FAIL ...`` lines; exit 1 on a FAIL.

Usage: python scripts/cloud_run.py --build-dir DIR --python312 PATH --runtime-dir DIR
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import datetime
import gzip
import hashlib
import ipaddress
import json
import re
import secrets
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

ROOT: Final = Path(__file__).resolve().parents[1]
EVENTS: Final = ROOT / "events"
WORKER: Final = ROOT / "scripts" / "lambda_worker.py"
REGION: Final = "us-east-1"
ACCOUNT: Final = "123456789012"
TENANT: Final = "dev"
AUDIENCE: Final = "https://memory.example.com/mcp"
APPROVAL_AUDIENCE: Final = "https://memory.example.com/approvals"
PRINCIPAL: Final = "agent-alice"
WORKSPACE: Final = "ws-research-0001"
TOOLS: Final = ("search", "get", "capture", "request_admission", "withdraw", "forget")
AUDIT_MESSAGE: Final = (
    "audit"  # engram_memory.cloud.observability.AUDIT_MESSAGE (not importable here)
)
# Errors that mean the code could not run as built (not a behaviour of the product).
BROKEN_BUILD_ERRORS: Final = frozenset(
    {
        "Runtime.ImportModuleError",
        "ImportError",
        "ModuleNotFoundError",
        "NameError",
        "AttributeError",
        "SyntaxError",
        "TypeError",
    }
)


class Report:
    def __init__(self) -> None:
        self.failed = 0

    def check(self, ok: bool, text: str) -> bool:
        print(f"  {'ok  ' if ok else 'FAIL'} {text}", flush=True)
        self.failed += 0 if ok else 1
        return ok


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --------------------------------------------------------------------------------------------
# TLS and the identity provider
# --------------------------------------------------------------------------------------------


def self_signed(work: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1/localhost (its own CA) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cloud-check")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = work / "cert.pem", work / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


class Issuer:
    """Ed25519 access tokens with the contract's claims, and their JWKS."""

    def __init__(self, url: str) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self.url = url
        self._key = Ed25519PrivateKey.generate()
        self.minted: list[str] = []  # every bearer or ID token handed out (the payload scan)
        self.grants: dict[str, dict[str, str]] = {}  # authorization code -> its sign-in
        raw = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        self.jwks = {
            "keys": [
                {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": "k1", "alg": "EdDSA", "use": "sig"}
            ]
        }

    def sign_in(self, authorization_url: str, subject: str) -> tuple[str, str]:
        """The person signs in at the authorization endpoint as ``subject``: the code and the
        state the provider redirects back with (its grant kept for the token endpoint)."""
        from urllib.parse import parse_qs, urlsplit

        query = {k: v[0] for k, v in parse_qs(urlsplit(authorization_url).query).items()}
        code = secrets.token_urlsafe(24)
        self.grants[code] = {**query, "sub": subject}
        return code, query.get("state", "")

    def exchange(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """The token endpoint: a single-use code, its client and redirect URI, PKCE S256."""
        import jwt

        grant = self.grants.pop(form.get("code", ""), None)
        challenge = (
            base64.urlsafe_b64encode(
                hashlib.sha256(form.get("code_verifier", "").encode()).digest()
            )
            .rstrip(b"=")
            .decode()
        )
        if (
            grant is None
            or form.get("grant_type") != "authorization_code"
            or form.get("client_id") != grant.get("client_id")
            or form.get("redirect_uri") != grant.get("redirect_uri")
            or grant.get("code_challenge_method") != "S256"
            or challenge != grant.get("code_challenge")
        ):
            return 400, {"error": "invalid_grant"}
        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": grant["client_id"],
            "sub": grant["sub"],
            "iat": now,
            "exp": now + 300,
            "nonce": grant.get("nonce", ""),
        }
        id_token: str = jwt.encode(claims, self._key, algorithm="EdDSA", headers={"kid": "k1"})
        self.minted.append(id_token)
        return 200, {"id_token": id_token, "token_type": "Bearer", "expires_in": 300}

    def token(self, tools: tuple[str, ...] = TOOLS) -> str:
        import jwt

        now = int(time.time())
        claims = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": PRINCIPAL,
            "iat": now,
            "nbf": now,
            "exp": now + 900,
            "jti": secrets.token_urlsafe(18),
            "tenant_id": TENANT,
            "workspace_id": WORKSPACE,
            "purpose_ref": "purpose:general",
            "engram_tools": list(tools),
            "engram_confirm": [],
        }
        token: str = jwt.encode(
            claims, self._key, algorithm="EdDSA", headers={"kid": "k1", "typ": "at+jwt"}
        )
        self.minted.append(token)
        return token


# --------------------------------------------------------------------------------------------
# The fake OpenSearch domain (see the module docstring) and the JWKS, on one HTTPS server
# --------------------------------------------------------------------------------------------

BOOST_RE: Final = re.compile(r"^[a-z_]+$")


JWKS_PATH: Final = "/.well-known/jwks.json"
AUTHORIZE_PATH: Final = "/authorize"  # never fetched: the harness plays the person signing in
TOKEN_PATH: Final = "/token"
SECURITY_API_RE: Final = re.compile(
    r"^/_plugins/_security/api/(roles/[a-z_]+|rolesmapping/[a-z_]+|audit/config)$"
)
SIGV4_ES_SCOPE_RE: Final = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/" + REGION + r"/es/aws4_request, "
    r"SignedHeaders=[a-z0-9;-]*host[a-z0-9;-]*, Signature=[0-9a-f]{64}$"
)


class FakeOpenSearch:
    def __init__(self) -> None:
        self.indices: dict[str, dict[str, dict[str, Any]]] = {}
        self.unknown: list[str] = []
        self.requests: list[str] = []
        # the security plugin's API (the custom resource): path -> last body, and whether every
        # request to it carried a SigV4 signature for service es in the region
        self.security: dict[str, Any] = {}
        self.security_unsigned: list[str] = []
        self.lock = threading.Lock()

    def handle(
        self, method: str, path: str, body: bytes, authorization: str = ""
    ) -> tuple[int, Any]:
        bare = path.split("?", 1)[0]
        parts = [unquote(p) for p in bare.strip("/").split("/") if p]
        with self.lock:
            self.requests.append(f"{method} /{'/'.join(parts[:1] + ['…'] * (len(parts) > 1))}")
            if method == "PUT" and SECURITY_API_RE.match(bare):
                if not SIGV4_ES_SCOPE_RE.match(authorization):
                    self.security_unsigned.append(bare)
                    return 403, {"error": {"type": "security_exception"}, "status": 403}
                self.security[bare] = json.loads(body)
                return 200, {"status": "OK"}
            return self._route(method, parts, body)

    def _route(self, method: str, parts: list[str], body: bytes) -> tuple[int, Any]:
        if method == "HEAD" and not parts:
            return 200, {}
        if parts == ["_bulk"] or (len(parts) == 2 and parts[1] == "_bulk"):
            return 200, self._bulk(body, parts[0] if len(parts) == 2 else None)
        if len(parts) == 1 and method == "PUT":
            if parts[0] in self.indices:
                return 400, {"error": {"type": "resource_already_exists_exception"}, "status": 400}
            self.indices[parts[0]] = {}
            return 200, {"acknowledged": True, "index": parts[0]}
        if len(parts) == 2 and parts[1] == "_refresh":
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if len(parts) == 2 and parts[1] == "_search" and method in ("GET", "POST"):
            if parts[0] not in self.indices:
                return 404, {"error": {"type": "index_not_found_exception"}, "status": 404}
            return 200, self._search(parts[0], json.loads(body or b"{}"))
        if len(parts) == 3 and parts[1] == "_doc":
            index, doc_id = parts[0], parts[2]
            if method in ("PUT", "POST"):
                docs = self.indices.setdefault(index, {})
                created = doc_id not in docs
                docs[doc_id] = json.loads(body)
                result = "created" if created else "updated"
                return (201 if created else 200), {"_id": doc_id, "result": result}
            if index not in self.indices:
                return 404, {"error": {"type": "index_not_found_exception"}, "status": 404}
            if method == "GET":
                source = self.indices[index].get(doc_id)
                if source is None:
                    return 404, {"_id": doc_id, "found": False}
                return 200, {"_id": doc_id, "found": True, "_source": source}
            if method == "DELETE":
                gone = self.indices[index].pop(doc_id, None)
                return (200 if gone else 404), {
                    "_id": doc_id,
                    "result": "deleted" if gone else "not_found",
                }
        self.unknown.append(f"{method} /{'/'.join(parts)}")
        return 400, {"error": {"type": "cloud_check_unknown_request"}, "status": 400}

    def _bulk(self, body: bytes, default_index: str | None) -> dict[str, Any]:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        items: list[dict[str, Any]] = []
        position = 0
        while position < len(lines):
            action = lines[position]
            ((kind, meta),) = action.items()
            index = meta.get("_index", default_index)
            docs = self.indices.setdefault(index, {})
            if kind == "index":
                docs[meta["_id"]] = lines[position + 1]
                items.append({"index": {"_id": meta["_id"], "status": 201}})
                position += 2
            elif kind == "delete":
                gone = docs.pop(meta["_id"], None)
                items.append({"delete": {"_id": meta["_id"], "status": 200 if gone else 404}})
                position += 1
            else:
                self.unknown.append(f"_bulk action {kind}")
                items.append({kind: {"status": 400, "error": {"type": "unknown"}}})
                position += 1
        return {"took": 1, "errors": False, "items": items}

    def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        query = body.get("query", {}).get("bool", {})
        filters = {
            field: value
            for clause in query.get("filter", [])
            for field, value in clause.get("term", {}).items()
        }
        matches: list[tuple[str, float, str]] = []
        for clause in query.get("should", []):
            for field, spec in clause.get("match", {}).items():
                if BOOST_RE.match(field):
                    matches.append((field, float(spec.get("boost", 1.0)), str(spec["query"])))
        hits = []
        for source in self.indices[index].values():
            if any(source.get(field) != value for field, value in filters.items()):
                continue
            score = 0.0
            for field, boost, text in matches:
                words = str(source.get(field, "")).split()
                score += boost * sum(words.count(term) for term in text.split())
            if score > 0:
                hits.append({"_score": score, "_source": {"record_id": source["record_id"]}})
        hits.sort(key=lambda h: (-h["_score"], h["_source"]["record_id"]))
        return {
            "timed_out": False,
            "_shards": {"total": 1, "successful": 1, "failed": 0},
            "hits": {"hits": hits[: int(body.get("size", 10))]},
        }


class CloudFormationAnswers:
    """CloudFormation's presigned ``ResponseURL``s: ``PUT /cloudformation-response/<id>``."""

    PREFIX: Final = "/cloudformation-response/"

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, Any]] = {}

    def url(self, base: str) -> tuple[str, str]:
        answer_id = uuid.uuid4().hex
        return answer_id, f"{base}{self.PREFIX}{answer_id}?X-Amz-Signature=cloud-check"

    def record(self, path: str, body: bytes) -> None:
        self.answers[path.split("?", 1)[0].removeprefix(self.PREFIX)] = json.loads(body)


def https_server(
    cert: Path,
    key: Path,
    search: FakeOpenSearch,
    issuer: Issuer,
    cloudformation: CloudFormationAnswers,
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/.well-known/openid-configuration":  # the issuer is this server
                url = f"https://127.0.0.1:{self.server.server_address[1]}"
                status, answer = (
                    200,
                    {
                        "issuer": url,
                        "jwks_uri": url + JWKS_PATH,
                        "authorization_endpoint": url + AUTHORIZE_PATH,
                        "token_endpoint": url + TOKEN_PATH,
                    },
                )
            elif self.path == JWKS_PATH:
                status, answer = 200, issuer.jwks
            elif self.command == "POST" and self.path == TOKEN_PATH:
                from urllib.parse import parse_qsl

                status, answer = issuer.exchange(dict(parse_qsl(body.decode())))
            elif self.command == "PUT" and self.path.startswith(CloudFormationAnswers.PREFIX):
                cloudformation.record(self.path, body)
                status, answer = 200, {}
            else:
                authorization = self.headers.get("authorization") or ""
                status, answer = search.handle(self.command, self.path, body, authorization)
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# --------------------------------------------------------------------------------------------
# The Lambda service: Invoke over HTTP, each function a python3.12 worker on its build folder
# --------------------------------------------------------------------------------------------


class Worker:
    """One built function in its own ``python3.12 -I -S`` process (see lambda_worker.py)."""

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str], timeout_ms: int, log: Path
    ) -> None:
        self.name = name
        self.timeout_ms = timeout_ms
        self.lock = threading.Lock()
        self.log = log
        self._stderr = log.open("ab")
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            bufsize=1,
        )

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            assert self.process.stdin is not None and self.process.stdout is not None
            self.process.stdin.write(json.dumps(payload) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            return {"error": {"errorType": "Runtime.ExitError", "errorMessage": "worker exited"}}
        answer: dict[str, Any] = json.loads(line)
        return answer

    def invoke(self, event: Any) -> dict[str, Any]:
        return self.request(
            {"event": event, "function_name": self.name, "timeout_ms": self.timeout_ms}
        )

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._stderr.close()


class LambdaService:
    """``POST /2015-03-31/functions/<name>/invocations`` → the function's worker."""

    def __init__(self) -> None:
        self.workers: dict[str, Worker] = {}
        self.invocations: list[tuple[str, str]] = []
        self.payloads: list[bytes] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def worker(self, function: str) -> Worker | None:
        name = function.rsplit(":function:", 1)[-1].split(":", 1)[0]
        return self.workers.get(name)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b"{}"
                match = re.fullmatch(r"/2015-03-31/functions/([^/]+)/invocations", self.path)
                worker = service.worker(unquote(match.group(1))) if match else None
                headers: dict[str, str] = {"content-type": "application/json"}
                if worker is None:
                    status = 404
                    data = json.dumps({"Type": "User", "message": "Function not found"}).encode()
                    headers["x-amzn-errortype"] = "ResourceNotFoundException"
                else:
                    event = json.loads(body or b"{}")
                    step = event.get("step") or event.get("tool") or "-"
                    service.invocations.append((worker.name, str(step)))
                    service.payloads.append(body)
                    answer = worker.invoke(event)
                    status = 200
                    if "error" in answer:
                        headers["x-amz-function-error"] = "Unhandled"
                        data = json.dumps(answer["error"]).encode()
                    else:
                        data = json.dumps(answer["result"]).encode()
                    headers["x-amz-executed-version"] = "$LATEST"
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


class Tally:
    """What one phase of the flow cost, counted where it happens (not estimated).

    MCP requests: the adapter events this harness sends. Function invocations: every ``Invoke``
    the Lambda service answers (the adapter's, the state machines') plus the approval page's
    requests. Executions: ``StartExecution`` calls moto's Step Functions answers (hooked in this
    process, where ``ThreadedMotoServer`` runs). Use-case runs: the audit events the functions
    log for the tool (``Engine.handle`` writes one per run; refusals are listed by code).
    Every payload seen (invocations, execution inputs, task outputs) is kept for the scan.
    """

    def __init__(self) -> None:
        self.mcp_requests = 0
        self.page_requests = 0
        self.start_executions: list[str] = []
        self.task_outputs: list[str] = []
        self.payloads: list[bytes] = []
        self.lock = threading.Lock()

    def hook_moto(self) -> None:
        from moto.stepfunctions.responses import StepFunctionResponse

        tally = self
        start, succeed = (
            StepFunctionResponse.start_execution,
            StepFunctionResponse.send_task_success,
        )

        def start_execution(response: Any) -> Any:
            with tally.lock:
                tally.start_executions.append(str(response._get_param("input", if_none="{}")))
            return start(response)

        def send_task_success(response: Any) -> Any:
            with tally.lock:
                tally.task_outputs.append(str(response._get_param("output", if_none="")))
            return succeed(response)

        StepFunctionResponse.start_execution = start_execution  # type: ignore[method-assign]
        StepFunctionResponse.send_task_success = send_task_success  # type: ignore[method-assign]

    def snapshot(self, lambdas: LambdaService, logs: Path) -> dict[str, Any]:
        return {
            "mcp": self.mcp_requests,
            "invocations": len(lambdas.invocations) + self.page_requests,
            "executions": len(self.start_executions),
            "audit": audit_events(logs),
        }


def audit_events(logs: Path) -> dict[str, list[dict[str, Any]]]:
    """Every audit line each function logged so far (Powertools JSON, one per line)."""
    events: dict[str, list[dict[str, Any]]] = {}
    for log in sorted(logs.glob("*.log")):
        events[log.stem] = []
        for line in log.read_text("utf-8", errors="replace").splitlines():
            if '"tool"' not in line or not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("message") == AUDIT_MESSAGE:
                events[log.stem].append({"function": log.stem, **record})
    return events


def tally_between(before: dict[str, Any], after: dict[str, Any], tool: str) -> str:
    """One phase's counts as a line of text."""
    runs = [
        event
        for function, events in after["audit"].items()
        for event in events[len(before["audit"].get(function, [])) :]
        if event.get("tool") == tool
    ]
    codes: dict[str, int] = {}
    for event in runs:
        key = f"{event['function']}:{event.get('code')}"
        codes[key] = codes.get(key, 0) + 1
    return (
        f"{after['mcp'] - before['mcp']} MCP request(s), "
        f"{after['invocations'] - before['invocations']} function invocation(s), "
        f"{after['executions'] - before['executions']} StartExecution call(s), "
        f"{len(runs)} {tool} audit event(s) "
        f"({', '.join(f'{k} x{v}' for k, v in sorted(codes.items()))})"
    )


# --------------------------------------------------------------------------------------------
# The template: functions, resources on moto, intrinsics resolved
# --------------------------------------------------------------------------------------------


class Unresolvable(Exception):
    pass


class Stack:
    """The template's resources on moto and a resolver for the intrinsics that name them."""

    def __init__(self, template: dict[str, Any], parameters: dict[str, Any], session: Any) -> None:
        self.template = template
        self.session = session
        self.refs: dict[str, Any] = {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": f"engram-memory-{TENANT}",
            "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/engram-memory-"
            f"{TENANT}/0a1b2c3d-0000-4000-8000-000000000000",
        }
        for name, spec in template.get("Parameters", {}).items():
            value = parameters.get(name, spec.get("Default"))
            if spec.get("Type") == "CommaDelimitedList":
                value = [v.strip() for v in str(value or "").split(",") if v.strip()]
            if value is not None:
                self.refs[name] = value
        self.conditions: dict[str, bool] = {}
        for name, expression in template.get("Conditions", {}).items():
            self.conditions[name] = bool(self.resolve(expression))

    def resource(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.template["Resources"][name]
        return found

    def of_type(self, kind: str) -> list[str]:
        return [n for n, r in self.template["Resources"].items() if r.get("Type") == kind]

    # -- intrinsics ------------------------------------------------------------------------------

    def resolve(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self.resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        if len(node) != 1:
            return {key: self.resolve(value) for key, value in node.items()}
        ((key, value),) = node.items()
        if key == "Ref":
            return self._ref(value)
        if key == "Fn::GetAtt":
            target = value if isinstance(value, list) else value.split(".", 1)
            return self._ref(f"{target[0]}.{target[1]}")
        if key == "Fn::Sub":
            text, variables = (value[0], value[1]) if isinstance(value, list) else (value, {})
            local = {name: self.resolve(v) for name, v in variables.items()}

            def substitute(match: re.Match[str]) -> str:
                name = match.group(1)
                return str(local[name] if name in local else self._ref(name))

            return re.sub(r"\$\{([^}!][^}]*)\}", substitute, text)
        if key == "Fn::Join":
            separator, items = value[0], self.resolve(value[1])
            return separator.join(str(i) for i in items)
        if key == "Fn::Select":
            return self.resolve(value[1])[int(self.resolve(value[0]))]
        if key == "Fn::Split":
            return str(self.resolve(value[1])).split(value[0])
        if key == "Fn::If":
            return self.resolve(value[1] if self.conditions[value[0]] else value[2])
        if key == "Fn::Equals":
            return self.resolve(value[0]) == self.resolve(value[1])
        if key == "Fn::Not":
            return not self.resolve(value[0])
        if key == "Condition":
            return self.conditions[value]
        return {key: self.resolve(value)}

    def _ref(self, name: str) -> Any:
        if name not in self.refs:
            raise Unresolvable(f"the harness has no value for {name}")
        return self.refs[name]

    # -- resources on moto -------------------------------------------------------------------

    def provision(self, search_endpoint: str) -> None:
        client = self.session.client
        for name in self.of_type("AWS::DynamoDB::Table"):
            props = self.resource(name)["Properties"]
            table = f"engram-{TENANT}-{name}"
            client("dynamodb").create_table(
                TableName=table,
                KeySchema=props["KeySchema"],
                AttributeDefinitions=props["AttributeDefinitions"],
                BillingMode=props.get("BillingMode", "PAY_PER_REQUEST"),
            )
            ttl = props.get("TimeToLiveSpecification")
            if ttl:
                client("dynamodb").update_time_to_live(
                    TableName=table,
                    TimeToLiveSpecification={
                        "Enabled": bool(ttl["Enabled"]),
                        "AttributeName": ttl["AttributeName"],
                    },
                )
            self.refs[name] = table
        for name in self.of_type("AWS::S3::Bucket"):
            bucket = f"engram-{TENANT}-{name.lower()}"
            client("s3").create_bucket(Bucket=bucket)
            self.refs[name] = bucket
            self.refs[f"{name}.Arn"] = f"arn:aws:s3:::{bucket}"
        for name in self.of_type("AWS::KMS::Key"):
            meta = client("kms").create_key(Description=name)["KeyMetadata"]
            self.refs[name], self.refs[f"{name}.Arn"] = meta["KeyId"], meta["Arn"]
        for name in self.of_type("AWS::SecretsManager::Secret"):
            spec = self.resource(name)["Properties"].get("GenerateSecretString", {})
            value = secrets.token_urlsafe(96)[: int(spec.get("PasswordLength", 64))]
            self.refs[name] = client("secretsmanager").create_secret(
                Name=f"engram-{TENANT}-{name}", SecretString=value
            )["ARN"]
        for name in self.of_type("AWS::IAM::Role"):
            self.refs[name] = f"engram-{TENANT}-{name}"
            self.refs[f"{name}.Arn"] = f"arn:aws:iam::{ACCOUNT}:role/engram-{TENANT}-{name}"
        for name in self.of_type("AWS::OpenSearchService::Domain"):
            self.refs[f"{name}.DomainEndpoint"] = search_endpoint.removeprefix("https://")
            self.refs[f"{name}.Arn"] = f"arn:aws:es:{REGION}:{ACCOUNT}:domain/engram-{TENANT}"
        for name in self.of_type("AWS::Serverless::Function"):
            function_name = self.resolve(self.resource(name)["Properties"]["FunctionName"])
            self.refs[name] = function_name
            self.refs[f"{name}.Arn"] = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_name}"
        for name in self.of_type("AWS::Serverless::StateMachine"):
            props = self.resource(name)["Properties"]
            text = (ROOT / props["DefinitionUri"]).read_text("utf-8")
            for variable, value in props.get("DefinitionSubstitutions", {}).items():
                text = text.replace("${" + variable + "}", str(self.resolve(value)))
            self.refs[name] = client("stepfunctions").create_state_machine(
                name=self.resolve(props["Name"]),
                definition=text,
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/{name}Role",
                type=props.get("Type", "STANDARD"),
            )["stateMachineArn"]

    # -- functions ---------------------------------------------------------------------------

    def functions(self) -> dict[str, dict[str, Any]]:
        """Logical id -> its merged properties (Globals.Function, then its own)."""
        defaults = self.template.get("Globals", {}).get("Function", {})
        merged: dict[str, dict[str, Any]] = {}
        for name in self.of_type("AWS::Serverless::Function"):
            props = {**copy.deepcopy(defaults), **self.resource(name)["Properties"]}
            variables = {
                **defaults.get("Environment", {}).get("Variables", {}),
                **self.resource(name)["Properties"].get("Environment", {}).get("Variables", {}),
            }
            props["Environment"] = {"Variables": variables}
            merged[name] = props
        return merged


# --------------------------------------------------------------------------------------------
# The gate
# --------------------------------------------------------------------------------------------


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def capture_arguments(text: str, key: str) -> dict[str, Any]:
    """events/capture.json's arguments with another text (and the digests that go with it)."""
    arguments: dict[str, Any] = json.loads((EVENTS / "capture.json").read_text("utf-8"))[
        "arguments"
    ]
    payload = arguments["payload"]
    payload["components"][0]["text"] = text
    payload["citations"][0]["content_digest"] = _sha(text)
    arguments["evidence"]["evidence_digest"] = _sha("evidence:" + text)
    arguments["idempotency_key"] = key
    return arguments


def search_hits(answer: Any) -> tuple[list[str], str]:
    """The record ids a search answered through the adapter, and a word on the outcome."""
    structured = (answer.get("result") or {}).get("structuredContent") or {}
    if structured.get("ok") is not True:
        code = (structured.get("error") or {}).get("code") or json.dumps(answer)[:200]
        return [], f"error {code}"
    records = structured["output"]["value"].get("records") or []
    ids = [str(packet["record"]["record_id"]) for packet in records]
    return ids, f"ok, {len(ids)} hit(s)"


def samples_of(code_uri: str) -> list[Path]:
    folder = Path(code_uri.rstrip("/")).name
    return sorted({*EVENTS.glob(f"{folder}.json"), *EVENTS.glob(f"{folder}_*.json")})


def _outcome(answer: dict[str, Any]) -> str:
    if "error" in answer:
        error = answer["error"]
        return f"function error {error.get('errorType')}: {str(error.get('errorMessage'))[:160]}"
    result = answer["result"]
    if isinstance(result, dict) and "statusCode" in result:
        return f"HTTP {result['statusCode']}"
    if isinstance(result, dict) and "ok" in result:
        code = (result.get("error") or {}).get("code")
        return "ok envelope" if result["ok"] else f"error envelope {code}"
    if isinstance(result, dict) and "protocol_error" in result:
        return f"protocol error {result['protocol_error'].get('code')}"
    return "answered"


class Harness:
    def __init__(self, args: argparse.Namespace, work: Path, report: Report) -> None:
        self.args = args
        self.work = work
        self.report = report
        self.build = Path(args.build_dir).resolve()
        self.stopping: list[Callable[[], None]] = []
        self.tally = Tally()

    # -- set-up --------------------------------------------------------------------------------

    def start(self) -> None:
        import logging

        import boto3
        from cfnlint.decode.cfn_yaml import load
        from moto.server import ThreadedMotoServer
        from moto.stepfunctions.parser.asl.component.state.exec.state_task import (
            lambda_eval_utils,
        )

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
        self.tally.hook_moto()
        moto_port = free_port()
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=moto_port, verbose=False)
        moto.start()
        self.stopping.append(moto.stop)
        self.moto_url = f"http://127.0.0.1:{moto_port}"
        import urllib.request

        request = urllib.request.Request(  # noqa: S310 - the local moto server
            f"{self.moto_url}/moto-api/config",
            data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()  # noqa: S310

        self.lambdas = LambdaService()
        self.stopping.append(self.lambdas.server.shutdown)
        lambda_url = self.lambdas.url
        original = lambda_eval_utils.boto_client_for

        def routed(region: str, service: str, state_credentials: Any = None) -> Any:
            if service == "lambda":  # the state machines' Lambda tasks → the built workers
                return boto3.session.Session(
                    region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
                ).client("lambda", endpoint_url=lambda_url)
            return original(region, service, state_credentials)

        lambda_eval_utils.boto_client_for = routed

        cert, key = self_signed(self.work)
        self.cert = cert
        self.search = FakeOpenSearch()
        self.issuer = Issuer("")
        self.cloudformation = CloudFormationAnswers()
        https = https_server(cert, key, self.search, self.issuer, self.cloudformation)
        self.stopping.append(https.shutdown)
        self.https_url = f"https://127.0.0.1:{https.server_address[1]}"
        self.issuer.url = self.https_url

        self.session = boto3.session.Session(
            region_name=REGION, aws_access_key_id="cloud-check", aws_secret_access_key="x"
        )
        self.sfn = self.session.client("stepfunctions", endpoint_url=self.moto_url)
        template = load(str(ROOT / "template.yaml"))
        parameters = {
            "TenantId": TENANT,
            "IssuerUrl": self.https_url,
            "Audience": AUDIENCE,
            "ApprovalAudience": APPROVAL_AUDIENCE,
            "OpenSearchMode": "create",
            "KeyAdminRoleArn": f"arn:aws:iam::{ACCOUNT}:role/engram-key-admin",
        }

        class MotoSession:
            def __init__(self, session: Any, url: str) -> None:
                self._session, self._url = session, url

            def client(self, name: str) -> Any:
                return self._session.client(name, endpoint_url=self._url)

        self.stack = Stack(template, parameters, MotoSession(self.session, self.moto_url))
        self.stack.provision(self.https_url)

    def stop(self) -> None:
        for worker in self.lambdas.workers.values() if hasattr(self, "lambdas") else []:
            worker.stop()
        for stop in reversed(self.stopping):
            with contextlib.suppress(Exception):
                stop()

    def start_workers(self) -> bool:
        version = subprocess.run(
            [self.args.python312, "-I", "-S", "-c", "import sys; print(sys.version.split()[0])"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if not self.report.check(
            version.startswith("3.12."), f"the workers run Python {version or '?'} (-I -S)"
        ):
            return False
        layer_dirs = {
            name: self.build / name / "python"
            for name in self.stack.of_type("AWS::Serverless::LayerVersion")
        }
        ok = True
        for name, props in self.stack.functions().items():
            code = self.build / name
            layers = [ref["Ref"] for ref in props.get("Layers", []) if isinstance(ref, dict)]
            try:
                env = {
                    key: str(self.stack.resolve(value))
                    for key, value in props["Environment"]["Variables"].items()
                }
            except Unresolvable as exc:
                ok = self.report.check(False, f"{name}: environment: {exc}")
                continue
            function_name = self.stack.refs[name]
            env.update(
                {
                    "AWS_REGION": REGION,
                    "AWS_DEFAULT_REGION": REGION,
                    "AWS_ACCESS_KEY_ID": "cloud-check",
                    "AWS_SECRET_ACCESS_KEY": "cloud-check",
                    "AWS_ENDPOINT_URL": self.moto_url,
                    "AWS_ENDPOINT_URL_LAMBDA": self.lambdas.url,
                    "AWS_CONFIG_FILE": "/dev/null",
                    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
                    "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_LAMBDA_FUNCTION_NAME": function_name,
                    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(props.get("MemorySize", 128)),
                    "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
                    "LAMBDA_TASK_ROOT": str(code),
                    # no X-Ray daemon here; Lambda runs one next to each function
                    "POWERTOOLS_TRACE_DISABLED": "true",
                    "SSL_CERT_FILE": str(self.cert),
                    "REQUESTS_CA_BUNDLE": str(self.cert),
                    "PATH": "/usr/bin:/bin",
                    "LANG": "C.UTF-8",
                    "TZ": "UTC",
                }
            )
            layer = layer_dirs.get(layers[0]) if layers else None
            argv = [
                self.args.python312,
                "-I",
                "-S",
                str(WORKER),
                str(code),
                str(layer or self.work / "no-layer"),
                str(Path(self.args.runtime_dir).resolve()),
                str(props.get("Handler", "app.handler")),
            ]
            timeout_ms = int(props.get("Timeout", 3)) * 1000
            self.lambdas.workers[function_name] = Worker(
                function_name, argv, env, timeout_ms, self.work / f"{name}.log"
            )
        return ok

    # -- smoke -----------------------------------------------------------------------------------

    def adapter_event(self, sample: Path) -> dict[str, Any]:
        event: dict[str, Any] = json.loads(sample.read_text("utf-8"))
        headers = event.get("headers") or {}
        if headers.get("authorization") == "Bearer REPLACED_BY_TEST":
            headers["authorization"] = f"Bearer {self.issuer.token()}"
        return event

    def smoke(self) -> None:
        for name, props in self.stack.functions().items():
            function_name = self.stack.refs[name]
            worker = self.lambdas.workers.get(function_name)
            if worker is None:
                continue
            samples = samples_of(props["CodeUri"])
            if not self.report.check(
                bool(samples),
                f"{name}: has a sample event (events/{Path(props['CodeUri']).name}[_*].json)",
            ):
                continue
            served = self.custom_resources_of(name)
            for sample in samples:
                event = self.adapter_event(sample)
                answer_id = None
                if served and "ResponseURL" in event:
                    answer_id = self.as_custom_resource_event(served[0], event)
                answer = worker.invoke(event)
                error_type = answer.get("error", {}).get("errorType")
                self.report.check(
                    error_type not in BROKEN_BUILD_ERRORS,
                    f"{name} from the build: events/{sample.name} -> {_outcome(answer)}",
                )
                if answer_id is not None:
                    got = self.cloudformation.answers.get(answer_id, {})
                    self.report.check(
                        got.get("Status") == "SUCCESS"
                        and got.get("RequestId") == event["RequestId"],
                        f"{name}: events/{sample.name} answered CloudFormation's ResponseURL: "
                        f"{got.get('Status') or 'nothing'}"
                        + (f" ({got.get('Reason')})" if got.get("Status") == "FAILED" else ""),
                    )
            for resource in served:
                if self.stack.resource(resource)["Type"] == "Custom::OpenSearchSecurityConfig":
                    self.check_security_config(resource)
            modules = worker.request({"modules": True}).get("result", {})
            counts = {origin: 0 for origin in ("function", "layer", "runtime")}
            foreign: list[str] = []
            for module, origin in sorted(modules.items()):
                if origin in counts:
                    counts[origin] += 1
                else:
                    foreign.append(f"{module} ({origin})")
            self.report.check(
                bool(modules) and not foreign,
                f"{name}: its {len(modules)} non-stdlib modules all come from the build "
                f"({counts['function']} from its folder, {counts['layer']} from the layer, "
                f"{counts['runtime']} from the runtime directory)"
                + (f"; from elsewhere: {', '.join(foreign[:5])}" if foreign else ""),
            )

    # -- custom resources --------------------------------------------------------------------

    def custom_resources_of(self, function: str) -> list[str]:
        """The ``Custom::*`` resources of the template whose ServiceToken is ``function``."""
        served = []
        for name, resource in self.stack.template["Resources"].items():
            if not str(resource.get("Type", "")).startswith("Custom::"):
                continue
            token = resource.get("Properties", {}).get("ServiceToken", {})
            target = token.get("Fn::GetAtt") if isinstance(token, dict) else None
            if isinstance(target, str):
                target = target.split(".")
            if target and target[0] == function:
                served.append(name)
        return served

    def as_custom_resource_event(self, resource: str, event: dict[str, Any]) -> str:
        """The sample as CloudFormation would send it for ``resource``: the template's properties
        resolved against this stack, and a ResponseURL served here. Returns the answer's id."""
        properties = self.stack.resolve(self.stack.resource(resource)["Properties"])
        event["ResourceProperties"] = properties
        if "OldResourceProperties" in event:
            event["OldResourceProperties"] = properties
        event["LogicalResourceId"] = resource
        event["ResourceType"] = self.stack.resource(resource)["Type"]
        answer_id, event["ResponseURL"] = self.cloudformation.url(self.https_url)
        return answer_id

    def check_security_config(self, resource: str) -> None:
        properties = self.stack.resolve(self.stack.resource(resource)["Properties"])
        api = "/_plugins/_security/api"
        applied = self.search.security
        reader = applied.get(f"{api}/rolesmapping/engram_reader", {}).get("backend_roles")
        writer = applied.get(f"{api}/rolesmapping/engram_writer", {}).get("backend_roles")
        audit = applied.get(f"{api}/audit/config", {})
        self.report.check(
            not self.search.security_unsigned
            and {f"{api}/roles/engram_reader", f"{api}/roles/engram_writer"} <= set(applied)
            and reader == properties["ReaderRoleArns"]
            and writer == properties["WriterRoleArns"]
            and audit.get("enabled") is True
            and audit.get("audit", {}).get("log_request_body") is False,
            f"{resource}: the domain got both roles, {len(reader or [])} reader and "
            f"{len(writer or [])} writer role(s) mapped, the audit config (no request bodies), "
            f"every request SigV4-signed for es"
            + (
                f"; unsigned: {self.search.security_unsigned}"
                if self.search.security_unsigned
                else ""
            ),
        )

    # -- the end-to-end flow -------------------------------------------------------------------

    def mcp(
        self,
        body: dict[str, Any],
        *,
        protocol: str,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        event = json.loads((EVENTS / "mcp_adapter_tools_call.json").read_text("utf-8"))
        event["headers"]["authorization"] = f"Bearer {self.issuer.token()}"
        event["headers"]["mcp-protocol-version"] = protocol
        event["headers"].update(headers or {})
        # through the API's default endpoint: the adapter must accept its execute-api Host
        api_host = f"{event['requestContext']['apiId']}.execute-api.{REGION}.amazonaws.com"
        event["headers"]["host"] = api_host
        event["requestContext"]["domainName"] = api_host
        event["requestContext"]["requestId"] = uuid.uuid4().hex
        event["body"] = json.dumps(body)
        self.tally.mcp_requests += 1
        adapter = self.lambdas.worker(self.stack.refs["McpAdapterFunction"])
        assert adapter is not None
        answer = adapter.invoke(event)
        if "error" in answer:
            return 599, answer["error"]
        result = answer["result"]
        text = result.get("body") or "null"
        if result.get("isBase64Encoded"):
            text = base64.b64decode(text).decode()
        return int(result["statusCode"]), json.loads(text)

    def call(self, tool: str, arguments: dict[str, Any], **params: Any) -> Any:
        body = {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {"name": f"engram_memory_{tool}", "arguments": arguments, **params},
        }
        return self.mcp(body, protocol="2025-11-25")

    def modern_call(self, tool: str, arguments: dict[str, Any], **extra: Any) -> tuple[int, Any]:
        body = {
            "jsonrpc": "2.0",
            "id": 9,
            "method": "tools/call",
            "params": {
                "name": f"engram_memory_{tool}",
                "arguments": arguments,
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
                },
                **extra,
            },
        }
        return self.mcp(
            body,
            protocol="2026-07-28",
            headers={"mcp-method": "tools/call", "mcp-name": f"engram_memory_{tool}"},
        )

    def wait_quiet(self, timeout_s: float = 60.0) -> None:
        """Until no execution of either state machine is running (their tails have run)."""
        until = time.monotonic() + timeout_s
        machines = [self.stack.refs[m] for m in ("WithdrawStateMachine", "ForgetStateMachine")]
        while time.monotonic() < until:
            running = [
                e
                for arn in machines
                for e in self.sfn.list_executions(stateMachineArn=arn)["executions"]
                if e["status"] == "RUNNING"
            ]
            if not running:
                return
            time.sleep(0.2)

    def form_mode_forget(self, search_args: dict[str, Any]) -> None:
        """forget, form mode (2026-07-28): asked, approved in the client, committed."""
        check = self.report.check
        text = "The staging database is rebuilt from snapshots every Sunday night."
        _, captured = self.call("capture", capture_arguments(text, "cloud-check-capture-03"))
        candidate_id = captured["result"]["structuredContent"]["output"]["value"]["candidate_id"]
        _, admitted = self.call(
            "request_admission",
            {"candidate_id": candidate_id, "idempotency_key": "cloud-check-admit-00003"},
        )
        outcome = admitted["result"]["structuredContent"]["output"]["value"]["outcome"]
        record_id = str(outcome.get("record_id"))
        forget = {
            "record_id": record_id,
            "idempotency_key": "cloud-check-forget-0002",
            "reason_ref": "reason:obsolete",
        }
        start = self.tally.snapshot(self.lambdas, self.work)
        _, asked = self.modern_call("forget", forget)
        asked = asked.get("result", {})
        if not check(
            "requestState" in asked and "engram_confirmation" in asked.get("inputRequests", {}),
            "flow: forget (2026-07-28) asks for a form confirmation",
        ):
            print(f"       {json.dumps(asked)[:400]}")
            return
        approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
        _, done = self.modern_call(
            "forget", forget, inputResponses=approve, requestState=asked["requestState"]
        )
        structured = done.get("result", {}).get("structuredContent", {})
        value = (structured.get("output") or {}).get("value", {})
        check(
            structured.get("ok") is True
            and value.get("receipt", {}).get("to_state") == "tombstoned",
            f"flow: forget confirmed in form mode -> "
            f"{value.get('receipt', {}).get('to_state') or json.dumps(done)[:300]}",
        )
        self.wait_quiet()
        form_mode = tally_between(start, self.tally.snapshot(self.lambdas, self.work), "forget")
        print(f"  tally: forget, form mode (2026-07-28): {form_mode}")
        print(f"  tally: forget, form mode: replayed = {value.get('replayed')}")

    def page(self, event: dict[str, Any]) -> dict[str, Any]:
        """One request to the built approval function; its Lambda answer."""
        approval = self.lambdas.worker(self.stack.refs["ApprovalFunction"])
        assert approval is not None
        self.tally.page_requests += 1
        answer: dict[str, Any] = approval.invoke(event)
        self.lambdas.payloads.append(json.dumps(event).encode())
        self.lambdas.payloads.append(json.dumps(answer).encode())
        return answer

    def approve_on_the_page(self, approval_id: str) -> dict[str, Any]:
        """What a browser does, as API Gateway events: open the link (302 to the issuer), sign
        in there as the principal, come back to the callback (session cookie), read the page's
        CSRF token, press Approve. Each step is checked; the POST's answer is returned."""
        from urllib.parse import urlencode

        check = self.report.check
        opened = json.loads((EVENTS / "approval_get.json").read_text("utf-8"))
        opened["pathParameters"]["approvalId"] = approval_id
        opened["rawPath"] = opened["requestContext"]["http"]["path"] = f"/approvals/{approval_id}"
        redirect = self.page(opened).get("result", {})
        location = str((redirect.get("headers") or {}).get("Location", ""))
        signin = [c.split(";")[0] for c in redirect.get("cookies") or []]
        if not check(
            redirect.get("statusCode") == 302
            and location.startswith(self.issuer.url + AUTHORIZE_PATH + "?")
            and "code_challenge_method=S256" in location
            and len(signin) == 1,
            f"flow: the approval link sends a signed-out person to the issuer "
            f"({redirect.get('statusCode')}, PKCE S256)",
        ):
            return {}
        code, state = self.issuer.sign_in(location, PRINCIPAL)
        callback = json.loads((EVENTS / "approval_callback.json").read_text("utf-8"))
        callback["rawQueryString"] = urlencode({"code": code, "state": state})
        callback["cookies"] = signin
        back = self.page(callback).get("result", {})
        session = [c for c in back.get("cookies") or [] if c.startswith("engram_approver=")]
        if not check(
            back.get("statusCode") == 200
            and len(session) == 1
            and all(a in session[0] for a in ("HttpOnly", "Secure", "SameSite=Strict")),
            "flow: the sign-in callback verifies the ID token and sets the session cookie "
            f"({back.get('statusCode')}, HttpOnly; Secure; SameSite=Strict)",
        ):
            return {}
        cookie = session[0].split(";")[0]
        opened["cookies"] = [cookie]
        shown = self.page(opened).get("result", {})
        body = str(shown.get("body", ""))
        found = re.search(r'name="csrf_token" value="([0-9a-f]+)"', body)
        if not check(
            shown.get("statusCode") == 200 and found is not None and 'id="memory"' in body,
            f"flow: the signed-in principal sees the page with the memory ({shown.get('statusCode')})",
        ):
            return {}
        assert found is not None
        posted = json.loads((EVENTS / "approval_post.json").read_text("utf-8"))
        posted["pathParameters"]["approvalId"] = approval_id
        posted["rawPath"] = posted["requestContext"]["http"]["path"] = f"/approvals/{approval_id}"
        posted["cookies"] = [cookie]
        posted["headers"]["origin"] = AUDIENCE.rsplit("/", 1)[0]
        no_csrf = {**posted, "body": "decision=approve"}
        refused = self.page(no_csrf).get("result", {})
        check(
            refused.get("statusCode") == 403,
            f"flow: a POST without the page's CSRF token is refused ({refused.get('statusCode')})",
        )
        posted["body"] = urlencode({"csrf_token": found.group(1), "decision": "approve"})
        return self.page(posted)

    def scan_for_tokens(self) -> None:
        """No bearer token in any payload the run produced: invocations, execution inputs, task
        outputs, the functions' logs."""
        minted = self.issuer.minted
        secrets_seen = [*minted] + [t.rsplit(".", 1)[-1] for t in minted]
        places: dict[str, list[bytes]] = {
            "function invocation payloads": list(self.lambdas.payloads),
            "execution inputs": [i.encode() for i in self.tally.start_executions],
            "task outputs": [o.encode() for o in self.tally.task_outputs],
            "function logs": [p.read_bytes() for p in sorted(self.work.glob("*.log"))],
        }
        for place, blobs in places.items():
            hits = sum(1 for blob in blobs for t in secrets_seen if t.encode() in blob)
            self.report.check(
                hits == 0,
                f"payload scan: {len(minted)} bearer token(s) in {len(blobs)} {place}: {hits} hit(s)",
            )

    def wait_execution(self, machine: str, timeout_s: float = 60.0) -> dict[str, Any]:
        arn = self.stack.refs[machine]
        until = time.monotonic() + timeout_s
        while True:
            executions = self.sfn.list_executions(stateMachineArn=arn)["executions"]
            if executions:
                described: dict[str, Any] = self.sfn.describe_execution(
                    executionArn=executions[0]["executionArn"]
                )
                if described["status"] != "RUNNING" or time.monotonic() > until:
                    return described
            elif time.monotonic() > until:
                return {"status": "NOT_STARTED"}
            time.sleep(0.2)

    def flow(self) -> None:
        check = self.report.check

        def value(answer: Any) -> Any:
            return answer["result"]["structuredContent"]["output"]["value"]

        status, init = self.mcp(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "cloud-check", "version": "1"},
                },
            },
            protocol="2025-11-25",
        )
        check(
            status == 200 and init.get("result", {}).get("protocolVersion") == "2025-11-25",
            f"flow: initialize over the execute-api host -> HTTP {status}",
        )
        status, listed = self.mcp(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}},
            protocol="2025-11-25",
        )
        names = sorted(t["name"] for t in listed.get("result", {}).get("tools", []))
        check(
            names == sorted(f"engram_memory_{t}" for t in TOOLS),
            f"flow: tools/list -> {len(names)} tools",
        )
        text = "The release train leaves every Tuesday at 14:00 UTC from the main branch."
        capture_args = capture_arguments(text, "cloud-check-capture-0001")
        status, captured = self.call("capture", capture_args)
        try:
            candidate_id = value(captured)["candidate_id"]
        except (KeyError, TypeError):
            check(False, f"flow: capture -> {json.dumps(captured)[:300]}")
            return
        check(True, f"flow: capture -> {candidate_id[:20]}…")
        admission_args = json.loads((EVENTS / "request_admission.json").read_text("utf-8"))[
            "arguments"
        ]
        status, admitted = self.call(
            "request_admission",
            {
                **admission_args,
                "candidate_id": candidate_id,
                "idempotency_key": "cloud-check-admit-00001",
            },
        )
        try:
            outcome = value(admitted)["outcome"]
            record_id = outcome["record_id"]
        except (KeyError, TypeError):
            check(False, f"flow: request_admission -> {json.dumps(admitted)[:300]}")
            return
        check(outcome["status"] == "accepted", f"flow: request_admission -> {outcome['status']}")
        search_args = json.loads((EVENTS / "search.json").read_text("utf-8"))["arguments"]
        search_args = {**search_args, "query": "release train Tuesday"}
        status, found = self.call("search", search_args)
        hits, outcome = search_hits(found)
        check(record_id in hits, f"flow: search finds the record ({outcome})")
        # A date in the query: time-aware ranking parses it with dateparser, which the layer
        # must carry (the engine imports it on the first such query, not at start).
        dated_args = {**search_args, "query": "release train on 27 May 2026"}
        status, dated = self.call("search", dated_args)
        hits, outcome = search_hits(dated)
        version = (
            (((dated.get("result") or {}).get("structuredContent") or {}).get("output") or {})
            .get("value", {})
            .get("rank_receipt", {})
            .get("profile_version")
        )
        check(
            record_id in hits and version == "2.1.0",
            f"flow: a search naming a date ranks with time-aware profile {version} ({outcome})",
        )
        get_args = {"record_id": record_id, "purpose_ref": "purpose:general"}
        status, got = self.call("get", get_args)
        check(
            got.get("result", {}).get("structuredContent", {}).get("ok") is True,
            "flow: get reads the record",
        )

        # withdraw, form mode (2026-07-28): the adapter asks, the human answers in the client
        status, pending = self.call(
            "capture",
            capture_arguments("Draft: rotate the signing keys.", "cloud-check-capture-02"),
        )
        pending_id = value(pending)["candidate_id"]
        withdraw = {
            "candidate_id": pending_id,
            "idempotency_key": "cloud-check-withdraw-01",
            "reason_ref": "reason:captured-by-mistake",
        }
        status, asked = self.modern_call("withdraw", withdraw)
        asked = asked.get("result", {})
        if not check(
            "requestState" in asked and "engram_confirmation" in asked.get("inputRequests", {}),
            "flow: withdraw (2026-07-28) asks for a form confirmation",
        ):
            print(f"       {json.dumps(asked)[:400]}")
            return
        approve = {"engram_confirmation": {"action": "accept", "content": {"decision": "approve"}}}
        status, done = self.modern_call(
            "withdraw", withdraw, inputResponses=approve, requestState=asked["requestState"]
        )
        structured = done.get("result", {}).get("structuredContent", {})
        receipt = (structured.get("output") or {}).get("value", {}).get("receipt", {})
        check(
            structured.get("ok") is True and receipt.get("to_state") == "withdrawn",
            f"flow: withdraw confirmed -> {receipt.get('to_state') or json.dumps(done)[:300]}",
        )
        execution = self.wait_execution("WithdrawStateMachine")
        check(
            execution["status"] == "SUCCEEDED",
            f"flow: the withdraw state machine ran on moto -> {execution['status']}",
        )

        # forget, URL mode (2025-11-25): -32042 with the approval page's URL
        url_mode_start = self.tally.snapshot(self.lambdas, self.work)
        forget = {
            "record_id": record_id,
            "idempotency_key": "cloud-check-forget-0001",
            "reason_ref": "reason:obsolete",
        }
        status, asked = self.call("forget", forget)
        error = asked.get("error", {})
        elicitations = (error.get("data") or {}).get("elicitations") or []
        url = elicitations[0].get("url", "") if elicitations else ""
        if not check(
            error.get("code") == -32042 and "/approvals/" in url,
            f"flow: forget (2025-11-25) answers -32042 with the approval URL ({url[:60]})",
        ):
            print(f"       {json.dumps(asked)[:400]}")
            return
        approval_id = url.rsplit("/", 1)[1]
        answered = self.approve_on_the_page(approval_id)
        check(
            answered.get("result", {}).get("statusCode") == 200
            and 'data-decision="approve"' in str(answered.get("result", {}).get("body")),
            f"flow: the built approval page takes the signed-in person's answer -> "
            f"{_outcome(answered)}",
        )
        execution = self.wait_execution("ForgetStateMachine")
        check(
            execution["status"] == "SUCCEEDED",
            f"flow: the forget state machine ran on moto -> {execution['status']}",
        )
        status, retried = self.call("forget", forget)
        structured = retried.get("result", {}).get("structuredContent", {})
        receipt = (structured.get("output") or {}).get("value", {}).get("receipt", {})
        check(
            receipt.get("to_state") == "tombstoned",
            f"flow: forget retried -> {receipt.get('to_state') or json.dumps(retried)[:300]}",
        )
        self.wait_quiet()
        url_mode = tally_between(
            url_mode_start, self.tally.snapshot(self.lambdas, self.work), "forget"
        )
        print(f"  tally: forget, URL mode (2025-11-25): {url_mode}")
        print(f"  tally: forget, URL mode: replayed = {value(retried).get('replayed')}")
        status, got = self.call("get", get_args)
        code = got.get("result", {}).get("structuredContent", {}).get("error", {}).get("code")
        check(code == "NOT_FOUND", f"flow: get after forget -> {code}")
        status, found = self.call("search", search_args)
        hits, outcome = search_hits(found)
        check(
            outcome.startswith("ok") and record_id not in hits,
            f"flow: search no longer finds the record ({outcome})",
        )
        self.form_mode_forget(search_args)
        self.scan_for_tokens()
        steps = [step for _, step in self.lambdas.invocations]
        check(
            {"await_approval", "commit_transition", "finish_tail"} <= set(steps),
            "flow: the state machines invoked the built workflow function "
            f"({sum(1 for f, _ in self.lambdas.invocations if f.endswith('-workflow'))} step(s))",
        )
        check(
            not self.search.unknown,
            f"flow: every OpenSearch request had a known shape ({len(self.search.requests)} "
            f"request(s)){'; unknown: ' + ', '.join(self.search.unknown[:3]) if self.search.unknown else ''}",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--python312", required=True)
    parser.add_argument("--runtime-dir", required=True)
    parser.add_argument("--logs", default=None, help="keep the workers' stderr here")
    args = parser.parse_args(argv)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="cloud-run-") as scratch:
        work = Path(args.logs).resolve() if args.logs else Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        harness = Harness(args, work, report)
        try:
            harness.start()
            if harness.start_workers():
                harness.smoke()
                harness.flow()
        except Exception as exc:  # the harness itself broke: one FAIL with the cause
            report.check(False, f"harness: {type(exc).__name__}: {exc}")
            import traceback

            traceback.print_exc()
        finally:
            harness.stop()
        if report.failed:
            print(f"  (workers' stderr: {work})" if args.logs else "  (rerun with --logs DIR)")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""One HTTPS server for what the functions reach outside AWS's APIs: the issuer's discovery
document, JWKS and token endpoint, CloudFormation's presigned ``ResponseURL``s, and the fake
OpenSearch domain (every other path)."""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final, cast

from .identity import AUTHORIZE_PATH, JWKS_PATH, TOKEN_PATH, Issuer
from .opensearch import FakeOpenSearch


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


def discovery(url: str) -> dict[str, str]:
    """The issuer's OpenID configuration (the issuer is the server at ``url``)."""
    return {
        "issuer": url,
        "jwks_uri": url + JWKS_PATH,
        "authorization_endpoint": url + AUTHORIZE_PATH,
        "token_endpoint": url + TOKEN_PATH,
    }


def send_json(handler: BaseHTTPRequestHandler, status: int, data: bytes, **headers: str) -> None:
    """One JSON answer with its length (no body for HEAD)."""
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(data)


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

        def _answer(self, body: bytes) -> tuple[int, Any]:
            if self.path == "/.well-known/openid-configuration":
                port = cast(ThreadingHTTPServer, self.server).server_port
                return 200, discovery(f"https://127.0.0.1:{port}")
            if self.path == JWKS_PATH:
                return 200, issuer.jwks
            if self.command == "POST" and self.path == TOKEN_PATH:
                from urllib.parse import parse_qsl

                return issuer.exchange(dict(parse_qsl(body.decode())))
            if self.command == "PUT" and self.path.startswith(CloudFormationAnswers.PREFIX):
                cloudformation.record(self.path, body)
                return 200, {}
            authorization = self.headers.get("authorization") or ""
            return search.handle(self.command, self.path, body, authorization)

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            status, answer = self._answer(body)
            send_json(self, status, json.dumps(answer).encode())

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

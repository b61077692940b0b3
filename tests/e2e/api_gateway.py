"""A local stand-in for the HTTP API: real HTTPS requests in, API Gateway HTTP API (payload 2.0)
events out to the real Lambda handlers, their answers back as HTTP responses.

What it does as API Gateway does: the ``Cookie`` header becomes ``event["cookies"]`` and the
answer's ``cookies`` become ``Set-Cookie`` headers; ``{approvalId}`` is a path parameter; a
request's ``Host`` is the API's custom domain (``domain``), whatever loopback port it came to.
What it does not: authorizers (the routes it serves are the public ones and ``/mcp``, whose
adapter verifies its bearer token itself), throttling, payload limits.
"""

from __future__ import annotations

import base64
import contextlib
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aws_testing import FakeLambdaContext

from engram_testing import QuietHandler

Handler = Callable[[Mapping[str, Any], Any], Mapping[str, Any]]
CALLBACK = "/approvals/callback"


def route_of(method: str, path: str) -> tuple[str, dict[str, str] | None]:
    """The HTTP API route key and path parameters of a request (the template's routes)."""
    if path == CALLBACK:
        return f"{method} {CALLBACK}", None
    if path.startswith("/approvals/") and path.count("/") == 2:
        return f"{method} /approvals/{{approvalId}}", {"approvalId": path.rsplit("/", 1)[1]}
    return f"{method} {path}", None


def event_of(
    method: str, target: str, headers: Mapping[str, str], body: bytes, domain: str
) -> dict[str, Any]:
    parts = urlsplit(target)
    route, parameters = route_of(method, parts.path)
    lowered = {k.lower(): v for k, v in headers.items()}
    cookies = [c.strip() for c in lowered.pop("cookie", "").split(";") if c.strip()]
    lowered["host"] = domain
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route,
        "rawPath": parts.path,
        "rawQueryString": parts.query,
        "headers": lowered,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "local",
            "domainName": domain,
            "http": {"method": method, "path": parts.path, "sourceIp": "127.0.0.1"},
            "routeKey": route,
            "stage": "$default",
        },
        "isBase64Encoded": False,
        "body": body.decode("utf-8", "replace"),
    }
    if cookies:
        event["cookies"] = cookies
    if parameters is not None:
        event["pathParameters"] = parameters
    return event


@contextlib.contextmanager
def serve_api(
    routes: Callable[[str], Handler | None], *, cert: Path, key: Path, domain: str
) -> Iterator[str]:
    """Serve ``routes`` (path → handler, or None for 404) over HTTPS on a free 127.0.0.1 port;
    yields the base URL."""

    class Bridge(QuietHandler):
        def _serve(self) -> None:
            body = self.body()
            handler = routes(urlsplit(self.path).path)
            if handler is None:
                answer: Mapping[str, Any] = {"statusCode": 404, "body": ""}
            else:
                event = event_of(self.command, self.path, dict(self.headers), body, domain)
                answer = handler(
                    event, FakeLambdaContext.of("engram-dev-local", remaining_ms=29_000)
                )
            raw = str(answer.get("body") or "")
            data = base64.b64decode(raw) if answer.get("isBase64Encoded") else raw.encode()
            self.send_response(int(answer.get("statusCode", 200)))
            for name, value in (answer.get("headers") or {}).items():
                if name.lower() != "content-length":
                    self.send_header(name, str(value))
            for cookie in answer.get("cookies") or []:
                self.send_header("Set-Cookie", cookie)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

    server = ThreadingHTTPServer(("127.0.0.1", 0), Bridge)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)

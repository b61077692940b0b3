"""A local stand-in for the HTTP API: real HTTPS requests in, API Gateway HTTP API (payload 2.0)
events out to Lambda handlers, their answers back as HTTP responses.

Two users: the cloud gate (``Harness._start_api``: the template's ``HttpApi`` routes, each to its
built function's worker) and the test suite (``tests/e2e/test_cloud_approval_browser.py``: the
adapter and the approval page's handlers in process).

What it does as API Gateway does: a request is matched to a route (``METHOD /path``, a
``{name}`` segment matching one path segment, an exact path before a templated one) and becomes
the route's event: ``routeKey``, ``pathParameters``, the ``Cookie`` header as
``event["cookies"]``, ``requestContext`` with the API's id and the domain the request reached;
the answer's ``cookies`` become ``Set-Cookie`` headers, a base64 body is decoded; no route is 404
``{"message":"Not Found"}``, a function error 500 ``{"message":"Internal Server Error"}``. The
domain is the request's ``Host`` when it names one of the API's domains (``domain`` and
``aliases``: its execute-api host, a custom domain), else ``domain`` (a client that reached the
loopback address and port, as DNS would have sent it to the API).
What it does not: authorizers (the JWT authorizer checks signatures only; the adapter verifies
its bearer token itself), throttling, payload limits, the 29 s integration timeout.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

# A Lambda function as the API invokes it: the event in, the function's answer out (None: the
# function failed, which API Gateway answers 500).
Handler = Callable[[dict[str, Any]], Mapping[str, Any] | None]


class Route(NamedTuple):
    """One route of the API: ``GET /approvals/{approvalId}`` and the function behind it."""

    method: str
    path: str
    handler: Handler


def match(routes: Sequence[Route], method: str, path: str) -> tuple[Route, dict[str, str]] | None:
    """The route a request takes and its path parameters (an exact path wins over a template)."""
    segments = path.split("/")
    templated: list[tuple[Route, dict[str, str]]] = []
    for route in routes:
        if route.method != method:
            continue
        if route.path == path:
            return route, {}
        pattern = route.path.split("/")
        if len(pattern) != len(segments):
            continue
        parameters: dict[str, str] = {}
        for want, got in zip(pattern, segments, strict=True):
            if want.startswith("{") and want.endswith("}") and got:
                parameters[want[1:-1]] = got
            elif want != got:
                break
        else:
            templated.append((route, parameters))
    return templated[0] if templated else None


def event_of(
    route: Route,
    parameters: dict[str, str],
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    domain: str,
    api_id: str,
) -> dict[str, Any]:
    """The HTTP API's payload 2.0 event of one request."""
    parts = urlsplit(target)
    route_key = f"{route.method} {route.path}"
    lowered = {k.lower(): v for k, v in headers.items()}
    cookies = [c.strip() for c in lowered.pop("cookie", "").split(";") if c.strip()]
    lowered["host"] = domain
    now_ms = int(time.time() * 1000)
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": parts.path,
        "rawQueryString": parts.query,
        "headers": lowered,
        "requestContext": {
            "accountId": "123456789012",
            "apiId": api_id,
            "domainName": domain,
            "domainPrefix": domain.split(".", 1)[0],
            "http": {
                "method": route.method,
                "path": parts.path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": lowered.get("user-agent", ""),
            },
            "requestId": uuid.uuid4().hex,
            "routeKey": route_key,
            "stage": "$default",
            "timeEpoch": now_ms,
        },
        "isBase64Encoded": False,
        "body": body.decode("utf-8", "replace"),
    }
    if cookies:
        event["cookies"] = cookies
    if parameters:
        event["pathParameters"] = parameters
    return event


_NOT_FOUND = {"statusCode": 404, "body": json.dumps({"message": "Not Found"})}
_FAILED = {"statusCode": 500, "body": json.dumps({"message": "Internal Server Error"})}


def answer(
    routes: Sequence[Route],
    method: str,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    domains: Sequence[str],
    api_id: str,
) -> Mapping[str, Any]:
    """The API's answer to one request (``domains[0]``: the default domain)."""
    found = match(routes, method, urlsplit(target).path)
    if found is None:
        return _NOT_FOUND
    route, parameters = found
    host = next((v for k, v in headers.items() if k.lower() == "host"), "").split(":", 1)[0]
    domain = host if host in domains else domains[0]
    event = event_of(route, parameters, target, headers, body, domain=domain, api_id=api_id)
    return route.handler(event) or _FAILED


@contextlib.contextmanager
def serve_api(
    routes: Sequence[Route],
    *,
    cert: Path,
    key: Path,
    domain: str,
    aliases: Sequence[str] = (),
    api_id: str = "local",
) -> Iterator[str]:
    """Serve ``routes`` over HTTPS on a free 127.0.0.1 port; yields the base URL."""
    domains = [domain, *aliases]

    class Bridge(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            return

        def _serve(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = dict(self.headers)
            answered = answer(
                routes, self.command, self.path, headers, body, domains=domains, api_id=api_id
            )
            raw = str(answered.get("body") or "")
            data = base64.b64decode(raw) if answered.get("isBase64Encoded") else raw.encode()
            self.send_response(int(answered.get("statusCode", 200)))
            for name, value in (answered.get("headers") or {}).items():
                if name.lower() != "content-length":
                    self.send_header(name, str(value))
            for cookie in answered.get("cookies") or []:
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

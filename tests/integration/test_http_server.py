"""The embedded host's uvicorn: a slow client is disconnected, a gone client is one quiet line.

uvicorn has no deadline on reading a request: without one, a client that trickles its headers
or its body holds a connection (and a task) for ever. The read deadline here is short so the
test is quick; the product's is ``REQUEST_READ_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import uvicorn

from engram_memory.embedded.http_server import uvicorn_config

DEADLINE_S = 30.0


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/gone":
        raise anyio.ClosedResourceError  # what the SDK raises when the client went away
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok:" + body})


@contextlib.contextmanager
def serving(read_timeout_s: float) -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(echo_app, read_timeout_s=read_timeout_s))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=DEADLINE_S)
        sock.close()


def closed_by_server(client: socket.socket, trickle: bytes = b"") -> bool:
    """Send ``trickle`` one byte at a time (0.2 s apart) until the server closes the socket."""
    client.settimeout(0.2)
    deadline = time.monotonic() + DEADLINE_S
    sent = 0
    while time.monotonic() < deadline:
        if sent < len(trickle):
            try:
                client.sendall(trickle[sent : sent + 1])
            except OSError:
                return True
            sent += 1
        try:
            if client.recv(1024) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def test_a_complete_request_is_served() -> None:
    with (
        serving(read_timeout_s=1.0) as port,
        socket.create_connection(("127.0.0.1", port)) as client,
    ):
        client.sendall(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi")
        client.settimeout(DEADLINE_S)
        answer = b""
        while b"ok:hi" not in answer:
            chunk = client.recv(4096)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize(
    "trickle",
    [
        b"",  # connects and says nothing
        b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: " + b"a" * 200,  # headers that never end
        b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 500\r\n\r\n" + b"b" * 200,  # a slow body
    ],
    ids=["silent", "slow-headers", "slow-body"],
)
def test_a_client_that_does_not_send_its_request_in_time_is_disconnected(trickle: bytes) -> None:
    with (
        serving(read_timeout_s=1.0) as port,
        socket.create_connection(("127.0.0.1", port)) as client,
    ):
        assert closed_by_server(client, trickle)


def test_a_client_gone_mid_response_is_one_info_line_not_an_error_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("uvicorn.error")
    with (
        serving(read_timeout_s=5.0) as port,
        socket.create_connection(("127.0.0.1", port)) as client,
    ):
        logger.setLevel(logging.INFO)  # the product logs at WARNING: show the INFO line here
        logger.addHandler(caplog.handler)
        try:
            client.sendall(b"GET /gone HTTP/1.1\r\nHost: t\r\n\r\n")
            client.settimeout(DEADLINE_S)
            client.recv(4096)
            time.sleep(0.5)
        finally:
            logger.removeHandler(caplog.handler)
    records = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert records, "uvicorn said nothing"
    assert all(r.levelno < logging.ERROR and r.exc_info is None for r in records)
    assert any("disconnected" in r.getMessage() for r in records)

"""uvicorn, configured for the embedded host: slow clients time out, disconnects are quiet.

- Keep-alive: an idle connection is closed after ``KEEP_ALIVE_S``.
- Reading a request: from its first byte (or the connection's opening) to its last body byte,
  at most ``REQUEST_READ_TIMEOUT_S``; a client that trickles its headers or its body is
  disconnected (uvicorn has no such timeout of its own).
- A client that goes away mid-response is an everyday event: one line at INFO, not a
  traceback at ERROR.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["KEEP_ALIVE_S", "REQUEST_READ_TIMEOUT_S", "timed_h11", "uvicorn_config"]

KEEP_ALIVE_S: Final = 5
REQUEST_READ_TIMEOUT_S: Final = 30.0
log = logging.getLogger(__name__)


def timed_h11(read_timeout_s: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on reading each request (headers and body)."""

    class TimedH11Protocol(H11Protocol):
        _read_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
                self._disarm()  # the request is read (or the connection is ending)
            elif self._read_deadline is None:
                self._arm()  # the first byte of the next request on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(read_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def _too_slow(self) -> None:
            self._read_deadline = None
            if self.conn.their_state is h11.DONE or self.transport.is_closing():
                return
            log.info("closed a connection that did not send its request in time")
            self.transport.close()

    return TimedH11Protocol


class _QuietDisconnects(logging.Filter):
    """uvicorn logs a client gone mid-response as 'Exception in ASGI application' with a
    traceback at ERROR; such a record becomes one INFO line."""

    _DISCONNECTS: Final = ("ClientDisconnect", "ClosedResourceError", "BrokenResourceError")

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and _is_disconnect(error, self._DISCONNECTS):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args, record.exc_info, record.exc_text = (
                "a client disconnected before its response was complete",
                (),
                None,
                None,
            )
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def _is_disconnect(error: BaseException, names: tuple[str, ...]) -> bool:
    if type(error).__name__ in names:
        return True
    if isinstance(error, BaseExceptionGroup):
        return all(_is_disconnect(inner, names) for inner in error.exceptions)
    return False


def uvicorn_config(app: Any, *, read_timeout_s: float = REQUEST_READ_TIMEOUT_S) -> uvicorn.Config:
    config = uvicorn.Config(
        app,
        log_level="warning",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=5,
        http=timed_h11(read_timeout_s),
    )
    quiet = _QuietDisconnects()
    for name in ("uvicorn.error", "mcp.server.streamable_http"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietDisconnects) for f in logger.filters):
            logger.addFilter(quiet)
    return config

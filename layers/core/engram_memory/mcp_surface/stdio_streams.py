"""The stdio transport's two ends: the lines a client writes to stdin, and the messages the
server writes to stdout.

A pipe or a socket (what an MCP client gives its server) is served on the event loop itself,
in non-blocking mode (stdin by asyncio's read-pipe transport, stdout by ``_PipeWriter``): a line
is read, and a message written, without a round trip to a thread, and what the client has not
read yet waits in the writer's buffer while the loop goes on serving (a 40 KB result to a slow
reader never blocks another call). Anything else goes through threads, as a blocking file: a regular file is always
"ready", so non-blocking mode means nothing to it, and a terminal's mode is shared with the
shell that started the server. So is a descriptor that shares stderr's file (non-blocking mode
would reach the log's writes).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import io
import os
import stat
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Final, Protocol, TextIO, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

__all__ = ["ProtocolOut", "protocol_out", "stdin_lines"]

# Complete lines waiting for the server before the pipe is read no further (the client's writes
# then wait in the pipe, as they did behind the reading thread).
_PAUSE_AT: Final = 64
_UTF8: Final = codecs.getincrementaldecoder("utf-8")


class ProtocolOut(Protocol):
    """The protocol's stdout, as ``stdio_server`` writes it: ``write`` returns once the whole
    message is on the pipe (one call, one message: never torn by another); ``flush`` has
    nothing left to do."""

    async def write(self, text: str) -> int: ...

    async def flush(self) -> None: ...


def _on_the_loop(fd: int) -> bool:
    """Whether ``fd`` is served on the event loop: a pipe or socket that is not stderr's file,
    under asyncio on POSIX (Windows' loop watches no pipe descriptor; another backend reads
    through threads)."""
    if sys.platform == "win32":
        return False
    try:
        asyncio.get_running_loop()
        served = os.fstat(fd)
    except (RuntimeError, OSError):
        return False
    if not (stat.S_ISFIFO(served.st_mode) or stat.S_ISSOCK(served.st_mode)):
        return False
    try:
        log = os.fstat(2)
    except OSError:
        return True
    return (served.st_dev, served.st_ino) != (log.st_dev, log.st_ino)


@contextlib.asynccontextmanager
async def stdin_lines(fd: int) -> AsyncIterator[AsyncIterator[str]]:
    """The lines of descriptor ``fd`` as a text file reads them (UTF-8 with a bad byte
    replaced, universal newlines, each line with its ``\\n``), until its end or until the
    context exits. ``fd`` itself stays open, in blocking mode once the context exits."""
    if not _on_the_loop(fd):
        yield _daemon_lines(fd)
        return
    loop = asyncio.get_running_loop()
    pipe = open(os.dup(fd), "rb", buffering=0)  # noqa: SIM115 - the transport closes it
    transport, lines = await loop.connect_read_pipe(_PipeLines, pipe)
    try:
        yield lines.lines()
    finally:
        transport.close()  # stops reading at once: nothing reads the descriptor after this
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)  # the mode belongs to the file, which others may share


class _PipeLines(asyncio.Protocol):
    """The lines read from a pipe as they arrive, for one reader (``lines``)."""

    def __init__(self) -> None:
        # What a text file opened with errors="replace" does: TextIOWrapper uses the same.
        self._decoder = io.IncrementalNewlineDecoder(_UTF8("replace"), translate=True)
        self._lines: deque[str] = deque()
        self._partial: list[str] = []
        self._ended = False
        self._arrived: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        self._take(self._decoder.decode(data))
        if len(self._lines) >= _PAUSE_AT and self._transport is not None:
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()

    def _take(self, text: str) -> None:
        pieces = text.split("\n")
        if len(pieces) == 1:
            if text:
                self._partial.append(text)
            return
        self._partial.append(pieces[0])
        self._lines.append("".join(self._partial) + "\n")
        self._partial = [pieces[-1]] if pieces[-1] else []
        self._lines.extend(piece + "\n" for piece in pieces[1:-1])
        self._wake()

    def _end(self) -> None:
        if self._ended:
            return
        self._take(self._decoder.decode(b"", final=True))
        if self._partial:  # the last line, without its newline
            self._lines.append("".join(self._partial))
            self._partial = []
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    async def lines(self) -> AsyncIterator[str]:
        while True:
            if self._lines:
                line = self._lines.popleft()
                transport = self._transport
                if not self._lines and transport is not None and not transport.is_reading():
                    transport.resume_reading()
                yield line
            elif self._ended:
                return
            else:
                self._arrived = asyncio.get_running_loop().create_future()
                await self._arrived


async def _daemon_lines(fd: int) -> AsyncIterator[str]:
    """The lines of file descriptor ``fd`` (UTF-8), read by a daemon thread.

    anyio reads a file in its worker threads, which the interpreter joins at exit: a read
    blocked on a client that keeps stdin open would keep the process alive after SIGTERM has
    stopped the server and closed the store. A daemon thread is not joined; it reads a file of
    its own (a duplicate descriptor), so no lock of ``sys.stdin`` is held at exit."""
    send, receive = anyio.create_memory_object_stream[str](1)
    token = anyio.lowlevel.current_token()
    stream = open(os.dup(fd), encoding="utf-8", errors="replace", closefd=True)  # noqa: SIM115 - the thread owns it

    def pump() -> None:
        try:
            for line in stream:
                anyio.from_thread.run(send.send, line, token=token)
        except (anyio.BrokenResourceError, anyio.RunFinishedError):
            return  # the server stopped reading
        finally:
            with contextlib.suppress(anyio.RunFinishedError):
                anyio.from_thread.run_sync(send.close, token=token)

    threading.Thread(target=pump, name="engram-stdin", daemon=True).start()
    async with receive:
        async for line in receive:
            yield line


@contextlib.asynccontextmanager
async def protocol_out(
    fd: int, after_write: Callable[[], None] | None = None
) -> AsyncIterator[ProtocolOut]:
    """The writer of the protocol's messages to descriptor ``fd``, which it owns and closes
    once every message written is on the pipe. ``after_write`` runs once each message is (the
    server's idle work: ``engine.idle``)."""
    if not _on_the_loop(fd):
        with os.fdopen(fd, "w", encoding="utf-8", closefd=True) as file:
            yield _LineWriter(file, after_write)
        return
    writer = _PipeWriter(fd, after_write)
    try:
        yield writer
    finally:
        with anyio.CancelScope(shield=True):
            await writer.drained()  # what a cancelled write left, as a blocking write finishes
        with contextlib.suppress(OSError):
            os.set_blocking(fd, True)  # the mode belongs to the file, which others may share
        os.close(fd)


class _PipeWriter:
    """stdout on the event loop, in non-blocking mode: a message goes onto the pipe at once
    when the pipe has room; what the pipe cannot take yet waits here, written as the client
    reads, and ``write`` waits for it without holding the loop.

    Not asyncio's pipe transport: it takes a readable descriptor for a peer that closed, which
    a socket given as both stdin and stdout is whenever the client writes."""

    def __init__(self, fd: int, after_write: Callable[[], None] | None = None) -> None:
        self._fd = fd
        self._after_write = after_write
        self._loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)
        self._waiting = bytearray()
        self._drained: asyncio.Future[None] | None = None
        self._error: int | None = None  # the errno of a failed write: every later one fails

    async def write(self, text: str) -> int:
        data = text.encode("utf-8")
        if self._drained is not None:
            self._waiting += data  # behind the messages still waiting: in order, whole
        elif self._error is None:
            try:
                sent = os.write(self._fd, data)
            except BlockingIOError:
                sent = 0
            except OSError as error:
                self._error = error.errno
                sent = len(data)
            if sent < len(data):
                self._waiting += memoryview(data)[sent:]
                self._drained = self._loop.create_future()
                self._loop.add_writer(self._fd, self._write_waiting)
        await self.drained()
        if self._error is not None:
            raise OSError(self._error, os.strerror(self._error))  # EPIPE: BrokenPipeError
        if self._after_write is not None:
            self._after_write()  # the message is on the pipe: the client has it already
        return len(text)

    def _write_waiting(self) -> None:
        try:
            sent = os.write(self._fd, self._waiting)
        except BlockingIOError:
            return
        except OSError as error:
            self._error = error.errno
            sent = len(self._waiting)
        del self._waiting[:sent]
        if not self._waiting and self._drained is not None:
            self._loop.remove_writer(self._fd)
            self._drained.set_result(None)
            self._drained = None

    async def drained(self) -> None:
        """Once nothing waits to be written (or writing failed)."""
        while self._drained is not None:
            # shielded: a cancelled writer leaves the wait of the others alone
            await asyncio.shield(self._drained)

    async def flush(self) -> None:
        await anyio.lowlevel.checkpoint()  # every write waited for its message to be on the pipe


class _LineWriter:
    """The protocol's stdout as a blocking file: each message (one whole line) is written and
    flushed in one hop to a worker thread. The SDK writes then flushes: as two awaits on an
    ``anyio`` file that is two thread hops per message, and a 40 KB search result waited on
    both; ``flush`` has nothing left to do."""

    def __init__(self, file: TextIO, after_write: Callable[[], None] | None = None) -> None:
        self._file = file
        self._after_write = after_write
        self._lock = anyio.Lock()

    def _write_line(self, text: str) -> int:
        written = self._file.write(text)
        self._file.flush()
        return written

    async def write(self, text: str) -> int:
        async with self._lock:
            written = await anyio.to_thread.run_sync(self._write_line, text)
        if self._after_write is not None:
            self._after_write()
        return written

    async def flush(self) -> None:
        await anyio.lowlevel.checkpoint()  # every write was flushed with it

"""The stdio transport's stdout: each message reaches the pipe whole, with its write alone."""

from __future__ import annotations

import os

import anyio

from engram_memory.mcp_surface.transports import _LineWriter


def test_a_message_is_on_the_pipe_once_its_write_returns() -> None:
    """One hop to a worker thread writes and flushes the line: the client can read all of it
    before anyone calls ``flush`` (the SDK's separate flush has nothing left to do)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    # Smaller than the text file's buffer: only a flush puts it on the pipe.
    message = '{"jsonrpc":"2.0","id":1,"result":{"text":"' + "x" * 2_000 + '"}}\n'
    with os.fdopen(write_fd, "w", encoding="utf-8") as out, os.fdopen(read_fd, "rb") as pipe:
        writer = _LineWriter(out)

        async def write() -> int:
            with anyio.fail_after(30):
                return await writer.write(message)

        assert anyio.run(write) == len(message)
        assert pipe.read() == message.encode("utf-8")

"""The stdio transport's two ends (``mcp_surface.stdio_streams``): stdin read as a text file
reads it, from a pipe on the event loop or from a regular file through a thread; stdout written
whole, a message that the pipe cannot take yet waiting without holding the loop."""

from __future__ import annotations

import io
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from engram_memory.mcp_surface.stdio_streams import (
    _LineWriter,
    _PipeLines,
    protocol_out,
    stdin_lines,
)

# Every way a text file splits and decodes: CRLF, a lone CR, a bad byte, a character of two
# bytes, a blank line, and a last line without its newline.
AWKWARD = (
    b'{"a":1}\r\n{"b":"\xc3\xa9t\xc3\xa9"}\r{"c":2}\n\xff{"d":3}\n\n\r\n'
    b'{"e":"\xe2\x82\xac"}\r\r\n{"last":true}'
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the event loop's pipe transports are asyncio's


def _as_a_text_file(data: bytes) -> list[str]:
    return list(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace"))


def _fed(chunks: list[bytes]) -> list[str]:
    """The lines ``_PipeLines`` gives for ``chunks`` arriving one by one, then the end."""
    lines = _PipeLines()
    for chunk in chunks:
        lines.data_received(chunk)
    lines.eof_received()

    async def read() -> list[str]:
        return [line async for line in lines.lines()]

    return anyio.run(read)


def test_lines_arriving_in_any_pieces_are_the_lines_a_text_file_reads() -> None:
    """Cut anywhere (inside a character, between CR and LF), the lines are the text file's."""
    expected = _as_a_text_file(AWKWARD)
    assert "\r" not in "".join(expected) and expected[-1] == '{"last":true}'
    for cut in range(len(AWKWARD) + 1):
        assert _fed([AWKWARD[:cut], AWKWARD[cut:]]) == expected, cut
    assert _fed([AWKWARD[i : i + 1] for i in range(len(AWKWARD))]) == expected


async def _lines_of(fd: int, on_first: Callable[[], None] = lambda: None) -> list[str]:
    got: list[str] = []
    with anyio.fail_after(30):
        async with stdin_lines(fd) as lines:
            async for line in lines:
                if not got:
                    on_first()
                got.append(line)
    return got


def _written_and_closed(write_fd: int, data: bytes) -> threading.Thread:
    def write() -> None:
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)

    writer = threading.Thread(target=write)
    writer.start()
    return writer


@pytest.mark.anyio
async def test_a_pipe_is_read_on_the_loop_and_left_blocking_after() -> None:
    """A pipe is non-blocking while the loop reads it, and blocking again once reading stops
    (the mode belongs to the pipe, which the client's other processes may share)."""
    read_fd, write_fd = os.pipe()
    writer = _written_and_closed(write_fd, AWKWARD)
    modes: list[bool] = []
    try:
        lines = await _lines_of(read_fd, lambda: modes.append(os.get_blocking(read_fd)))
        assert lines == _as_a_text_file(AWKWARD)
        assert modes == [False]
        assert os.get_blocking(read_fd)
    finally:
        writer.join()
        os.close(read_fd)


@pytest.mark.anyio
async def test_a_regular_file_is_read_through_a_thread_with_the_same_lines(
    tmp_path: Path,
) -> None:
    """A regular file is always "ready": it is read blocking, by a thread, never switched."""
    path = tmp_path / "stdin"
    path.write_bytes(AWKWARD)
    fd = os.open(path, os.O_RDONLY)
    modes: list[bool] = []
    try:
        lines = await _lines_of(fd, lambda: modes.append(os.get_blocking(fd)))
        assert lines == _as_a_text_file(AWKWARD)
        assert modes == [True]
    finally:
        os.close(fd)


@pytest.mark.anyio
async def test_more_lines_than_wait_unread_all_arrive_in_order() -> None:
    """Reading pauses while many lines wait for the server and resumes as it takes them."""
    read_fd, write_fd = os.pipe()
    sent = [f'{{"n":{n}}}\n' for n in range(2_000)]
    writer = _written_and_closed(write_fd, "".join(sent).encode())
    try:
        assert await _lines_of(read_fd) == sent
    finally:
        writer.join()
        os.close(read_fd)


@pytest.mark.anyio
async def test_a_slow_reader_of_a_big_message_does_not_hold_the_loop() -> None:
    """A message larger than the pipe waits in the transport's buffer: the loop goes on
    serving (another call's message waits behind it, whole), and each write returns once its
    message is on the pipe, as the client reads."""
    read_fd, write_fd = os.pipe()
    big = '{"jsonrpc":"2.0","id":1,"result":{"text":"' + "x" * 1_000_000 + '"}}\n'
    small = '{"jsonrpc":"2.0","id":2,"result":{}}\n'
    loop_served = threading.Event()
    received = bytearray()

    def client() -> None:
        # A loop held by the write never sets the event: read anyway, so the test fails (below)
        # instead of hanging.
        loop_served.wait(timeout=60)
        with os.fdopen(read_fd, "rb") as pipe:
            received.extend(pipe.read())

    reader = threading.Thread(target=client)
    reader.start()
    finished: list[str] = []
    try:
        with anyio.fail_after(120):
            async with protocol_out(write_fd) as out:

                async def write(text: str, name: str) -> None:
                    await out.write(text)
                    await out.flush()
                    finished.append(name)

                async with anyio.create_task_group() as group:
                    group.start_soon(write, big, "big")
                    await anyio.wait_all_tasks_blocked()
                    group.start_soon(write, small, "small")
                    await anyio.wait_all_tasks_blocked()
                    assert finished == []  # both wait for the client, the loop does not
                    loop_served.set()
                assert not os.get_blocking(write_fd)
    finally:
        loop_served.set()
        reader.join()
    assert sorted(finished) == ["big", "small"]
    assert received.decode() == big + small


@pytest.mark.anyio
async def test_writing_to_a_client_that_closed_its_end_is_a_broken_pipe() -> None:
    near, far = socket.socketpair()
    far.close()
    with anyio.fail_after(30):
        async with protocol_out(os.dup(near.fileno())) as out:
            with pytest.raises(BrokenPipeError):
                await out.write('{"jsonrpc":"2.0","id":1,"result":{}}\n')
            with pytest.raises(BrokenPipeError):  # and every write after it
                await out.write('{"jsonrpc":"2.0","id":2,"result":{}}\n')
    near.close()


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


@pytest.mark.anyio
async def test_a_pipes_message_is_on_the_pipe_once_its_write_returns() -> None:
    read_fd, write_fd = os.pipe()
    message = '{"jsonrpc":"2.0","id":1,"result":{"text":"' + "x" * 2_000 + '"}}\n'
    with os.fdopen(read_fd, "rb") as pipe:
        with anyio.fail_after(30):
            async with protocol_out(write_fd) as out:
                assert await out.write(message) == len(message)
                os.set_blocking(read_fd, False)
                assert pipe.read() == message.encode("utf-8")


@pytest.mark.anyio
async def test_the_idle_work_runs_once_each_message_is_on_the_pipe() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    seen_by_idle_work: list[bytes] = []
    messages = ['{"jsonrpc":"2.0","id":1,"result":{}}\n', '{"jsonrpc":"2.0","id":2,"result":{}}\n']
    with os.fdopen(read_fd, "rb") as pipe:

        def idle_work() -> None:  # what the client can read by the time it runs
            seen_by_idle_work.append(pipe.read() or b"")

        with anyio.fail_after(30):
            async with protocol_out(write_fd, idle_work) as out:
                for message in messages:
                    await out.write(message)
    assert seen_by_idle_work == [message.encode("utf-8") for message in messages]


def test_a_blocking_file_s_idle_work_runs_after_each_message_too(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    seen: list[str] = []
    with open(path, "w", encoding="utf-8") as out:
        writer = _LineWriter(out, lambda: seen.append(path.read_text(encoding="utf-8")))

        async def write() -> None:
            await writer.write('{"id":1}\n')
            await writer.write('{"id":2}\n')

        anyio.run(write)
    assert seen == ['{"id":1}\n', '{"id":1}\n{"id":2}\n']

"""The server caps glibc's malloc arenas before its worker threads exist (``host.allocator``).

Each check runs in a fresh interpreter (a process's arenas outlive its threads): 16 threads
allocate at once, then glibc's ``malloc_info`` is read back and its heaps (arenas) counted. The
uncapped run is the control that shows the count is sensitive: there, threads get arenas of
their own.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from engram_memory.embedded.allocator import SERVER_MALLOC_ARENAS

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="malloc arenas are glibc's",
)

THREADS = 16

SCRIPT = """
import ctypes, re, socket, sys, tempfile, threading
from pathlib import Path

if sys.argv[1] == "serve":
    from engram_memory.embedded.serve import ServeError, serve
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:  # the server's own entry point, stopped by a port already in use
        serve(Path(tempfile.mkdtemp()), bind_host="127.0.0.1",
              port=taken.getsockname()[1], stdio=False)
    except ServeError:
        pass

started, finished = threading.Barrier(THREADS), threading.Barrier(THREADS)

def work():
    started.wait()
    held = [bytearray(512) for _ in range(4000)]
    finished.wait()
    del held

threads = [threading.Thread(target=work) for _ in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()

libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
report = Path(tempfile.mkdtemp()) / "malloc_info.xml"
stream = libc.fopen(str(report).encode(), b"w")
libc.malloc_info(0, stream)
libc.fclose(stream)
print(len(re.findall(r'<heap nr="', report.read_text())))
""".replace("THREADS", str(THREADS))


def arenas_after_threads(mode: str, tmp_path: Path) -> int:
    env = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    done = subprocess.run(  # noqa: S603 - this interpreter, a fixed script
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


def test_serve_caps_the_arenas_its_threads_allocate_in(tmp_path: Path) -> None:
    assert arenas_after_threads("serve", tmp_path) <= SERVER_MALLOC_ARENAS


def test_without_the_cap_threads_spread_over_more_arenas(tmp_path: Path) -> None:
    assert arenas_after_threads("plain", tmp_path) > SERVER_MALLOC_ARENAS

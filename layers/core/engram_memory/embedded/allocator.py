"""The serving process's malloc arenas, capped.

glibc gives each thread that allocates while the existing arenas are busy an arena of its own,
up to eight per core. The server runs tool calls on a pool of worker threads that come and go
(anyio's, up to 40; an idle one exits after 10 s), so allocations spread over many arenas, and
what a call frees stays behind in its arena's free lists instead of going back to the operating
system: in the soak, bytes free inside malloc's arenas grew with the calls (6.5 → 11 MiB in two
minutes) and RSS with them, while bytes in use grew only with the caches. With two arenas the
free bytes stayed flat. Tool calls are short and mostly wait on SQLite or the network, so two
arenas cost no measurable contention.

``MALLOC_ARENA_MAX`` in the environment does the same but only when set before the interpreter
starts; ``mallopt`` applies to the arenas created after it, so the server calls it first, before
any worker thread exists. An explicit ``MALLOC_ARENA_MAX`` is respected.

What a burst leaves behind is not given back by itself either. A closed MCP HTTP session
(~13 KiB) is a cycle of objects (its streams, tasks and their frames) that only the garbage
collector's oldest generation frees, and in a long-lived heap that collection waits for the heap
to grow by a quarter; the pages it frees then sit in malloc's free lists below the top of the
heap, which glibc does not trim. ``release_free_memory`` does both (``gc.collect``, then
``malloc_trim``); the server runs it every ``RELEASE_EVERY_S``.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from typing import Final

SERVER_MALLOC_ARENAS: Final = 2
RELEASE_EVERY_S: Final = 30.0  # a full collection of the server's heap takes a few ms
_M_ARENA_MAX: Final = -8  # glibc's mallopt parameter number (malloc.h)


def cap_malloc_arenas(arenas: int = SERVER_MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process; False where that is not possible (another C
    library, or ``MALLOC_ARENA_MAX`` already chosen by whoever started the process)."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))


def release_free_memory() -> bool:
    """Free the garbage cycles, then give the free pages inside malloc's heaps back to the
    operating system (glibc's ``malloc_trim(0)``); False where the latter is not possible."""
    gc.collect()
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))

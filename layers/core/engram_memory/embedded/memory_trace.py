"""An opt-in diagnostic: what the serving process's memory is made of, at intervals.

Set ``ENGRAM_MEMORY_TRACE_DIR`` to a directory and ``engram-memory serve`` writes there, every
``ENGRAM_MEMORY_TRACE_EVERY_S`` seconds (default 60):

- ``rss.tsv``, one line per interval: seconds since start, RSS (KiB), bytes traced by
  tracemalloc, bytes SQLite holds (``sqlite3_memory_used``), glibc malloc's bytes in use and
  bytes free inside its arenas (``mallinfo2``); -1 where a figure is not available;
- ``census-<n>-<seconds>s.json``: the live objects the garbage collector tracks, counted by type;
- ``snapshot-<n>-<seconds>s.pickle``: a ``tracemalloc`` snapshot, when ``ENGRAM_MEMORY_TRACE_FRAMES``
  (frames kept per allocation, default 1) is above 0; tracing starts after the first interval
  (start-up is not traced), so the first snapshot is the second interval's, and the traced
  bytes of the first two lines are 0. Tracing slows a busy server a lot; with 0
  only the cheap figures above are taken.

``python -m bench.soak.memory DIR`` diffs them: which lines and types grew. Traced bytes and
malloc's bytes in use flat while RSS grows and malloc's free bytes grow points at the allocator
(memory freed but kept in its arenas), not at a leak. For finding a leak, never for measuring
speed; unset, nothing here runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import itertools
import json
import os
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Final

TRACE_DIR_ENV: Final = "ENGRAM_MEMORY_TRACE_DIR"
TRACE_EVERY_ENV: Final = "ENGRAM_MEMORY_TRACE_EVERY_S"
TRACE_FRAMES_ENV: Final = "ENGRAM_MEMORY_TRACE_FRAMES"


def rss_kib() -> int:
    """This process's resident set size in KiB (Linux ``/proc``; 0 elsewhere)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [  # the C struct's layout
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def native_heap() -> tuple[int, int, int]:
    """Bytes SQLite holds, and glibc malloc's bytes in use and free (-1 when unavailable)."""
    sqlite_bytes = malloc_used = malloc_free = -1
    try:
        sqlite = ctypes.CDLL(ctypes.util.find_library("sqlite3") or "libsqlite3.so.0")
        sqlite.sqlite3_memory_used.restype = ctypes.c_int64
        sqlite_bytes = int(sqlite.sqlite3_memory_used())
    except (OSError, AttributeError):
        pass
    try:
        libc = ctypes.CDLL(None)
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        malloc_used, malloc_free = int(info.uordblks + info.hblkhd), int(info.fordblks)
    except (OSError, AttributeError):
        pass
    return sqlite_bytes, malloc_used, malloc_free


def object_census() -> dict[str, int]:
    """How many live objects the garbage collector tracks, by type (module-qualified name)."""
    counts = Counter(
        f"{type(thing).__module__}.{type(thing).__qualname__}" for thing in gc.get_objects()
    )
    return dict(counts.most_common())


def start_from_environment() -> threading.Event | None:
    """Start tracing when ``ENGRAM_MEMORY_TRACE_DIR`` is set; the returned event stops it."""
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        return None
    every_s = float(os.environ.get(TRACE_EVERY_ENV, "60"))
    frames = int(os.environ.get(TRACE_FRAMES_ENV, "1"))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    began = time.monotonic()
    dumps = itertools.count()

    def dump() -> None:
        elapsed = round(time.monotonic() - began)
        name = f"{next(dumps):05d}-{elapsed:06d}s"  # in order, and unique within a second
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(out / f"snapshot-{name}.pickle"))
        census = json.dumps(object_census(), indent=0)
        (out / f"census-{name}.json").write_text(census, encoding="utf-8")
        traced, _peak = tracemalloc.get_traced_memory()
        with (out / "rss.tsv").open("a", encoding="utf-8") as log:
            native = "\t".join(str(figure) for figure in native_heap())
            log.write(f"{elapsed}\t{rss_kib()}\t{traced}\t{native}\n")

    def loop() -> None:
        dump()
        while not stop.wait(every_s):
            dump()
            # Tracing from the first interval on, not from the start: the server's start-up,
            # traced, takes minutes, and what grows is what serving allocates.
            if frames > 0 and not tracemalloc.is_tracing():
                tracemalloc.start(frames)

    threading.Thread(target=loop, name="engram-memory-trace", daemon=True).start()
    return stop

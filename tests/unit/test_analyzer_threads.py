"""The analyzer from many threads at once answers exactly what it answers from one."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from engram_memory.engine import lexical

THREADS = 16
CALLS_PER_THREAD = 200
# Words whose Snowball stems differ in length and suffix class, so two interleaved stemmings
# of a shared stemmer corrupt each other (wrong stem) or index past a word's end (IndexError).
TEXTS = (
    "The painters were painting generously relational conditional rationalizations",
    "hopefulness connections organizations abilities happily nationalism",
    "I ran; running runners run quickly through the sensational electrical generators",
    "Probabilistic identification of controversially formalized dependencies",
    "Cats sat. Dogs barked loudly at happiness, arguing argumentatively",
)


@pytest.fixture
def fine_thread_switching() -> Iterator[None]:
    # Switch threads every microsecond instead of every 5 ms so races show up within 3,200 calls.
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@pytest.mark.usefixtures("fine_thread_switching")
def test_sixteen_threads_analysing_text_get_no_exceptions_and_no_wrong_stems() -> None:
    reference = {text: lexical.analyze(text) for text in TEXTS}
    start = threading.Barrier(THREADS)
    lock = threading.Lock()
    exceptions: list[BaseException] = []
    wrong_stems = 0

    def analyse_repeatedly(offset: int) -> None:
        nonlocal wrong_stems
        start.wait()
        for call in range(CALLS_PER_THREAD):
            text = TEXTS[(offset + call) % len(TEXTS)]
            try:
                terms = lexical.analyze(text)
            except Exception as error:
                with lock:
                    exceptions.append(error)
                continue
            if terms != reference[text]:
                with lock:
                    wrong_stems += 1

    workers = [threading.Thread(target=analyse_repeatedly, args=(i,)) for i in range(THREADS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    assert (len(exceptions), wrong_stems) == (0, 0), (
        f"{len(exceptions)} exceptions ({sorted({type(e).__name__ for e in exceptions})}) and "
        f"{wrong_stems} wrong results out of {THREADS * CALLS_PER_THREAD} calls"
    )

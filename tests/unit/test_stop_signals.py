"""SIGTERM stops a server as a ``KeyboardInterrupt`` in the main thread, but never part-way
through an engine call running there (``StopSignals``): the stdio server runs its calls on the
event loop's thread, and a stop that arrives during one is raised when the call returns.

Real signals: ``os.kill`` of this process, with the handler ``serve`` installs."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator

import pytest

from engram_memory.embedded.serve import StopSignals


@pytest.fixture
def stops() -> Iterator[StopSignals]:
    before = signal.getsignal(signal.SIGTERM)
    signals = StopSignals()
    signals.install()
    try:
        yield signals
    finally:
        signal.signal(signal.SIGTERM, before)


def _sigterm() -> None:
    """SIGTERM to this process, then a few bytecodes: Python runs the handler at the main
    thread's next one, so a stop that is not held has been raised by the time this returns."""
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):
        pass


def _call(stops: StopSignals, finished: list[str], *, fails: bool = False) -> None:
    """An engine call on the main thread that is sent SIGTERM part-way."""
    with stops.held():
        _sigterm()
        finished.append("the rest of the call ran")
        if fails:
            raise ValueError("the call's own failure")
    finished.append("not reached")


def test_a_stop_outside_a_call_is_raised_at_once(stops: StopSignals) -> None:
    with pytest.raises(KeyboardInterrupt):
        _sigterm()
    with stops.held():  # nothing left over: the next call runs untouched
        pass


def test_a_stop_during_a_call_is_raised_when_the_call_returns(stops: StopSignals) -> None:
    finished: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _call(stops, finished)
    assert finished == ["the rest of the call ran"]
    with stops.held():  # raised once: the next call runs untouched
        pass


def test_a_call_that_fails_still_lets_the_held_stop_through(stops: StopSignals) -> None:
    finished: list[str] = []
    with pytest.raises(KeyboardInterrupt) as raised:
        _call(stops, finished, fails=True)
    assert finished == ["the rest of the call ran"]
    assert isinstance(raised.value.__context__, ValueError)


def test_a_call_in_a_worker_thread_holds_nothing(stops: StopSignals) -> None:
    """An HTTP server's calls run in worker threads, which a signal never interrupts: one of
    them running does not hold the main thread's stop."""
    entered, release = threading.Event(), threading.Event()

    def call() -> None:
        with stops.held():
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=call)
    worker.start()
    try:
        assert entered.wait(10)
        with pytest.raises(KeyboardInterrupt):
            _sigterm()
    finally:
        release.set()
        worker.join(10)
    assert not worker.is_alive()

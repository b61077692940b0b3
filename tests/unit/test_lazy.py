"""adapters.lazy.Lazy: made once on first use, whichever thread asks first; closed only if made."""

from __future__ import annotations

import threading

import pytest

from engram_memory.adapters.lazy import Lazy


class _Resource:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_made_once_on_first_get_whichever_thread_asks() -> None:
    made: list[_Resource] = []
    release = threading.Event()

    def make() -> _Resource:
        release.wait()
        made.append(_Resource())
        return made[-1]

    lazy = Lazy(make)
    assert not lazy.made and made == []
    got: list[_Resource] = []
    threads = [threading.Thread(target=lambda: got.append(lazy.get())) for _ in range(8)]
    for thread in threads:
        thread.start()
    release.set()
    for thread in threads:
        thread.join()
    assert len(made) == 1 and got == made * 8
    assert lazy.made and lazy.get() is made[0]


def test_a_value_given_up_front_is_used_as_it_is() -> None:
    given = _Resource()

    def never() -> _Resource:
        raise AssertionError("made although a value was given")

    lazy = Lazy(never, given)
    assert lazy.made and lazy.get() is given


def test_close_never_makes_and_closes_what_was_made() -> None:
    lazy = Lazy(_Resource)
    lazy.close()
    assert not lazy.made
    resource = lazy.get()
    lazy.close()
    assert resource.closed == 1


def test_a_failed_make_is_tried_again_on_the_next_get() -> None:
    attempts: list[int] = []

    def make() -> _Resource:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("not yet")
        return _Resource()

    lazy = Lazy(make)
    with pytest.raises(OSError, match="not yet"):
        lazy.get()
    assert not lazy.made
    assert isinstance(lazy.get(), _Resource) and len(attempts) == 2

"""A resource made on first use, once, whichever thread asks first.

Both hosts defer what is slow or touches the outside world until a call needs it (the embedded
engine and its approval book, the console's sign-in links, the DynamoDB and OpenSearch clients),
so a server answers ``initialize`` and ``tools/list`` without them; a request thread and the shutdown path
may reach one at the same time, hence the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

# covariant: a Lazy[ApprovalBook] is a Lazy of something closable (``close`` asks no more)
T = TypeVar("T", covariant=True)


class _Closable(Protocol):
    def close(self) -> None: ...


class Lazy(Generic[T]):
    """``make()`` on the first ``get()``, its value on every later one; ``value`` given up front
    (a client a test or a composition already holds) is used as it is. ``make`` never answers
    None: None means not made yet."""

    def __init__(self, make: Callable[[], T], value: T | None = None) -> None:
        self._make = make
        self._value = value
        self._lock = threading.Lock()

    def get(self) -> T:
        value = self._value
        if value is not None:  # made: no lock to take (a reference is read atomically)
            return value
        with self._lock:
            if self._value is None:
                self._value = self._make()
            return self._value

    @property
    def made(self) -> bool:
        """Whether the value exists, without making it or waiting for one being made."""
        return self._value is not None

    def close(self: Lazy[_Closable]) -> None:
        """Close the value if it was made (waiting for one being made); never makes it."""
        with self._lock:
            if self._value is not None:
                self._value.close()

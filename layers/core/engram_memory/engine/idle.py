"""Work a call leaves for the host's idle time, after its answer has left.

A capture is nearly always followed by the same agent's ``request_admission`` of the candidate,
and between the two the server waits: the answer travels, the client reads and checks it,
builds the next call and sends it. The part of the admission that depends on the candidate's
content alone and is remembered anyway (the admission policy's secret scan and near-duplicate
signature, ``AnticipatingPolicy``) can be done in that wait instead of in the admission: the
admission then reads it back, and decides exactly as it would have.

Nothing is queued until a host that runs the queue soon after each answer accepts it (the stdio
server runs it once each message is on the pipe, the embedded HTTP server once each answer's last
byte is sent): a host that never runs it (the cloud's functions, an engine used in process) would
otherwise keep the last candidates' plaintext in memory. At most ``LIMIT``
pieces wait; a newer one pushes out the oldest. Work that fails is dropped (logged): it only
ever saves time.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

LIMIT: Final = 4


class IdleWork:
    """The queue; thread-safe (calls may come from worker threads, the runner is the loop)."""

    def __init__(self) -> None:
        self._queue: deque[Callable[[], None]] | None = None
        self._lock = threading.Lock()

    def accept(self) -> None:
        """From now on, calls may leave work (the host promises to ``run`` it)."""
        if self._queue is not None:
            return
        with self._lock:
            if self._queue is None:
                self._queue = deque(maxlen=LIMIT)

    @property
    def accepted(self) -> bool:
        return self._queue is not None

    def offer(self, work: Callable[[], None]) -> None:
        """Leave ``work`` for later; dropped when no host runs the queue."""
        queue = self._queue
        if queue is not None:
            queue.append(work)

    def run(self) -> None:
        """Run everything waiting, oldest first."""
        queue = self._queue
        while queue:
            try:
                work = queue.popleft()
            except IndexError:  # another thread took the last one
                return
            try:
                work()
            except Exception:  # it only saves time: the call it anticipates does it again
                log.debug("idle work failed", exc_info=True)

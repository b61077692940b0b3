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
ever saves time. The same holds for what a capture hands on: at most ``LIMIT`` candidates, each
used for at most ``HOLD_S`` seconds (and dropped once the host next runs the queue after that),
never past the destruction of its key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from engram_memory.engine.context import Scope
from engram_memory.engine.ports import CandidateRow, ProjectionDoc

log = logging.getLogger(__name__)

LIMIT: Final = 4
# How long a captured candidate's plaintext waits for its admission (an agent asks for it at
# once; one that asks later opens the message, as any admission did before).
HOLD_S: Final = 30.0


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


@dataclass(slots=True)
class ExpectedAdmission:
    """What the capture of one candidate hands to its admission (held by scope and candidate
    id): the sealed message's identity and plaintext, and, once the idle work made them, the accepted record's projection document
    and sealed body (``None`` until then)."""

    key_ref: str
    ciphertext: bytes = field(repr=False)
    plaintext: bytes = field(repr=False)  # a pending candidate's content: never shown
    held_at: float
    doc: ProjectionDoc | None = field(default=None, repr=False)
    sealed_body: bytes | None = field(default=None, repr=False)


class ExpectedAdmissions:
    """The candidates captured last whose admission is expected next; thread-safe. Holds
    nothing until the host accepts idle work (``IdleWork.accept``): a host that does not may
    never be asked for the admission, and would keep plaintext for nothing."""

    def __init__(self, idle: IdleWork, clock: Callable[[], float] = time.monotonic) -> None:
        self._idle = idle
        self._clock = clock
        self._held: OrderedDict[tuple[Scope, str], ExpectedAdmission] = OrderedDict()
        self._lock = threading.Lock()

    def hold(
        self, scope: Scope, candidate_id: str, key_ref: str, ciphertext: bytes, plaintext: bytes
    ) -> None:
        """Keep the plaintext just sealed (and committed) for the candidate's admission."""
        if not self._idle.accepted:
            return
        entry = ExpectedAdmission(key_ref, ciphertext, plaintext, self._clock())
        with self._lock:
            self._expire_locked()
            self._held.pop((scope, candidate_id), None)
            self._held[(scope, candidate_id)] = entry
            while len(self._held) > LIMIT:
                self._held.popitem(last=False)

    def prepared(
        self, scope: Scope, candidate_id: str, doc: ProjectionDoc | None, sealed_body: bytes | None
    ) -> None:
        """Add what the idle work made for the candidate's acceptance, if it is still held."""
        with self._lock:
            entry = self._held.get((scope, candidate_id))
            if entry is not None:
                entry.doc, entry.sealed_body = doc, sealed_body

    def take(self, scope: Scope, candidate: CandidateRow) -> ExpectedAdmission | None:
        """What was held for ``candidate``, removed, when it was held for the very message the
        store holds for it; ``None`` otherwise (anything held for the candidate is dropped)."""
        with self._lock:
            self._expire_locked()
            entry = self._held.pop((scope, candidate.candidate_id), None)
        if entry is None or (entry.key_ref, entry.ciphertext) != (
            candidate.key_ref,
            candidate.sealed,
        ):
            return None
        return entry

    def drop_key(self, key_ref: str) -> None:
        """Forget what was held under a candidate key being destroyed."""
        with self._lock:
            for key, entry in list(self._held.items()):
                if entry.key_ref == key_ref:
                    del self._held[key]

    def __len__(self) -> int:
        """How many candidates are held."""
        return len(self._held)

    def expire(self) -> None:
        """Drop what was held longer than ``HOLD_S``."""
        with self._lock:
            self._expire_locked()

    def _expire_locked(self) -> None:
        oldest = self._clock() - HOLD_S
        while self._held:
            key, entry = next(iter(self._held.items()))
            if entry.held_at >= oldest:
                return
            del self._held[key]

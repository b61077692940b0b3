"""The benchmark's data: LoCoMo turns as memories, LoCoMo questions as queries.

A store of ``n`` records holds memories ``0 .. n-1``: memory ``i`` is turn ``i mod T`` of the
conversations' turns in file order (``T`` = 2,760 for the five development conversations), so a
store larger than ``T`` holds each turn several times (cycle ``i div T``) under its own keys.
The measured writes take the memories after the seeded ones, so every write is new content for
its store. Both servers get the same memories and the same questions:

- this project: one ``capture`` (bench/locomo's fixed mapping: the turn and its context as two
  components, one citation) and one ``request_admission`` per memory;
- ``server-memory``: one ``create_entities`` (an entity per memory, named by its key, the turn as
  its first observation) and one ``add_observations`` (the context) per memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.locomo.calls import PURPOSE
from bench.locomo.dataset import Conversation, Turn, capture_arguments, load_dir

ENTITY_TYPE = "locomo_turn"
# Records each question asks for: the 10-record response every server and the floor are timed on.
SEARCH_LIMIT = 10


@dataclass(frozen=True)
class Memory:
    index: int
    conversation: str
    turn: Turn

    @property
    def key(self) -> str:
        """Stable name of the memory (its peer entity name; part of its idempotency keys)."""
        return f"{self.conversation}:{self.turn.dia_id}:{self.index}"

    @property
    def text_bytes(self) -> int:
        """The memory text it carries: the turn and its context, UTF-8."""
        return len(self.turn.primary.encode()) + len(self.turn.context.encode())

    def capture_arguments(self, run: str = "seed") -> dict[str, Any]:
        arguments = capture_arguments(self.conversation, self.turn, PURPOSE)
        arguments["idempotency_key"] = f"hotpath-capture:{run}:{self.key}"
        return arguments

    def admission_arguments(self, candidate_id: str, run: str = "seed") -> dict[str, Any]:
        return {"candidate_id": candidate_id, "idempotency_key": f"hotpath-admit:{run}:{self.key}"}

    def peer_entity(self) -> dict[str, Any]:
        return {"name": self.key, "entityType": ENTITY_TYPE, "observations": [self.turn.primary]}

    def peer_observation(self) -> dict[str, Any]:
        return {"entityName": self.key, "contents": [self.turn.context]}


class Corpus:
    """Memories by index (cycling the turns) and the questions (categories 1-4) in file order."""

    def __init__(self, conversations: list[Conversation]) -> None:
        self._turns = [(c.name, t) for c in conversations for t in c.turns]
        self.questions = [q.question for c in conversations for q in c.questions]
        self.names = [c.name for c in conversations]
        if not self._turns or not self.questions:
            raise ValueError("the LoCoMo folder holds no turn or no question")

    @classmethod
    def load(cls, directory: Path) -> Corpus:
        return cls(load_dir(directory))

    @property
    def distinct_turns(self) -> int:
        return len(self._turns)

    def memory(self, index: int) -> Memory:
        name, turn = self._turns[index % len(self._turns)]
        return Memory(index, name, turn)

    def memories(self, start: int, stop: int) -> list[Memory]:
        return [self.memory(i) for i in range(start, stop)]

    def query(self, index: int) -> str:
        return self.questions[index % len(self.questions)]

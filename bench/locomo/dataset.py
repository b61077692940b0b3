"""LoCoMo conversations as the benchmark reads them, and the fixed capture mapping.

The mapping from a turn to a ``capture`` call is fixed by the issue, not tuned:

- primary component (kind ``evidence``): ``"<speaker>: <text>"``, plus
  ``" [image: <blip_caption>]"`` when the turn shares an image;
- a ``context`` component: the session date-time and the previous turn of the same session
  (``"<speaker>: <text>"``), one per line (the first turn of a session has the date only);
- one citation: ``source_ref`` ``locomo:<conversation>``, locator ``{scheme: "dia_id",
  value: <dia_id>}``, ``content_digest`` = sha256 of the turn text;
- ``valid_time.t`` (and ``primary_event.at``) = the session date-time in epoch ms (UTC).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CATEGORIES = (1, 2, 3, 4)  # 5 (adversarial) has no evidence in the same sense: excluded
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_SESSION = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D\d+:\d+")


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str | None
    session_time: str
    session_ms: int
    previous: str | None  # "<speaker>: <text>" of the previous turn in the session

    @property
    def primary(self) -> str:
        line = f"{self.speaker}: {self.text}"
        return f"{line} [image: {self.caption}]" if self.caption else line

    @property
    def context(self) -> str:
        return (
            self.session_time if self.previous is None else f"{self.session_time}\n{self.previous}"
        )


@dataclass(frozen=True)
class Question:
    question: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    name: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    dropped_evidence: int  # evidence ids that name no turn of the conversation


def parse_session_time(value: str) -> int:
    """``"1:56 pm on 8 May, 2023"`` → epoch milliseconds (read as UTC)."""
    moment = datetime.strptime(value.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def load(path: Path) -> Conversation:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    data = data.get("conversation", data) | {"qa": data["qa"]}  # tolerate the unsplit layout
    sessions = sorted(
        (int(m.group(1)), key)
        for key in data
        if (m := _SESSION.fullmatch(key)) and isinstance(data[key], list)
    )
    turns: list[Turn] = []
    for number, key in sessions:
        when = data[f"session_{number}_date_time"]
        when_ms = parse_session_time(when)
        previous: str | None = None
        for raw in data[key]:
            turn = Turn(
                dia_id=raw["dia_id"],
                speaker=raw["speaker"],
                text=raw["text"],
                caption=raw.get("blip_caption") or None,
                session_time=when,
                session_ms=when_ms,
                previous=previous,
            )
            turns.append(turn)
            previous = f"{turn.speaker}: {turn.text}"
    known = {t.dia_id for t in turns}
    questions: list[Question] = []
    dropped = 0
    for qa in data["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        # A few evidence entries pack several ids in one string ("D8:6; D9:17").
        ids = [i for entry in qa.get("evidence", []) for i in _DIA_ID.findall(entry)]
        kept = tuple(dict.fromkeys(i for i in ids if i in known))
        dropped += len(set(ids)) - len(kept)
        if kept:
            questions.append(Question(qa["question"], int(qa["category"]), kept))
    return Conversation(path.stem, tuple(turns), tuple(questions), dropped)


def load_dir(directory: Path) -> list[Conversation]:
    return [load(path) for path in sorted(directory.glob("*.json"))]


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def capture_arguments(conversation: str, turn: Turn, purpose_ref: str) -> dict[str, Any]:
    """The ``capture`` arguments of one turn (the fixed mapping of the module docstring)."""
    citation = {
        "citation_id": "citation:turn",
        "source_ref": f"locomo:{conversation}",
        "locator": {"scheme": "dia_id", "value": turn.dia_id},
        "content_digest": _sha(turn.text),
    }
    return {
        "idempotency_key": f"locomo-capture:{conversation}:{turn.dia_id}",
        "payload": {
            "schema_version": 2,
            "purpose_ref": purpose_ref,
            "valid_time": {"t": turn.session_ms},
            "components": [
                {
                    "component_id": "component:turn",
                    "kind": "evidence",
                    "text": turn.primary,
                    "citation_ids": ["citation:turn"],
                },
                {
                    "component_id": "component:context",
                    "kind": "context",
                    "text": turn.context,
                    "citation_ids": ["citation:turn"],
                },
            ],
            "primary_component_id": "component:turn",
            "primary_event": {
                "at": turn.session_ms,
                "type_ref": "event:utterance",
                "citation_id": "citation:turn",
            },
            "citations": [citation],
        },
        "evidence": {
            "evidence_ref": f"locomo:{conversation}:{turn.dia_id}",
            "evidence_digest": _sha(turn.text),
            "citation_ids": ["citation:turn"],
        },
    }


def dia_id_of(record: dict[str, Any]) -> str | None:
    """The turn a returned record cites (its ``dia_id`` locator), if any."""
    for citation in record.get("citations", []):
        locator = citation.get("locator", {})
        if locator.get("scheme") == "dia_id":
            return str(locator["value"])
    return None

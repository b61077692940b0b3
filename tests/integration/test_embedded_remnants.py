"""After forget (or withdraw) answers, no file in the data directory holds the text.

A byte scan of every file under the data directory (``engram.db`` and its ``-wal``/``-shm``,
the key files, the audit log, ``host.json``) for distinctive words of the forgotten text, right
after the call answers and again after a clean stop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engram_memory.embedded.composition import EmbeddedHost, open_embedded
from engram_memory.engine import lexical
from engram_memory.policy.builtin import BuiltinAdmissionPolicy

from engram_testing import FakeClock, capture_args, context, scanned_bytes

# Each word is its own Snowball stem, so the lexical index would hold the same bytes.
DISTINCTIVE = ("quokka", "zanzibar", "marmalad", "periwinkl")
SECRET_TEXT = "The quokka from Zanzibar hid marmalad under the periwinkl shed."
FILLER = (
    "Deploys need the staging flag before the release train leaves.",
    "The embedded store runs SQLite in WAL mode beside one writer.",
    "Search ranks records by BM25 over five weighted fields.",
    "Tokens are minted per agent with a purpose and a workspace.",
    "Backups copy the database file only, never the key files.",
)


def files_holding(data_dir: Path, words: tuple[str, ...]) -> dict[str, list[str]]:
    """Which files under ``data_dir`` contain which of ``words`` (case-insensitive bytes)."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
        content = scanned_bytes(path).lower()
        hits = [word for word in words if word.encode() in content]
        if hits:
            found[str(path.relative_to(data_dir))] = hits
    return found


class Host:
    def __init__(self, data_dir: Path) -> None:
        self.clock = FakeClock()
        # The filler is stored twice, reworded slightly: no quality gate (not what is tested).
        self.embedded: EmbeddedHost = open_embedded(
            data_dir,
            ask_human=lambda _request: True,
            clock=self.clock,
            policy=BuiltinAdmissionPolicy(near_duplicates="off"),
        )
        self.keys = 0

    def ok(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        envelope = self.embedded.call(tool, arguments, context())
        assert envelope["ok"], envelope
        value: dict[str, Any] = envelope["output"]["value"]
        return value

    def key(self, prefix: str) -> str:
        self.keys += 1
        return f"{prefix}-{self.keys:012d}"

    def capture(self, text: str) -> str:
        captured = self.ok("capture", capture_args(text, key=self.key("capture")))
        return str(captured["candidate_id"])

    def remember(self, text: str) -> str:
        admitted = self.ok(
            "request_admission",
            {"candidate_id": self.capture(text), "idempotency_key": self.key("admit")},
        )
        assert admitted["outcome"]["status"] == "accepted", admitted
        return str(admitted["outcome"]["record_id"])


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path / "data")


def test_the_distinctive_words_are_their_own_stems() -> None:
    assert [lexical.analyze(word) for word in DISTINCTIVE] == [[word] for word in DISTINCTIVE]


def test_a_forgotten_record_leaves_no_trace_of_its_text_in_any_file(
    host: Host, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    for text in FILLER:
        host.remember(text)
    record_id = host.remember(SECRET_TEXT)
    for text in FILLER:
        host.remember(text.replace("the", "a"))
    assert files_holding(data_dir, DISTINCTIVE)  # the scan does see a remembered record

    forgotten = host.ok(
        "forget",
        {"record_id": record_id, "idempotency_key": host.key("forget"), "reason_ref": "reason:x"},
    )
    assert forgotten["projection_invalidation"] == "complete"
    assert files_holding(data_dir, DISTINCTIVE) == {}

    host.embedded.close()
    assert files_holding(data_dir, DISTINCTIVE) == {}


def test_captured_and_withdrawn_text_is_never_written_in_plaintext(
    host: Host, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    host.remember(FILLER[0])
    candidate_id = host.capture(SECRET_TEXT)
    assert files_holding(data_dir, DISTINCTIVE) == {}  # pending text is sealed

    withdrawn = host.ok(
        "withdraw",
        {
            "candidate_id": candidate_id,
            "idempotency_key": host.key("withdraw"),
            "reason_ref": "reason:x",
        },
    )
    assert withdrawn["key_destruction"] == "complete"
    assert files_holding(data_dir, DISTINCTIVE) == {}

    host.embedded.close()
    assert files_holding(data_dir, DISTINCTIVE) == {}


def test_a_candidate_that_leaves_pending_keeps_no_ciphertext(host: Host) -> None:
    store = host.embedded.store
    scope = context().scope
    pending = host.capture(FILLER[1])
    assert store.candidate_get(scope, pending) is not None
    assert len(store.candidate_get(scope, pending).sealed) > 0  # type: ignore[union-attr]

    record_id = host.remember(FILLER[2])
    admitted = store.record_get(scope, record_id)
    assert admitted is not None
    withdrawn = host.capture(FILLER[3])
    host.ok(
        "withdraw",
        {"candidate_id": withdrawn, "idempotency_key": host.key("withdraw"), "reason_ref": "r:x"},
    )
    for candidate_id in (admitted.candidate_id, withdrawn):
        row = store.candidate_get(scope, candidate_id)
        assert row is not None and row.state in {"admitted", "withdrawn"}
        assert row.sealed == b""  # its key is destroyed: the ciphertext was dead weight
    assert len(store.candidate_get(scope, pending).sealed) > 0  # type: ignore[union-attr]
